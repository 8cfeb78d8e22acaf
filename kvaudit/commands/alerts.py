"""`kvaudit alerts`: check rule files, evaluate them once, or watch trace files grow.

kvaudit alerts check rules.yaml
kvaudit alerts eval traces/                      # the default rule pack
kvaudit alerts watch traces/ --rules rules.yaml --interval 15s --notify alertmanager:http://am:9093
kvaudit alerts watch traces/ --notify webhook:http://hooks/kv --group-by alertname,replica --external-url http://grafana/d/kv

Exit status (docs/operations.md): 0; 1 alerts at the `--fail-on` state (eval: firing, by
default), or problems in `check`; 2 bad input (a rule file that does not load); 4 a rule
failed or timed out, or (`watch --once`) notifications were not delivered.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

from kvaudit.alerts.bounds import DEFAULT_LIMIT, Bounds
from kvaudit.alerts.instances import AlertInstance, AlertState
from kvaudit.alerts.labels import NAME
from kvaudit.alerts.payloads import DEFAULT_GROUP_BY, GroupBy
from kvaudit.alerts.state_file import default_state_path
from kvaudit.commands import SUMMARIES
from kvaudit.commands.arguments import (
    UsageError,
    add_input_arguments,
    add_output_arguments,
    add_rule_timeout_option,
    command_parser,
    duration,
    open_backend,
    row_limit,
    rule_timeout,
    warn_backend_read_errors,
)
from kvaudit.commands.exit_status import ExitStatus
from kvaudit.safe_text import visible

if TYPE_CHECKING:
    from kvaudit.alerts.dispatch import Dispatcher
    from kvaudit.alerts.engine import RuleEngine
    from kvaudit.alerts.rules import Group
    from kvaudit.backends import Backend
    from kvaudit.read.columns import Tables

METRICS_PORT: Final = 9465
# Which alerts make `eval` and `watch --once` exit 1: none, firing ones, or pending and firing ones.
FAIL_ON: Final = {"never": (), "firing": (AlertState.FIRING,), "pending": (AlertState.FIRING, AlertState.PENDING)}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(
        subparsers,
        "alerts",
        SUMMARIES["alerts"],
        "kvaudit alerts watch traces/ --interval 15s --notify webhook:http://127.0.0.1:5001/hook",
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

    check = command_parser(
        actions,
        "check",
        "Validate rule files without running anything but queries over no traces: exit 1 if any problem.",
        "kvaudit alerts default-rules > rules.yaml && kvaudit alerts check rules.yaml",
    )
    check.add_argument("rules", nargs="+", metavar="RULES", help="rule files")
    add_rule_timeout_option(check)
    check.set_defaults(run=run_check)

    evaluate = command_parser(
        actions,
        "eval",
        "Evaluate the rules once and print pending and firing alerts; exit 1 if any fires.",
        "kvaudit alerts eval traces/ --rules rules.yaml --format json",
    )
    _add_common(evaluate, fail_on="firing")
    add_output_arguments(evaluate)
    evaluate.set_defaults(run=run_eval)

    watch = command_parser(
        actions,
        "watch",
        "Evaluate as trace files grow; keep alert state on disk; notify.",
        "kvaudit alerts watch traces/ --interval 15s --notify alertmanager:http://127.0.0.1:9093",
    )
    _add_common(watch, fail_on="never")
    watch.add_argument("--interval", type=duration, default=15.0, help="evaluation interval (default 15s)")
    watch.add_argument(
        "--state", help=f"alert state file (default {default_state_path()}, under $XDG_STATE_HOME or ~/.local/state)"
    )
    watch.add_argument(
        "--notify",
        action="append",
        metavar="SPEC",
        help="stdout, file:PATH, webhook:URL or alertmanager:URL; repeatable (default: stdout)",
    )
    watch.add_argument(
        "--group-by",
        type=group_by,
        default=DEFAULT_GROUP_BY,
        metavar="LABELS",
        help="webhooks: one notification per group of these labels, comma-separated, as Alertmanager's"
        " group_by; `...` for every label (default alertname)",
    )
    watch.add_argument(
        "--external-url",
        type=external_url,
        metavar="URL",
        help="webhooks: the payload's externalURL, where a reader goes for more (a dashboard, the report);"
        " each alert's generatorURL is URL#AlertName",
    )
    watch.add_argument("--timeout", type=duration, default=5.0, help="per HTTP attempt (default 5s)")
    watch.add_argument("--retries", type=int, default=3, help="HTTP retries after the first attempt (default 3)")
    watch.add_argument(
        "--metrics",
        metavar="ADDR",
        help=f"serve rule health and notification counts on http://ADDR/metrics (default port {METRICS_PORT})",
    )
    watch.add_argument(
        "--once",
        action="store_true",
        help="evaluate and notify once, wait for the deliveries, then exit: 4 when some were not delivered",
    )
    watch.set_defaults(run=run_watch)

    default = command_parser(
        actions,
        "default-rules",
        "Print the default rule pack (to copy and tune).",
        "kvaudit alerts default-rules > rules.yaml",
    )
    default.set_defaults(run=run_default_rules)


def _add_common(parser: argparse.ArgumentParser, *, fail_on: str) -> None:
    add_input_arguments(parser)
    parser.add_argument(
        "--rules", action="append", metavar="RULES", help="rule file; repeatable (default: the default pack)"
    )
    add_rule_timeout_option(parser)
    parser.add_argument(
        "--rule-limit",
        type=int,
        default=DEFAULT_LIMIT,
        metavar="N",
        help=f"the most alerts one rule may produce, unless its group sets `limit` (default {DEFAULT_LIMIT})",
    )
    parser.add_argument(
        "--fail-on",
        choices=FAIL_ON,
        default=fail_on,
        help=f"exit 1 when any alert is in this state: firing, pending (or firing), never (default {fail_on})",
    )


def group_by(text: str) -> GroupBy:
    """`--group-by`: label names separated by commas, or `...` for every label."""
    if text.strip() == "...":
        return None
    names = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    bad = [name for name in names if not NAME.fullmatch(name)]
    if bad:
        raise argparse.ArgumentTypeError(f"not a label name: {', '.join(map(repr, bad))}")
    return names


def external_url(text: str) -> str:
    """`--external-url`: an absolute http(s) URL, as Alertmanager's own `--web.external-url`."""
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise argparse.ArgumentTypeError(f"{text!r} is not an absolute http:// or https:// URL")
    return text


