"""The TUI's small parts on their own: filter terms, descriptor comparison, cells, windows."""

from __future__ import annotations

import pytest

from kvaudit.analyse.audit import Finding
from kvaudit.tui import cells
from kvaudit.tui.descriptors import Mark, compare
from kvaudit.tui.figures import ReuseCell
from kvaudit.tui.filtering import Filter
from kvaudit.tui.findings import FindingRow, finding_rows
from kvaudit.tui.window import window_named


def finding(code: str, severity: str, replica: str, key: str, rule: str = "store-fetch-mismatch") -> Finding:
    return Finding(code, rule, severity, replica, key, "t" * 32, "s" * 16, ["model"], "m")


def test_filter_terms_and_bare_words():
    f = Filter.parse("replica:r2 RULE:kva004 key:ab bare")
    assert (f.replicas, f.rules, f.keys, f.words) == (("r2",), ("kva004",), ("ab",), ("bare",))
    assert str(Filter.parse("key:ab replica:r2")) == "replica:r2 key:ab"
    assert not Filter.parse("  ")


def test_filter_narrows_findings_replicas_and_cells():
    rows = finding_rows(
        [
            (finding("KVA004", "critical", "r2", "ab12"), None),
            (finding("KVA001", "warning", "r3", "cd34", "incomplete-metadata"), None),
        ]
    )
    assert [r.code for r in rows if Filter.parse("rule:kva004").keeps_finding(r)] == ["KVA004"]
    assert [r.code for r in rows if Filter.parse("rule:incomplete").keeps_finding(r)] == ["KVA001"]
    assert [r.code for r in rows if Filter.parse("key:cd").keeps_finding(r)] == ["KVA001"]
    assert [r.code for r in rows if Filter.parse("r2").keeps_finding(r)] == ["KVA004"]
    only_r3 = Filter.parse("replica:r3")
    assert not only_r3.keeps_replica("r2")
    assert only_r3.keeps_cell(ReuseCell("r3", "r1", 1, 1, 0, 32, 64))
    assert not only_r3.keeps_cell(ReuseCell("r1", "r2", 1, 1, 0, 32, 64))


def test_findings_critical_first_and_missing_fields_named():
    rows = finding_rows([(finding("KVA006", "info", "r1", "a"), 1), (finding("KVA004", "critical", "r2", "b"), None)])
    assert [r.severity for r in rows] == ["critical", "info"]
    assert rows[0].fields == {"model": {}}
    mapped = FindingRow.of(Finding("KVA004", "x", "critical", "r", "k", None, None, {"dtype": {"fetched": 1}}, "m"))
    assert mapped.fields == {"dtype": {"fetched": 1}}


def test_compare_marks_named_differing_and_one_sided_fields():
    fetched = {"key": "k", "model": "m", "layout": "A", "used": True, "dtype": "bf16"}
    stored = {"key": "k", "model": "m", "layout": "B", "used": None, "dtype": "bf16"}
    rows = {r.name: r.mark for r in compare(fetched, stored, named=frozenset({"dtype"}))}
    assert rows == {
        "key": Mark.SAME,
        "model": Mark.SAME,
        "dtype": Mark.NAMED,
        "layout": Mark.DIFFERS,
        "used": Mark.ABSENT,
    }
    assert [r.name for r in compare(fetched, None, named=frozenset())][:2] == ["key", "model"]


def test_cells():
    assert cells.sparkline([0, 1, 8]).plain == " ▁█"
    assert cells.sparkline([0, 0]).plain == "  "
    assert cells.count(123_456).plain == "123.5k"
    assert cells.count(9999).plain == "9999"
    assert cells.percent(None).plain == "–"
    assert cells.short_key("0123456789abcdef0123", 8) == "0123456…"


def test_windows():
    assert window_named("1m").since_ns(0, 100 * 10**9) == 40 * 10**9
    assert window_named("all").since_ns(5, 10) == 5
    assert window_named("1h").since_ns(50, 60) == 50
    with pytest.raises(ValueError, match="unknown window"):
        window_named("2d")
