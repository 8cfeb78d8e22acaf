"""The vLLM hook on the real CUDA vLLM installed here: what the CPU tests check, printed.

    python scripts/gpu_vllm_check.py [--out DIR]

Run by scripts/gpu-vllm-versions.sh once per supported release, in an environment
holding that CUDA vLLM, kvaudit and (if it installs) LMCache. Written for a machine
with an NVIDIA GPU; see that script for what has been run.

Each replica is a fresh engine in its own process (tests/support/vllm/replica.py, the CPU
tests' replica), the tiny random-weight model of the CPU tests (tests/support/tiny_model.py),
greedy, one after another on the one GPU. Per inner connector, a producer and a
consumer sharing a store, wrapped in KVAuditConnector, and the same pair unwrapped:

- ExampleConnector: the wrapped pair's outputs and cache hits are the unwrapped
  pair's and its files the same bytes; the consumer's fetched pages are the producer's
  stored ones, each with every field a fetch must carry, used; the audit finds
  nothing (tests/hooks/vllm/test_connector.py on the CPU).
- LMCacheConnectorV1 (an LMCache server between the replicas): outputs and cache hits
  as unwrapped, a traced lookup and fetch on the consumer at the vLLM layer, and the
  LMCache layer the hook installs in the worker (docs/design.md section 6.4): its
  fetched chunks traced, every fetched vLLM block joined to the chunk that served it,
  and no finding in the audit of both layers (tests/hooks/test_reference_deployment.py on the CPU).
- LMCacheMPConnector (`--only mp`: one `lmcache server` with kvaudit's hook, started by
  its CLI as the CPU tests start it, tests/support/mp_server.py; on CUDA LMCache moves
  the KV cache by its own IPC path): outputs and cache hits as unwrapped, every fetched
  vLLM block complete and naming a server object the server fetched, the requests
  joined by vLLM's internal id, no finding in the audit of both layers
  (tests/hooks/lmcache/test_mp_server.py on the CPU).
- Since vLLM 0.33, sleep mode: an engine with `enable_sleep_mode` and the wrapper
  starts (vLLM asks the wrapped class whether it supports sleep mode), sleeps, wakes
  (unregister/restore_kv_caches forwarded) and generates what it did before.

Prints one line per check and a summary; exit status 1 if any check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
REPLICA = ROOT / "tests" / "support" / "vllm" / "replica.py"
sys.path.insert(0, str(ROOT))

from kvaudit.analyse.audit import run_audit  # noqa: E402
from kvaudit.contract import REQUIRED_ON_FETCH, Hook, SpanAttr  # noqa: E402
from kvaudit.read.open import open_store  # noqa: E402
from tests.support.mp_server import mp_server  # noqa: E402
from tests.support.servers import free_port  # noqa: E402
from tests.support.tiny_model import tiny_llama  # noqa: E402  (the CPU tests' model)

PROMPT = [(i * 7 + 3) % 1000 + 3 for i in range(400)]  # the CPU tests' prompt
BLOCK = 32
CACHED = (len(PROMPT) - 1) // BLOCK * BLOCK  # whole blocks, short of the last token
PAGES = CACHED // BLOCK
# Engines run one after another; each takes a share of the GPU, whatever its size.
ENGINE_ARGS = {"gpu_memory_utilization": 0.3}
REPLICA_TIMEOUT_S = 900
LMCACHE_CHUNK = 64
LMCACHE_ENV = {
    "LMCACHE_CHUNK_SIZE": str(LMCACHE_CHUNK),
    "LMCACHE_LOCAL_CPU": "False",
    "LMCACHE_REMOTE_SERDE": "naive",
    "LMCACHE_TRACK_USAGE": "false",
}


class Checks:
    def __init__(self, release: str) -> None:
        self.release = release
        self.failed = 0
        self.count = 0

    def check(self, case: str, what: str, expected: Any, got: Any) -> None:
        self.count += 1
        ok = expected == got
        self.failed += not ok
        verdict = "ok" if ok else "FAIL"
        print(f"{self.release}  {case:<20} {what:<40} expected {_short(expected):<16} got {_short(got):<16} {verdict}")

    def skip(self, case: str, why: str) -> None:
        print(f"{self.release}  {case:<20} skipped: {why}")


def _short(value: Any) -> str:
    """A value for one line: long lists (token ids, page keys) by their length and first items."""
    if isinstance(value, list) and len(value) > 4:
        return f"[{len(value)} items: {', '.join(map(_short, value[:2]))}, ...]"
    if isinstance(value, str) and len(value) > 16:
        return repr(value[:12] + "...")
    return repr(value)


def transfer(connector: str, extra: dict[str, Any], replica: str | None, out: Path) -> dict[str, Any]:
    """A KVTransferConfig: `connector` itself, or KVAuditConnector around it.

    The wrapped replicas share a stamp directory: model, TP world size and rank travel
    in no connector's objects, the producer's stamp carries them to the consumer.
    """
    if replica is None:
        return {"kv_connector": connector, "kv_role": "kv_both", "kv_connector_extra_config": extra}
    audit = {
        "wrap": connector,
        "replica": replica,
        "export": f"file:{out / 'traces' / replica}.jsonl",
        "stamp_dir": str(out / "stamps"),
    }
    return {
        "kv_connector": "KVAuditConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {**extra, "kvaudit": audit},
    }


def run_replica(
    name: str, out: Path, kv_transfer: dict[str, Any], env: dict[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    full = {
        "model": str(out / "model"),
        "prompts": [PROMPT],
        "kv_transfer": kv_transfer,
        "engine_args": {**ENGINE_ARGS, **spec.pop("engine_args", {})},
        **spec,
    }
    log = out / "logs" / f"{name}.log"
    with log.open("w") as stream:
        proc = subprocess.run(
            [sys.executable, str(REPLICA), json.dumps(full)],
            stdout=stream,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            timeout=REPLICA_TIMEOUT_S,
            check=False,
        )
    lines = [line for line in log.read_text().splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        return {"error": f"exit {proc.returncode}, see {log}"}
    return json.loads(lines[-1].removeprefix("RESULT "))[0]


def all_ran(checks: Checks, case: str, runs: dict[str, dict[str, Any]]) -> bool:
    for name, run in runs.items():
        checks.check(case, f"{name} ran", None, run.get("error"))
    return not any("error" in run for run in runs.values())


def pages(out: Path, replica: str, op: str, hook: Hook = Hook.VLLM_CONNECTOR) -> list[dict[str, Any]]:
    """The pages one layer of `replica` recorded (the vLLM hook's by default)."""
    store = open_store([str(out / "traces")])
    try:
        columns, rows = store.query(
            "SELECT * FROM pages WHERE replica = $replica AND op = $op AND hook = $hook ORDER BY token_start",
            {"replica": replica, "op": op, "hook": hook.value},
        )
    finally:
        store.close()
    return [dict(zip(columns, row)) for row in rows]


def tree(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


def example_connector(checks: Checks, out: Path) -> None:
    case = "ExampleConnector"
    runs = {}
    for name, store, replica in (
        ("plain1", "plain", None),
        ("plain2", "plain", None),
        ("r1", "example", "r1"),
        ("r2", "example", "r2"),
    ):
        extra = {"shared_storage_path": str(out / "kv" / store)}
        runs[name] = run_replica(name, out, transfer("ExampleConnector", extra, replica, out))
    if not all_ran(checks, case, runs):
        return
    checks.check(case, "r1 output = unwrapped output", runs["plain1"]["tokens"], runs["r1"]["tokens"])
    checks.check(case, "r2 output = unwrapped output", runs["plain2"]["tokens"], runs["r2"]["tokens"])
    checks.check(case, "r2 cached tokens (unwrapped: same)", runs["plain2"]["cached"], runs["r2"]["cached"])
    checks.check(case, "r2 cached tokens", CACHED, runs["r2"]["cached"])
    checks.check(
        case, "stored files = unwrapped files", True, tree(out / "kv" / "plain") == tree(out / "kv" / "example")
    )
    stored, fetched = pages(out, "r1", "store"), pages(out, "r2", "fetch")
    checks.check(case, "r1 stored pages", PAGES, len(stored))
    checks.check(case, "r2 fetched pages", PAGES, len(fetched))
    checks.check(case, "fetched keys = stored keys", [p["key"] for p in stored], [p["key"] for p in fetched])
    missing = sorted({name for row in fetched for name in REQUIRED_ON_FETCH if row.get(name) is None})
    checks.check(case, "fields missing from fetched pages", [], missing)
    checks.check(case, "fetched pages used", True, all(row["used"] is True for row in fetched))
    store = open_store([str(out / "traces")])
    try:
        findings = [(f.replica, f.code) for f in run_audit(store)]
    finally:
        store.close()
    checks.check(case, "audit findings", [], findings)


@contextmanager
def lmcache_server() -> Iterator[str]:
    """LMCache's own server (`python -m lmcache.v1.server`); yields its URL."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "lmcache.v1.server", "127.0.0.1", str(port), "cpu"])
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.5)
        yield f"lm://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=30)


def lmcache_connector(checks: Checks, out: Path) -> None:
    case = "LMCacheConnectorV1"
    try:
        import lmcache  # noqa: F401
    except Exception as exc:
        checks.skip(case, f"LMCache does not import here: {exc}")
        return
    runs = {}
    # Each pair its own server: the wrapped consumer's hits must be the wrapped producer's.
    for pair, wrapped in (("lm-plain", False), ("lm", True)):
        with lmcache_server() as url:
            env = {**LMCACHE_ENV, "LMCACHE_REMOTE_URL": url}
            for name in (f"{pair}1", f"{pair}2"):
                kv_transfer = transfer("LMCacheConnectorV1", {}, name if wrapped else None, out)
                runs[name] = run_replica(name, out, kv_transfer, env)
    if not all_ran(checks, case, runs):
        return
    plain1, plain2, lm2 = runs["lm-plain1"], runs["lm-plain2"], runs["lm2"]
    checks.check(case, "lm1 output = unwrapped output", plain1["tokens"], runs["lm1"]["tokens"])
    checks.check(case, "lm2 output = unwrapped output", plain2["tokens"], lm2["tokens"])
    checks.check(case, "lm2 cached tokens (unwrapped: same)", plain2["cached"], lm2["cached"])
    checks.check(case, "lm2 cached tokens > 0", True, lm2["cached"] > 0)
    store = open_store([str(out / "traces")])
    try:
        _, rows = store.query(
            "SELECT op, outcome, tokens_hit FROM spans WHERE replica = 'lm2' AND op IS NOT NULL AND hook = $hook",
            {"hook": Hook.VLLM_CONNECTOR.value},
        )
        findings = [(f.replica, f.code) for f in run_audit(store)]
    finally:
        store.close()
    ops = {op: (outcome, hit) for op, outcome, hit in rows}
    checks.check(case, "lm2 lookup tokens hit", lm2["cached"], ops.get("lookup", (None, None))[1])
    checks.check(case, "lm2 fetch tokens hit", lm2["cached"], ops.get("fetch", (None, None))[1])
    blocks = pages(out, "lm2", "fetch")
    checks.check(case, "lm2 fetched pages", lm2["cached"] // BLOCK, len(blocks))
    chunks = pages(out, "lm2", "fetch", Hook.LMCACHE_ENGINE)
    checks.check(case, "lm2 LMCache layer: chunks fetched", True, len(chunks) > 0)
    # Joined: the block names a chunk fetched in its own trace (LMCache's span is a child of vLLM's).
    served = {(chunk["trace_id"], chunk["key"]) for chunk in chunks}
    unjoined = [block["key"] for block in blocks if (block["trace_id"], block["source_key"]) not in served]
    checks.check(case, "lm2 blocks without their chunk", [], unjoined)
    checks.check(case, "audit findings (both layers)", [], findings)


def lmcache_mp_connector(checks: Checks, out: Path) -> None:
    case = "LMCacheMPConnector"
    try:
        import lmcache  # noqa: F401
    except Exception as exc:
        checks.skip(case, f"LMCache does not import here: {exc}")
        return
    runs = {}
    # Each pair its own server: the wrapped consumer's hits must be the wrapped producer's.
    for pair, wrapped in (("mp-plain", False), ("mp", True)):
        with mp_server(out / "traces" / pair, hook=wrapped) as server:
            for name in (f"{pair}1", f"{pair}2"):
                kv_transfer = transfer("LMCacheMPConnector", server.connector_config(), name if wrapped else None, out)
                runs[name] = run_replica(name, out, kv_transfer, {"LMCACHE_TRACK_USAGE": "false"})
    if not all_ran(checks, case, runs):
        return
    plain2, mp2 = runs["mp-plain2"], runs["mp2"]
    checks.check(case, "mp1 output = unwrapped output", runs["mp-plain1"]["tokens"], runs["mp1"]["tokens"])
    checks.check(case, "mp2 output = unwrapped output", plain2["tokens"], mp2["tokens"])
    checks.check(case, "mp2 cached tokens (unwrapped: same)", plain2["cached"], mp2["cached"])
    checks.check(case, "mp2 cached tokens > 0", True, mp2["cached"] > 0)
    blocks = pages(out, "mp2", "fetch")
    checks.check(case, "mp2 fetched pages", mp2["cached"] // BLOCK, len(blocks))
    incomplete = [block["key"] for block in blocks if any(block[name] is None for name in REQUIRED_ON_FETCH)]
    checks.check(case, "mp2 fetched pages lacking a field", [], incomplete)
    store = open_store([str(out / "traces"), str(out / "traces" / "mp")])
    try:
        _, served = store.query(
            "SELECT key FROM pages WHERE op = 'fetch' AND hook = $hook", {"hook": "lmcache.mp_server"}
        )
        _, joined = store.query(
            "SELECT count(*) FROM spans v JOIN spans s ON s.request_id = v.attributes[$id] AND s.hook = $server"
            " WHERE v.replica = 'mp2' AND v.op = 'fetch'",
            {"id": SpanAttr.ENGINE_REQUEST_ID, "server": Hook.LMCACHE_MP_SERVER.value},
        )
        findings = [(f.replica, f.code) for f in run_audit(store)]
    finally:
        store.close()
    objects = {key for (key,) in served}
    checks.check(
        case, "mp2 blocks without a server object", [], [b["key"] for b in blocks if b["source_key"] not in objects]
    )
    checks.check(case, "mp2 fetch joined to the server's lookup", True, joined[0][0] > 0)
    checks.check(case, "audit findings (both layers)", [], findings)


def sleep_mode(checks: Checks, out: Path) -> None:
    case = "sleep mode"
    if Version(checks.release) < Version("0.33"):
        checks.skip(case, "supports_sleep_mode and unregister/restore_kv_caches are new in vLLM 0.33")
        return
    plain = run_replica(
        "sleep-plain",
        out,
        transfer("ExampleConnector", {"shared_storage_path": str(out / "kv" / "sleep-plain")}, None, out),
    )
    slept = run_replica(
        "sleep-audit",
        out,
        transfer("ExampleConnector", {"shared_storage_path": str(out / "kv" / "sleep")}, "sleep", out),
        sleep=True,
        engine_args={"enable_sleep_mode": True},
    )
    checks.check(case, "engine with the wrapper ran, slept, woke", None, slept.get("error"))
    if "error" not in slept and "error" not in plain:
        checks.check(case, "output after waking = unwrapped output", plain["tokens"], slept["tokens"])


CASES = {"example": example_connector, "lmcache": lmcache_connector, "mp": lmcache_mp_connector, "sleep": sleep_mode}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, help="an empty directory for traces, stores and logs (default: a temporary one)"
    )
    parser.add_argument(
        "--only", default=",".join(CASES), help=f"the cases to run, comma-separated (default: all: {','.join(CASES)})"
    )
    args = parser.parse_args()
    import vllm

    out = args.out or Path(tempfile.mkdtemp(prefix="kvaudit-gpu-"))
    if out.exists() and any(out.iterdir()):
        parser.error(f"{out} is not empty: the checks count what the replicas leave there")
    for sub in ("model", "logs", "traces", "kv"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    (out / "model" / "config.json").write_text(json.dumps(tiny_llama("bfloat16")))
    release = vllm.__version__
    print(f"vLLM {release}, output in {out}")
    checks = Checks(release)
    for case in args.only.split(","):
        CASES[case](checks, out)
    print(f"{release}: {checks.count - checks.failed} of {checks.count} checks passed")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
