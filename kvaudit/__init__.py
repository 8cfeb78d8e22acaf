"""kvaudit: observability and cache audit for shared KV caching across LLM serving replicas.

The package follows the data's path (docs/architecture.md): `emit` (serving side) →
`receive` → `read` → `analyse` → `present`, with `contract` (the trace contract) and
`otlp` (the wire format) shared by all; `backends`, `alerts`, `kv_events`, `simulator`
and `commands` beside them; `kvaudit.hooks` and `kvaudit.tui` from their own folders.
"""

__version__ = "0.1.0"
