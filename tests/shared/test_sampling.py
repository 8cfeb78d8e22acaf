"""Which requests the hooks record (`kvaudit.sampling`, docs/design.md section 3.10).

The hooks' own behaviour under a sample rate runs against the real engines:
tests/hooks/lmcache/test_instrumentor.py (LMCache alone), tests/hooks/vllm/test_connector.py (vLLM around the
fault connector, with the guard), tests/hooks/test_reference_deployment.py (vLLM around LMCache's
connector, with the guard).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvaudit.contract import Res, TelemetryAttr
from kvaudit.emit.setup import replica_resource, setup_emitter
from kvaudit.sampling import request_sampler, sample_rate

IDS = [f"cmpl-{n:05d}-0-{n * 2654435761 % 2**32:08x}" for n in range(4000)]


def test_rate_one_records_every_request_without_a_call() -> None:
    assert request_sampler(1.0) is None


def test_rate_zero_records_no_request_with_an_id() -> None:
    sampler = request_sampler(0.0)
    assert sampler is not None
    assert not any(map(sampler, IDS))
    assert sampler(None)  # an unknown request cannot be chosen alike everywhere: it is recorded


@pytest.mark.parametrize("rate", [0.0625, 0.25, 0.5])
def test_a_rate_records_about_that_share(rate: float) -> None:
    sampler = request_sampler(rate)
    assert sampler is not None
    share = sum(map(sampler, IDS)) / len(IDS)
    assert abs(share - rate) < 0.03


def test_a_lower_rate_records_a_subset_of_a_higher_ones() -> None:
    # The choice is a threshold on one hash: lowering the rate only drops requests.
    low, high = request_sampler(0.1), request_sampler(0.3)
    assert low is not None and high is not None
    assert {i for i in IDS if low(i)} <= {i for i in IDS if high(i)}


def test_every_process_chooses_alike() -> None:
    """The scheduler, the workers and LMCache's hook decide in processes of their own, with
    other hash seeds: they must choose the same requests from the same ids."""
    sampler = request_sampler(0.25)
    assert sampler is not None
    here = [request_id for request_id in IDS if sampler(request_id)]
    code = (
        "import json, sys; from kvaudit.sampling import request_sampler; s = request_sampler(0.25); "
        "print(json.dumps([i for i in json.load(sys.stdin) if s(i)]))"
    )
    for seed in ("1", "12345"):
        env = os.environ | {"PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code], input=json.dumps(IDS), capture_output=True, text=True, env=env, check=True
        )
        assert json.loads(out.stdout) == here


@pytest.mark.parametrize("value", ["often", None, -0.1, 1.5, float("nan"), [0.5]])
def test_a_bad_rate_is_refused_naming_where(value: object) -> None:
    where = r'^kvaudit extra_config\["kvaudit.sample_rate"\] must be a number from 0 to 1'
    with pytest.raises(ValueError, match=where):
        sample_rate(value, 'extra_config["kvaudit.sample_rate"]')


def test_a_rate_is_read_from_text_as_lmcache_configuration_gives_it() -> None:
    assert sample_rate("0.25", "x") == 0.25
    assert sample_rate(1, "x") == 1.0


def test_the_resource_declares_a_rate_below_one_only() -> None:
    assert Res.SAMPLE_RATE not in replica_resource("r1").attributes
    assert Res.SAMPLE_RATE not in replica_resource("r1", sample_rate=1.0).attributes
    assert replica_resource("r1", sample_rate=0.125).attributes[Res.SAMPLE_RATE] == 0.125


@pytest.mark.parametrize(("rate", "spans"), [(1.0, []), (0.25, [TelemetryAttr.SPAN_NAME])])
def test_a_sampled_process_declares_itself_though_it_records_nothing(
    tmp_path: Path, rate: float, spans: list[str]
) -> None:
    """A replica at a low rate may record no request: its telemetry span still brings its
    resource, and the rate, into the trace; a replica recording every request stays silent."""
    emitter = setup_emitter("r1", f"file:{tmp_path}/r1.jsonl", sample_rate=rate)
    emitter.flush()
    emitter.flush()  # once: nothing changed since
    emitter.shutdown()
    path = tmp_path / "r1.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    scopes = [scope for line in lines for resource in line["resourceSpans"] for scope in resource["scopeSpans"]]
    names = [span["name"] for scope in scopes for span in scope["spans"]]
    assert names == spans
    for line in lines:
        attributes = line["resourceSpans"][0]["resource"]["attributes"]
        assert {"key": Res.SAMPLE_RATE, "value": {"doubleValue": rate}} in attributes
