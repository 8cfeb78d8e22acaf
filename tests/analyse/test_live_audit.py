"""The audit kept up to date as traces arrive gives the whole audit's findings after every read.

Trace lines of a simulated fleet with every fault (pages served through a process-local
address, a rolling upgrade, stores that reach the pool after their fetches) and of
hand-built fleets (the two layers of the reference deployment, a key fetched long before
its first store) arrive line by line in an order the test draws, each file's own lines
in order, as replicas' files grow side by side: a fetch is often read before the store
that produced it, a store of the layer above before the chunk below it names. After
each read the kept findings must equal those of an audit of the whole store.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvaudit.analyse.audit import Finding, run_audit
from kvaudit.analyse.live_audit import LiveAudit
from kvaudit.backends.duckdb_backend import DuckDBBackend
from kvaudit.read.store import TraceStore
from kvaudit.simulator.engine import SimConfig, simulate
from kvaudit.simulator.faults import Faults

from ..support.fleet import Fleet, page
from ..support.layers import Layers, block_pages, chunk_page

SIMULATED = SimConfig(duration_s=60, rate=0.4, seed=3, faults=Faults(raw_ptr=0.1, upgrade_at_s=30, store_delay_s=2.0))


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return simulate(SIMULATED, tmp_path_factory.mktemp("sim")).files


@pytest.fixture
def hand_built(trace_dir: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Two replicas of two layers each (docs/design.md section 6.4), each operation a line of its own."""
    fleet = Fleet(trace_dir, monkeypatch)
    r1, r2 = Layers(fleet, "r1"), Layers(fleet, "r2")
    steps: list[Callable[[], object]] = [
        lambda: fleet.at(0).fetch(r2.vllm, [page("early", 0, used=True)]),  # an orphan until its store arrives
        lambda: fleet.at(10).store(r2.vllm, [page("early", 0, layout="NB_2_BS_NH_HS")]),
        lambda: r1.store(chunk_page("c1")),  # at 10 too: r1's store of `early` at 5 arrives later
        lambda: fleet.at(5).store(r1.vllm, [page("early", 0)]),
        lambda: fleet.at(20) and r2.fetch(chunk_page("c1", used=True), block_pages("c1", used=True)),
        lambda: fleet.at(30).fetch(r2.vllm, [page("early", 0, used=True), page("never", 1, used=True)]),
        lambda: r1.fetch(chunk_page("c1", used=True, dtype=None), block_pages("c1", used=True)),
    ]
    for step in steps:
        step()
        for emitter in fleet.emitters:
            emitter.flush()
    fleet.open().close()
    return sorted(trace_dir.glob("*.jsonl"))


def _arrivals(files: list[Path], seed: int | None) -> Iterator[tuple[str, str]]:
    """Each line of the files as (file name, line), each file's in order: the files interleaved at
    random, or (seed None) one after another in the order given."""
    rng = random.Random(seed)
    lines = {f.name: f.read_text().splitlines(keepends=True) for f in files}
    if seed is not None and seed % 2:
        lines[files[0].name].insert(len(lines[files[0].name]) // 2, "not json\n")  # KVA007 midway
    while lines:
        name = next(iter(lines)) if seed is None else rng.choice(sorted(lines))
        yield name, lines[name].pop(0)
        if not lines[name]:
            del lines[name]


def _key(finding: Finding) -> str:
    return repr(dataclasses.astuple(finding))


def _replayed(files: list[Path], live: Path, seed: int, *, lines_a_read: int) -> Iterator[DuckDBBackend]:
    """A live store over `live`, after each read of the next `lines_a_read` lines to arrive."""
    live.mkdir()
    backend = DuckDBBackend(TraceStore([live], ":memory:", workers=1))
    arrivals = list(_arrivals(files, seed))
    for start in range(0, len(arrivals), lines_a_read):
        for name, line in arrivals[start : start + lines_a_read]:
            with (live / name).open("a") as out:
                out.write(line)
        backend.refresh(final=False)
        yield backend
    backend.close()


@pytest.mark.parametrize("seed", [1, 2])
def test_kept_findings_equal_the_whole_audit_after_every_read(simulated, tmp_path, seed):
    audit, codes = LiveAudit(), set()
    lines = sum(len(f.read_text().splitlines()) for f in simulated)
    for backend in _replayed(simulated, tmp_path / "live", seed, lines_a_read=max(lines // 12, 1)):
        audit.update(backend)
        kept = [finding for finding, _ in audit.findings(backend)]
        assert sorted(map(_key, kept)) == sorted(map(_key, run_audit(backend)))
        codes |= {f.code for f in kept}
    assert {"KVA001", "KVA002", "KVA005", "KVA006", "KVA008"} <= codes  # the faults showed


@pytest.mark.parametrize("seed", [None, 1, 2, 3])
def test_late_stores_and_layers_below_change_what_was_found(hand_built, tmp_path, seed):
    audit, seen, kept = LiveAudit(), set(), []
    # Seed None: r2's files first, so its fetches are all read before r1's stores.
    files = sorted(hand_built, key=lambda f: not f.name.startswith("r2"))
    for backend in _replayed(files, tmp_path / "live", seed, lines_a_read=1):
        audit.update(backend)
        kept = [finding for finding, _ in audit.findings(backend)]
        assert sorted(map(_key, kept)) == sorted(map(_key, run_audit(backend)))
        seen |= {(f.code, f.key) for f in kept}
    if seed is None:
        # Found while the store that produced their key had not arrived, withdrawn once it did:
        # orphans of both layers, and a layout compared with a store that turned out not to be the first.
        withdrawn = seen - {(f.code, f.key) for f in kept}
        assert withdrawn == {("KVA006", "early"), ("KVA006", "c1"), ("KVA004", "early")} | {
            ("KVA006", f"b{i}") for i in range(8)
        }


def test_nothing_arrived_nothing_audited(hand_built):
    backend = DuckDBBackend(TraceStore(hand_built, ":memory:", workers=1))
    backend.refresh()
    audit = LiveAudit()
    assert audit.update(backend)
    assert not audit.update(backend)
    [(rows,)] = backend.query("SELECT count(*) FROM findings")[1]
    assert rows == len(run_audit(backend))


def test_rows_held_as_arrow_are_audited_whole(hand_built):
    backend = DuckDBBackend(TraceStore(hand_built, workers=1))
    backend.refresh()
    audit = LiveAudit()
    assert backend.row_ends() is None
    assert audit.update(backend) and audit.update(backend)  # it cannot tell what arrived
    kept = [finding for finding, _ in audit.findings(backend)]
    assert sorted(map(_key, kept)) == sorted(map(_key, run_audit(backend)))
    [(times,)] = backend.query("SELECT count(time) FROM findings WHERE span_id IS NOT NULL")[1]
    assert times == sum(f.span_id is not None for f in kept)
