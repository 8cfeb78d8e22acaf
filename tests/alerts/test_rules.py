"""Rule files: loading, templates, durations, and `kvaudit alerts check` naming file, line and problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvaudit.alerts.check import check_files
from kvaudit.alerts.rules import RuleFileError, load_default_pack, load_rules
from kvaudit.alerts.templates import parse_template
from kvaudit.cli import main
from kvaudit.durations import parse_duration

from ..support import ROOT

GOOD = """\
groups:
  - name: g
    interval: 30s
    rules:
      - alert: Rejections
        expr: |
          SELECT replica, count(*) AS value
          FROM pages WHERE NOT used GROUP BY replica
        for: 1m30s
        keep_firing_for: 5m
        labels: {severity: warning}
        annotations:
          summary: "{{ $labels.replica }} rejected {{ $value }} pages ({{ $value | humanizePercentage }})"
"""


def _write(tmp_path: Path, text: str, name: str = "rules.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_good_file_loads_with_lines_and_durations(tmp_path: Path):
    [group] = load_rules([_write(tmp_path, GOOD)])
    [rule] = group.rules
    assert (group.name, group.interval_s, group.line) == ("g", 30.0, 2)
    assert (rule.alert, rule.for_s, rule.keep_firing_for_s, rule.line, rule.expr_line) == ("Rejections", 90, 300, 5, 7)
    assert rule.sql_line(2) == 8
    summary = rule.annotations["summary"].render({"replica": "r2"}, 0.25)
    assert summary == "r2 rejected 0.25 pages (25%)"
    assert check_files([tmp_path / "rules.yaml"]) == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("groups:\n  - name: g\n    rules: [\n", "rules.yaml:4: YAML: expected the node content"),
        (GOOD.replace("keep_firing_for", "keep_firing"), "rules.yaml:10: unknown key 'keep_firing' in a rule"),
        (GOOD.replace("for: 1m30s", "for: 90 seconds"), "rules.yaml:9: for: bad duration '90 seconds'"),
        (GOOD.replace("interval: 30s", "interval: 0s"), "rules.yaml:3: interval must be longer than 0s"),
        (GOOD.replace("FROM pages", "FROM pagez"), "rules.yaml:8: expr: Catalog Error: Table with name pagez"),
        (GOOD.replace("SELECT replica,", "SELEC replica,"), "rules.yaml:7: expr: Parser Error: syntax error"),
        (GOOD.replace("NOT used", "NOT usd"), 'rules.yaml:8: expr: Binder Error: Referenced column "usd" not found'),
        (GOOD.replace("count(*) AS value", "count(*) AS n"), "rules.yaml:7: expr: numeric column 'n' would be ignored"),
        (GOOD.replace("count(*) AS value", "'x' AS value"), "rules.yaml:7: expr: column 'value' must be numeric"),
        (GOOD.replace("$labels.replica", "$labels.model"), "rules.yaml:13: annotations.summary: $labels.model is"),
        (GOOD.replace("humanizePercentage", "toUpper"), "rules.yaml:13: annotations.summary: unknown template"),
        (GOOD.replace("{{ $value }}", "{{ .Value }}"), "rules.yaml:13: annotations.summary: unsupported template"),
        (GOOD.replace("alert: Rejections", "alert: Too many"), "rules.yaml:5: alert name 'Too many' is not a valid"),
        (GOOD.replace("{severity: warning}", "{alertname: x}"), "rules.yaml:11: label name 'alertname' is not allowed"),
        (GOOD.replace("for: 1m30s\n", "for: 1m\n        for: 2m\n"), "rules.yaml:10: duplicate key 'for'"),
        (GOOD.replace("    rules:\n", "    rule:\n"), "rules.yaml:2: a group lacks 'rules'"),
        ("groups: {}\n", "rules.yaml:1: groups must be a list"),
        (GOOD.replace("interval: 30s", "interval: 30s\n    limit: 0"), "rules.yaml:4: limit must be a whole number"),
        (GOOD.replace("name: g", "name: kvaudit-rule-health"), "rules.yaml:2: group name 'kvaudit-rule-health' is"),
    ],
)
def test_check_names_file_line_and_problem(tmp_path: Path, text: str, expected: str):
    path = _write(tmp_path, text)
    problems = [str(p).replace(str(tmp_path) + "/", "") for p in check_files([path])]
    assert any(p.startswith(expected) for p in problems), problems


def test_check_reports_every_problem_and_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    broken = GOOD.replace("for: 1m30s", "for: soon").replace("FROM pages", "FROM pagez")
    path = _write(tmp_path, broken + GOOD.removeprefix("groups:\n"))  # the same group again
    assert main(["alerts", "check", str(path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert f"{path}:9: for: bad duration 'soon' (expected e.g. 30s, 5m, 1h30m)" in lines
    assert any(line.startswith(f"{path}:8: expr: Catalog Error: Table with name pagez") for line in lines)
    assert any(line.startswith(f"{path}:14: group 'g' already defined") for line in lines)
    assert all(line.startswith(f"{path}:") for line in lines)


def test_check_of_the_default_pack_and_the_example_is_clean(capsys: pytest.CaptureFixture[str]):
    example = ROOT / "examples" / "alerts" / "kvaudit-rules.yaml"
    assert main(["alerts", "check", str(example)]) == 0
    assert len(load_default_pack()) == 3
    assert main(["alerts", "default-rules"]) == 0
    assert capsys.readouterr().out == example.read_text()


def test_eval_refuses_a_broken_rule_file_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    path = _write(tmp_path, GOOD.replace("for: 1m30s", "for: soon"))
    trace = _write(tmp_path, "", "empty.jsonl")
    assert main(["alerts", "eval", str(trace), "--rules", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "for: bad duration 'soon'" in err


def test_durations_and_templates(tmp_path: Path):
    assert parse_duration("1h30m") == 5400 and parse_duration("250ms") == 0.25 and parse_duration("0") == 0
    for bad in ("", "5", "1.5m", "30m1h", "-1s"):
        with pytest.raises(ValueError):
            parse_duration(bad)
    assert parse_template("{{ $value | humanize }}B").render({}, 1_500_000) == "1.5MB"
    assert parse_template("{{ $value | humanizeDuration }}").render({}, 3725) == "1h 2m 5s"
    assert parse_template("{{$value}}/{{ $labels.x }}").render({}, 3.0) == "3/"
    with pytest.raises(ValueError, match="unclosed"):
        parse_template("{{ $value")
    with pytest.raises(RuleFileError, match="run `kvaudit alerts check`"):
        load_rules([_write(tmp_path, "groups: 3\n")])
