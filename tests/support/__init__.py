"""What the tests share: servers, fleets, traces, the tiny model, engine processes, terminals.

Test modules import from here and never from one another. The hostile corpus the reader is
held to is `tests/support/hostile.py`; the processes the real-engine tests start (one vLLM or
LMCache replica each) are the scripts `lmcache_replica.py` and `vllm/`.
"""

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
ROOT = SUPPORT.parent.parent  # the repository
