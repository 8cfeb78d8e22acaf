"""`kvaudit collect --kv-events`: a real process subscribing to a real ZMQ publisher."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import zmq

from kvaudit.commands.arguments import UsageError
from kvaudit.commands.collect import kv_event_sources
from kvaudit.kv_events.subscriber import Source
from kvaudit.kv_events.wire import encode_seq
from kvaudit.read.store import TraceStore

from ..support.kv_event_messages import HASHES, payload, stored
from ..support.waiting import wait_until


def test_sources_from_the_command_line():
    assert kv_event_sources("tcp://a:1,tcp://b:1", "r1", "tcp://a:2,-", "kv") == [
        Source("tcp://a:1", "r1", "tcp://a:2", "kv"),
        Source("tcp://b:1", "r1", None, "kv"),
    ]
    assert kv_event_sources("tcp://a:1,tcp://b:1", "r1,r2", None, "") == [
        Source("tcp://a:1", "r1"),
        Source("tcp://b:1", "r2"),
    ]
    with pytest.raises(UsageError, match="--replica"):
        kv_event_sources("tcp://a:1", None, None, "")
    with pytest.raises(UsageError, match="one entry per"):
        kv_event_sources("tcp://a:1", "r1,r2,r3", None, "")


def test_collect_writes_kv_events_and_their_loss(tmp_path: Path):
    context = zmq.Context()
    pub = context.socket(zmq.XPUB)  # a PUB that also hears the subscription arrive
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    out = tmp_path / "traces"
    command = [sys.executable, "-m", "kvaudit", "collect", "127.0.0.1:0", "--out", str(out)]
    command += ["--kv-events", f"tcp://127.0.0.1:{port}", "--replica", "r1", "--kv-hash-algo", "sha256"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # ZMQ's slow joiner: what is sent before the subscription arrives is lost, so wait for it.
        assert pub.poll(30_000) and pub.recv()[:1] == b"\x01", process.stderr.read() if process.stderr else ""
        pub.send_multipart((b"", encode_seq(0), payload(stored(HASHES[:2], None))))
        # Batch 1 never arrives.
        pub.send_multipart((b"", encode_seq(2), payload(stored(HASHES[2:3], HASHES[1]))))
        _until_written(out, pages=3)
    finally:
        process.send_signal(signal.SIGTERM)  # as a supervisor stops it: spans still written
        stdout, stderr = process.communicate(timeout=30)
        pub.close()
        context.term()
    assert process.returncode == 143, stderr  # stopped by SIGTERM, as shells report it
    assert "2 batches (0 replayed), 1 gaps, 1 batches lost" in stdout
    store = TraceStore([out])
    store.refresh()
    _, pages = store.query("SELECT replica, op, tier, hash_algo, count(*) FROM pages GROUP BY ALL")
    assert pages == [("r1", "store", "gpu", "sha256", 3)]
    _, lost = store.query("SELECT max(telemetry_lost_batches) FROM spans")
    assert lost == [(1,)]
    _, resources = store.query("SELECT DISTINCT replica, engine, hash_algo FROM replicas")
    assert resources == [("r1", "vllm", "sha256")]


def _until_written(out: Path, *, pages: int) -> None:
    """Until the receiver has written `pages` page descriptors (it exports in batches, a second apart)."""

    def written() -> bool:
        if not out.is_dir():
            return False
        store = TraceStore([out])
        store.refresh(final=False)
        return store.query("SELECT count(*) FROM pages")[1] == [(pages,)]

    wait_until(written, what=f"the receiver wrote {pages} pages", interval=0.1)
