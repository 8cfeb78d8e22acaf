"""vLLM's KV cache events as a kvaudit source: the GPU tier of each replica.

vLLM publishes `BlockStored`, `BlockRemoved` and `AllBlocksCleared` over ZMQ (its
`--kv-events-config`, the stream llm-d and Dynamo routers consume). `kvaudit collect
--kv-events ...` subscribes (`subscriber`), decodes the batches without importing
vLLM (`wire`), detects sequence gaps (`sequence`), fills them from the publisher's
replay buffer (`replay`) and writes the events as `kvaudit.store` / `kvaudit.evict`
spans with `tier=gpu` pages keyed by block hash (`to_spans`).

May import: the contract and `kvaudit.emit`; pyzmq and msgspec (never vLLM).
"""
