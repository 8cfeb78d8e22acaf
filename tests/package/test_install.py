"""kvaudit installed as a package (issue 18): the serving-side install without extras, the
README's commands from a non-editable wheel outside the checkout, lazy imports, and files
other tools open.

The wheel is built once per session. The plain install fetches its few dependencies
(OpenTelemetry, msgspec) from the package index as a user's would. The `[all]` install
reuses this environment's packages for its dependencies (a fresh download of chdb,
pyarrow and numba would take minutes) through a `.pth` line, with kvaudit itself the
wheel, installed non-editable, ahead of them on the path.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..support import ROOT

pytestmark = pytest.mark.slow  # builds the wheel and installs it in new environments

# What only the analysis side needs: none of it may load to parse a command line, and
# none of it may come with the plain install.
ANALYSIS = ("numba", "llvmlite", "duckdb", "pyarrow", "chdb", "plotly", "textual", "numpy", "pandas", "sqlglot")
SERVING_SIDE_DISTRIBUTIONS = {"kvaudit", "msgspec"}  # besides OpenTelemetry's and what it needs


def _run(argv: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: float = 600) -> str:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{shlex.join(argv)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _python(environment: Path) -> str:
    return str(environment / "bin" / "python")


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    source = out / "source"  # a copy: building leaves build/ and *.egg-info behind
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".venv*", ".git", "build", "*.egg-info", "__pycache__"))
    _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), "."],
        cwd=source,
    )
    [built] = out.glob("kvaudit-*.whl")
    return built


@pytest.fixture(scope="session")
def serving_install(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh environment with `pip install kvaudit` (the wheel), no extras."""
    environment = tmp_path_factory.mktemp("serving") / "env"
    venv.create(environment, with_pip=True)
    _run([_python(environment), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)], cwd=ROOT)
    return environment