def _groups(rules: Sequence[str] | None) -> list[Group]:
    from kvaudit.alerts.rules import load_default_pack, load_rules

    return load_rules(rules) if rules else load_default_pack()


def _bounds(args: argparse.Namespace) -> Bounds:
    if args.rule_limit < 1:
        raise UsageError("--rule-limit must be 1 or more")
    return Bounds(rule_timeout(args), args.rule_limit)


def run_default_rules(args: argparse.Namespace) -> int:
    from kvaudit.alerts.rules import default_pack_text

    print(default_pack_text(), end="")
    return ExitStatus.OK


def run_check(args: argparse.Namespace) -> int:
    from kvaudit.alerts.check import check_files

    problems = check_files(args.rules, Bounds(timeout_s=rule_timeout(args)))
    for problem in problems:
        print(visible(str(problem)))
    if problems:
        return ExitStatus.FOUND
    print(f"{len(args.rules)} rule files: no problems", file=sys.stderr)
    return ExitStatus.OK


def run_eval(args: argparse.Namespace) -> int:
    from kvaudit.alerts.engine import RuleEngine
    from kvaudit.present.rows import write_rows

    engine = RuleEngine(_groups(args.rules), skew_s=args.skew, bounds=_bounds(args))
    with open_backend(args.backend, args.paths, store=args.store) as backend:
        warn_backend_read_errors(backend)
        alerts = [a for a in engine.evaluate(backend) if a.state is not AlertState.RESOLVED]
    columns = ("state", "severity", "alertname", "labels", "value", "summary", "active_since")
    if alerts:
        write_rows(columns, [_row(a) for a in alerts], args.format, limit=row_limit(args))
    else:
        print("kvaudit alerts: nothing pending or firing", file=sys.stderr)
    return _outcome(engine, alerts, args.fail_on, undelivered=0)  # each rule's error was logged as it happened


def _outcome(engine: RuleEngine, alerts: Sequence[AlertInstance], fail_on: str, *, undelivered: int) -> ExitStatus:
    """4 when a rule failed or a delivery did (the picture is incomplete), 1 when alerts are at `fail_on`, else 0."""
    if engine.errors or undelivered:
        return ExitStatus.INCOMPLETE
    if any(a.state in FAIL_ON[fail_on] for a in alerts):
        return ExitStatus.FOUND
    return ExitStatus.OK


def _row(alert: AlertInstance) -> tuple[object, ...]:
    from kvaudit.alerts.labels import ALERTNAME
    from kvaudit.alerts.payloads import rfc3339
    from kvaudit.alerts.templates import format_value

    labels = ", ".join(f"{k}={v}" for k, v in sorted(alert.labels.items()) if k not in (ALERTNAME, "severity"))
    value = None if alert.value is None else format_value(alert.value)
    summary = alert.annotations.get("summary")
    return alert.state.value, alert.severity, alert.alertname, labels, value, summary, rfc3339(alert.active_since)


