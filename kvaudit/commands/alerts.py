"""`kvaudit alerts`: check rule files, evaluate them once, or watch trace files grow.

kvaudit alerts check rules.yaml
kvaudit alerts eval traces/                      # the default rule pack
kvaudit alerts watch traces/ --rules rules.yaml --interval 15s --notify alertmanager:http://am:9093
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from kvaudit.alerts.check import check_files
from kvaudit.alerts.dispatch import Dispatcher
from kvaudit.alerts.engine import RuleEngine
from kvaudit.alerts.http import HttpPoster
from kvaudit.alerts.instances import AlertInstance, AlertState
from kvaudit.alerts.notifiers import parse_notifier
from kvaudit.alerts.payloads import rfc3339
from kvaudit.alerts.rules import ALERTNAME, Group, default_pack_text, load_default_pack, load_rules
from kvaudit.alerts.templates import format_value
from kvaudit.commands.arguments import (
    UsageError,
    add_input_arguments,
    command_parser,
    duration,
    open_backend,
    warn_backend_read_errors,
)
from kvaudit.present.rows import FORMATS, warn_read_errors, write_rows

DEFAULT_STATE = "kvaudit-alerts.state.json"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = command_parser(
        subparsers,
        "alerts",
        "Alerting rules over the kvaudit views: check rule files, evaluate them, watch traces and notify.",
        "kvaudit alerts watch traces/ --interval 15s --notify webhook:http://127.0.0.1:5001/hook",
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

    check = actions.add_parser("check", help="validate rule files: one `file:line: problem` each, exit 1 if any")
    check.add_argument("rules", nargs="+", metavar="RULES", help="rule files")
    check.set_defaults(run=run_check)

    evaluate = actions.add_parser("eval", help="evaluate the rules once and print pending and firing alerts")
    _add_common(evaluate)
    evaluate.add_argument("--format", choices=FORMATS, default="table")
    evaluate.set_defaults(run=run_eval)

    watch = actions.add_parser("watch", help="evaluate as trace files grow; keep alert state on disk; notify")
    _add_common(watch)
    watch.add_argument("--interval", type=duration, default=15.0, help="evaluation interval (default 15s)")
    watch.add_argument("--state", default=DEFAULT_STATE, help=f"alert state file (default {DEFAULT_STATE})")
    watch.add_argument(
        "--notify",
        action="append",
        metavar="SPEC",
        help="stdout, file:PATH, webhook:URL or alertmanager:URL; repeatable (default: stdout)",
    )
    watch.add_argument("--timeout", type=duration, default=5.0, help="per HTTP attempt (default 5s)")
    watch.add_argument("--retries", type=int, default=3, help="HTTP retries after the first attempt (default 3)")
    watch.add_argument("--once", action="store_true", help="evaluate and notify once, then exit (for cron and tests)")
    watch.set_defaults(run=run_watch)

    default = actions.add_parser("default-rules", help="print the default rule pack (to copy and tune)")
    default.set_defaults(run=run_default_rules)


def _add_common(parser: argparse.ArgumentParser) -> None:
    add_input_arguments(parser)
    parser.add_argument(
        "--rules", action="append", metavar="RULES", help="rule file; repeatable (default: the default pack)"
    )


def _groups(rules: Sequence[str] | None) -> list[Group]:
    return load_rules(rules) if rules else load_default_pack()


def run_default_rules(args: argparse.Namespace) -> int:
    print(default_pack_text(), end="")
    return 0


def run_check(args: argparse.Namespace) -> int:
    problems = check_files(args.rules)
    for problem in problems:
        print(problem)
    if problems:
        return 1
    print(f"{len(args.rules)} rule files: no problems", file=sys.stderr)
    return 0


def run_eval(args: argparse.Namespace) -> int:
    engine = RuleEngine(_groups(args.rules), skew_s=args.skew)
    with open_backend(args.backend, args.paths) as backend:
        warn_backend_read_errors(backend)
        alerts = [a for a in engine.evaluate(backend) if a.state is not AlertState.RESOLVED]
    columns = ("state", "severity", "alertname", "labels", "value", "summary", "active_since")
    if alerts:
        write_rows(columns, [_row(a) for a in alerts], args.format)
    else:
        print("kvaudit alerts: nothing pending or firing", file=sys.stderr)
    return 1 if engine.errors else 0  # each rule's error was logged as it happened


def _row(alert: AlertInstance) -> tuple[object, ...]:
    labels = ", ".join(f"{k}={v}" for k, v in sorted(alert.labels.items()) if k not in (ALERTNAME, "severity"))
    value = None if alert.value is None else format_value(alert.value)
    summary = alert.annotations.get("summary")
    return alert.state.value, alert.severity, alert.alertname, labels, value, summary, rfc3339(alert.active_since)


def run_watch(args: argparse.Namespace) -> int:
    interval = args.interval
    if interval <= 0:
        raise UsageError("--interval must be longer than 0s")
    http = HttpPoster(timeout_s=args.timeout, retries=args.retries)
    dispatcher = Dispatcher([parse_notifier(spec, http) for spec in args.notify or ["stdout"]])
    engine = RuleEngine(_groups(args.rules), state_path=args.state, skew_s=args.skew)
    backend = open_backend(args.backend, args.paths, live=True)  # trace files are read as they grow
    status = ""
    while True:
        try:
            # Only complete lines: a writer may be in the middle of the last one.
            tables = backend.refresh(final=False)
            if tables is not None:
                warn_read_errors([(e["file"], e["line"], e["reason"]) for e in tables.errors.to_pylist()])
        except OSError as exc:
            # A file rotated or a directory remounted: alert on what was read, retry next time.
            print(f"kvaudit alerts: reading traces: {exc}", file=sys.stderr)
        alerts = engine.evaluate(backend)
        dispatcher.dispatch(alerts, engine.clock())
        engine.save()  # what each notifier acknowledged
        status = _status(alerts, dispatcher, status)
        if args.once:
            return 0
        time.sleep(interval)


def _status(alerts: Sequence[AlertInstance], dispatcher: Dispatcher, last: str) -> str:
    """Print how many alerts fire and how many notifications are owed, when that changed."""
    counts = {state: sum(a.state is state for a in alerts) for state in AlertState}
    owed = [
        f"{name}: {s.undelivered} undelivered ({s.failed} failed so far)"
        for name, s in dispatcher.stats.items()
        if s.undelivered
    ]
    status = f"kvaudit alerts: {counts[AlertState.FIRING]} firing, {counts[AlertState.PENDING]} pending"
    status += "".join(f"; {text}" for text in owed)
    if status != last:
        print(status, file=sys.stderr, flush=True)
    return status