@pytest.fixture(scope="session")
def analysis_install(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh environment with `pip install 'kvaudit[analysis]'` (the wheel), its dependencies from the index."""
    environment = tmp_path_factory.mktemp("analysis") / "env"
    venv.create(environment, with_pip=True)
    _run(
        [_python(environment), "-m", "pip", "install", "-q", "--disable-pip-version-check", f"{wheel}[analysis]"],
        cwd=ROOT,
    )
    return environment


@pytest.fixture(scope="session")
def full_install(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel installed non-editable, its `[all]` dependencies this environment's."""
    environment = tmp_path_factory.mktemp("full") / "env"
    venv.create(environment, with_pip=True)
    _run([_python(environment), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], cwd=ROOT)
    site = _run([_python(environment), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=ROOT)
    # A path line, not a site directory: this environment's own .pth files (the editable
    # install of the checkout among them) are not run there.
    Path(site.strip(), "kvaudit-test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return environment


def test_the_plain_install_is_the_serving_side_and_what_it_writes_the_full_install_reads(
    serving_install: Path, tmp_path: Path
):
    listed = _run([_python(serving_install), "-m", "pip", "list", "--format", "freeze"], cwd=tmp_path)
    installed = {line.split("==")[0].lower().replace("_", "-") for line in listed.splitlines()}
    assert not installed & {name.replace("_", "-") for name in ANALYSIS}, installed
    assert installed >= SERVING_SIDE_DISTRIBUTIONS
    assert {name for name in installed if not name.startswith(("opentelemetry", "pip", "setuptools"))} - {
        "kvaudit",
        "msgspec",
        "protobuf",
        "requests",  # the OTLP/HTTP exporter's
        "urllib3",
        "idna",
        "certifi",
        "charset-normalizer",
        "typing-extensions",
        "importlib-metadata",
        "zipp",
        "deprecated",
        "wrapt",
        "googleapis-common-protos",
    } == set()
    _run([_python(serving_install), "-m", "pip", "check"], cwd=tmp_path)
    trace = tmp_path / "r1.jsonl"
    emit = (
        "from kvaudit.contract import Hook, KVConfig, Op, Outcome, PageDescriptor\n"
        "from kvaudit.emit.setup import setup_emitter\n"
        "kv = KVConfig(model='m', dtype='bfloat16', layout='NHD', block_size=16, layers=2, kv_heads=2, head_size=8)\n"
        f"emitter = setup_emitter('r1', 'file:{trace}', engine='vllm', kv=kv)\n"
        "with emitter.operation(Op.STORE, hook=Hook.VLLM_CONNECTOR, request_id='q1') as op:\n"
        "    op.add_page(PageDescriptor.from_config(kv, key='ab' * 32, token_start=0, token_end=16))\n"
        "    op.end(Outcome.HIT)\n"
        "emitter.shutdown()\n"
    )
    _run([_python(serving_install), "-c", emit], cwd=tmp_path)
    kvaudit = str(serving_install / "bin" / "kvaudit")
    assert "sql" in _run([kvaudit, "--help"], cwd=tmp_path)
    refused = subprocess.run([kvaudit, "sql", str(trace), "SELECT 1"], capture_output=True, text=True, cwd=tmp_path)
    assert refused.returncode == 2
    [line] = refused.stderr.strip().splitlines()
    assert re.fullmatch(r"kvaudit sql: needs \w+, which this install lacks: pip install 'kvaudit\[analysis\]'", line)
    counted = _run(
        [
            sys.executable,
            "-m",
            "kvaudit",
            "sql",
            str(trace),
            "SELECT op, count(*) AS n FROM pages GROUP BY ALL",
            "--format",
            "csv",
        ],
        cwd=tmp_path,
    )
    assert counted.splitlines() == ["op,n", "store,1"]


def test_doctor_finds_the_serving_image_it_exists_for_healthy(serving_install: Path, tmp_path: Path):
    """Without the analysis side's numba, nor packaging (vLLM's, or the analysis extra's), nothing is missing."""
    kvaudit = str(serving_install / "bin" / "kvaudit")
    probe = "import importlib.util as u; print(u.find_spec('numba'), u.find_spec('packaging'))"
    assert _run([_python(serving_install), "-c", probe], cwd=tmp_path).split() == ["None", "None"]
    done = subprocess.run([kvaudit, "doctor"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert (done.returncode, done.stderr) == (0, ""), done.stdout
    lines = done.stdout.splitlines()
    assert "vLLM: not installed" in lines and "problems: none" in lines
    assert "page scanner: not installed (numba: pip install 'kvaudit[analysis]' to read traces here)" in lines
    report = json.loads(_run([kvaudit, "doctor", "--format", "json"], cwd=tmp_path))
    assert report["problems"] == [] and report["vllm"]["hook_loads"] is False


def test_the_analysis_extra_alone_audits_reports_and_alerts(analysis_install: Path, tmp_path: Path):
    """What the README gives `analysis`: no sqlglot (ClickHouse's) nor plotly (the HTML report's) needed."""
    listed = _run([_python(analysis_install), "-m", "pip", "list", "--format", "freeze"], cwd=tmp_path)
    installed = {line.split("==")[0].lower() for line in listed.splitlines()}
    assert not installed & {"sqlglot", "plotly", "chdb", "textual"}, installed
    kvaudit = str(analysis_install / "bin" / "kvaudit")
    _run(
        [kvaudit, "simulate", "--out", "sim", "--duration", "30", "--quiet", "--fault", "rolling-upgrade:10"],
        cwd=tmp_path,
    )
    traces = str(tmp_path / "sim" / "traces")
    (tmp_path / "rules.yaml").write_text(_run([kvaudit, "alerts", "default-rules"], cwd=tmp_path))
    for command, expected in (
        (["sql", traces, "SELECT count(*) AS n FROM pages", "--format", "csv"], 0),
        (["audit", traces], 1),  # the upgrade's findings
        (["report", traces], 1),
        (["alerts", "eval", traces], 0),
        (["alerts", "check", "rules.yaml"], 0),
    ):
        done = subprocess.run([kvaudit, *command], capture_output=True, text=True, cwd=tmp_path, timeout=600)
        assert done.returncode in (0, expected), f"kvaudit {shlex.join(command)}: {done.returncode}\n{done.stderr}"
        assert "needs" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    refused = subprocess.run(
        [kvaudit, "report", traces, "--html", "r.html"], capture_output=True, text=True, cwd=tmp_path
    )
    assert (refused.returncode, refused.stdout) == (2, "")  # before the report is printed
    assert refused.stderr == "kvaudit report: needs plotly, which this install lacks: pip install 'kvaudit[report]'\n"


# Commands that serve until stopped, or reach a server the README's reader has.
_SERVING_OR_REMOTE = ("kvaudit collect", "alerts watch", "kvaudit exporter", "clickhouse://", "HOST")


def _readme_commands() -> Iterator[str]:
    """The `kvaudit` lines of the README's code blocks that end by themselves and need no server."""
    text = (ROOT / "README.md").read_text()
    for language, block in re.findall(r"```([a-z]*)\n(.*?)```", text, re.S):
        if language not in ("", "sh", "bash"):
            continue  # console transcripts, Python, SQL
        for line in block.replace("\\\n", " ").splitlines():
            command = line.split("  #")[0].strip()
            if not command.startswith("kvaudit ") or any(part in command for part in _SERVING_OR_REMOTE):
                continue
            if command.startswith("kvaudit tui") and "--snapshot" not in command:
                continue  # the live view: tests/tui/test_tmux.py runs it in a terminal
            yield command


# Runs each command in one process of the installed environment (a process per command
# would load the query engines twenty times over): its exit status and stderr per command.
_DRIVER = """
import contextlib, io, json, shlex, sys
from kvaudit.cli import main
results = []
for command in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            status = main(shlex.split(command)[1:])
        except SystemExit as exc:
            status = exc.code
    results.append((command, status, err.getvalue()))
print(json.dumps(results))
"""


def test_the_readmes_commands_work_from_a_wheel_outside_the_checkout(full_install: Path, tmp_path: Path):
    kvaudit = str(full_install / "bin" / "kvaudit")
    located = _run([_python(full_install), "-c", "import kvaudit; print(kvaudit.__file__)"], cwd=tmp_path)
    assert not located.startswith(str(ROOT)), located  # the wheel, not the checkout
    _run([kvaudit, "simulate", "--out", "sim", "--duration", "30", "--quiet"], cwd=tmp_path)
    shutil.copytree(tmp_path / "sim" / "traces", tmp_path / "traces")
    rules = _run([kvaudit, "alerts", "default-rules"], cwd=tmp_path)
    for name in ("my-rules.yaml", "rules.yaml"):
        (tmp_path / name).write_text(rules)
    commands = list(_readme_commands())
    assert len(commands) >= 15, commands
    results = json.loads(_run([_python(full_install), "-c", _DRIVER, json.dumps(commands)], cwd=tmp_path))
    for command, status, stderr in results:
        # 1: findings or firing alerts, which these simulated traces have; never 2 or 3.
        assert status in (0, 1), f"{command} exited {status}: {stderr}"
        assert "Traceback" not in stderr, command


def test_parsing_a_command_line_loads_no_query_engine():
    """`kvaudit --help` and every command's parser: the analysis side loads when a command runs."""
    probe = (
        "import sys\n"
        "from kvaudit.cli import build_parser\n"
        "build_parser()\n"
        f"print(' '.join(sorted(m for m in {ANALYSIS!r} if m in sys.modules)))\n"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert loaded.split() == []


def test_a_command_missing_its_library_names_the_extra(tmp_path: Path):
    """As on a plain install: the module is made unimportable in the process (`sys.modules[name] = None`)."""
    probe = (
        "import sys\n"
        "sys.modules['textual'] = None\n"
        "from kvaudit.cli import main\n"
        f"sys.exit(main(['tui', {str(tmp_path)!r}, '--snapshot', '--window', 'all']))\n"
    )
    (tmp_path / "r1.jsonl").write_text("")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    if done.returncode == 0:
        pytest.skip("tui --snapshot needs no Textual")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "kvaudit tui: needs textual, which this install lacks: pip install 'kvaudit[tui]'"
    )


def test_an_ingested_database_opens_in_duckdb_1_4(tmp_path: Path):
    """DuckDB 1.4 (its long-term release) opens what `kvaudit ingest` writes; its newest format it would refuse."""
    from kvaudit.cli import main

    older = ROOT / ".venv" / "side" / "duckdb-1.4"
    if not (older / "bin" / "python").exists():
        pytest.skip("scripts/install-duckdb-1.4.sh has not made .venv/side/duckdb-1.4")
    assert main(["simulate", "--out", str(tmp_path / "sim"), "--duration", "20", "--quiet"]) == 0
    database = tmp_path / "traces.duckdb"
    assert main(["ingest", str(tmp_path / "sim" / "traces"), "-o", str(database), "--quiet"]) == 0
    count = _run(
        [
            _python(older),
            "-c",
            f"import duckdb; con = duckdb.connect({str(database)!r}, read_only=True);"
            " print(con.sql('SELECT count(*) FROM kv_pages').fetchone()[0])",
        ],
        cwd=tmp_path,
    )
    assert int(count) > 0