def run_watch(args: argparse.Namespace) -> int:
    from kvaudit.alerts.dispatch import Dispatcher
    from kvaudit.alerts.engine import RuleEngine
    from kvaudit.alerts.http import HttpPoster
    from kvaudit.alerts.notifiers import parse_notifier

    interval = args.interval
    if interval <= 0:
        raise UsageError("--interval must be longer than 0s")
    http = HttpPoster(timeout_s=args.timeout, retries=args.retries)
    notifiers = [
        parse_notifier(spec, http, external_url=args.external_url or "", group_by=args.group_by)
        for spec in args.notify or ["stdout"]
    ]
    engine = RuleEngine(
        _groups(args.rules),
        state_path=args.state or default_state_path(),
        skew_s=args.skew,
        bounds=_bounds(args),
        external_url=args.external_url or "",
    )
    backend = open_backend(args.backend, args.paths, store=args.store, live=True)  # trace files are read as they grow
    dispatcher = Dispatcher(notifiers)
    try:
        if args.metrics:
            _serve_metrics(engine, dispatcher, args.metrics)
        return _watch(args, engine, dispatcher, backend, longest_delivery_s=http.longest_s)
    except KeyboardInterrupt:
        # What was delivered meanwhile reaches the state file: a restart will not send it again.
        dispatcher.flush(timeout_s=http.timeout_s)
        dispatcher.acknowledge(engine.alerts)
        engine.save()
        raise
    finally:
        dispatcher.close()
        backend.close()


def _name_read_errors(tables: Tables) -> None:
    """Name the unreadable lines of a part of a read as it is taken in."""
    from kvaudit.present.rows import warn_read_errors

    warn_read_errors([(e["file"], e["line"], e["reason"]) for e in tables.errors.to_pylist()])


def _watch(
    args: argparse.Namespace, engine: RuleEngine, dispatcher: Dispatcher, backend: Backend, *, longest_delivery_s: float
) -> int:
    from kvaudit.alerts.dispatch import BATCH_SIZE
    from kvaudit.backends import BackendError

    status = ""
    while True:
        started = time.monotonic()
        try:
            # Only complete lines: a writer may be in the middle of the last one.
            backend.refresh(final=False, added=_name_read_errors)
        except (OSError, BackendError) as exc:
            # A file rotated or a directory remounted, a disk too full to spill to: alert on
            # what was read, retry next time.
            print(visible(f"kvaudit alerts: reading traces: {exc}"), file=sys.stderr)
        alerts = engine.evaluate(backend)  # it audits what the read added
        dispatcher.dispatch(alerts, engine.clock())  # queued: sent by the notifiers' own threads
        if args.once:
            # Each notifier sends its batches; a failed one gives up the rest until the next evaluation.
            batches = 1 + len(alerts) // BATCH_SIZE
            dispatcher.flush(timeout_s=batches * longest_delivery_s + 1.0)
            dispatcher.acknowledge(engine.alerts)
        engine.save()  # what each notifier acknowledged
        status = _status(engine, dispatcher, status)
        if args.once:
            undelivered = sum(s.undelivered for s in dispatcher.stats.values())
            return _outcome(engine, engine.alerts, args.fail_on, undelivered=undelivered)
        # Evaluations keep their interval, however long one took (a long one is followed at once).
        time.sleep(max(0.0, args.interval - (time.monotonic() - started)))


def _serve_metrics(engine: RuleEngine, dispatcher: Dispatcher, address: str) -> None:
    from prometheus_client import CollectorRegistry, start_http_server

    from kvaudit.alerts.watch_metrics import RuleMetrics
    from kvaudit.receive.otlp_http import parse_address

    host, port = parse_address(address, METRICS_PORT)
    registry = CollectorRegistry()
    registry.register(RuleMetrics(engine, dispatcher))
    server, _ = start_http_server(port, addr=host, registry=registry)
    print(f"kvaudit alerts: rule health on http://{host}:{server.server_port}/metrics", file=sys.stderr, flush=True)


def _status(engine: RuleEngine, dispatcher: Dispatcher, last: str) -> str:
    """Print how many alerts fire, which rules fail and how many notifications are owed, when that changed."""
    alerts = engine.alerts
    counts = {state: sum(a.state is state for a in alerts) for state in AlertState}
    status = f"kvaudit alerts: {counts[AlertState.FIRING]} firing, {counts[AlertState.PENDING]} pending"
    failing = sorted(f"{group}/{alert}" for group, alert in engine.errors)
    if failing:
        status += f"; failing rules: {', '.join(failing)}"
    status += "".join(
        f"; {name}: {s.undelivered} undelivered ({s.failed} failed so far)"
        for name, s in dispatcher.stats.items()
        if s.undelivered and s.last_error is not None
    )
    if status != last:
        print(visible(status), file=sys.stderr, flush=True)
    return status
