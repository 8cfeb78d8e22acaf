"""kvaudit: observability and cache audit for shared KV caching across LLM serving replicas."""

__version__ = "0.1.0"
