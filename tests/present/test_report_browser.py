"""The HTML report as an operator sees it: loaded in headless Chromium (tests/support/chromium.py).

Over simulated fault traces (`kvaudit simulate --fault raw-ptr`): the page loads with no
console error, every chart is drawn with data, the headline says what `kvaudit sql` and
`kvaudit audit` say over the same traces, no table is cut off nor breaks a word, the plotly mode bar stays
clear of the plots, and the print layout fits an A4 landscape page.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvaudit.cli import main

from ..support.chromium import Browser, chromium, needs_chromium

pytestmark = needs_chromium

CHARTS = 6
# A4 landscape less the report's 12 mm print margins, in CSS pixels (96 per inch).
PRINT_WIDTH = round((297 - 2 * 12) / 25.4 * 96)


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sim")
    argv = ["simulate", "--out", str(out), "--duration", "60", "--rate", "0.5", "--fault", "raw-ptr:0.05", "-q"]
    assert main(argv) == 0
    return out / "traces"


@pytest.fixture(scope="module")
def report(traces: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    html = tmp_path_factory.mktemp("report") / "report.html"
    assert main(["report", str(traces), "--html", str(html), "--format", "json"]) == 1  # critical findings
    return html


@pytest.fixture(name="page")
def page_fixture(report: Path) -> Iterator[Browser]:
    with chromium() as browser:
        browser.open(report.as_uri(), width=1400, height=900)
        yield browser


def _sql(query: str, traces: Path, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    capsys.readouterr()
    assert main(["sql", str(traces), query, "--format", "json"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_page_loads_without_console_errors_and_every_chart_has_data(page: Browser, tmp_path: Path):
    charts = page.evaluate(
        """[...document.querySelectorAll('.js-plotly-plot')].map(plot => ({
            title: plot.closest('section').querySelector('h2').textContent,
            points: plot.data.map(t => (t.z || t.y || []).flat().filter(v => v !== null).length),
            drawn: plot.querySelectorAll('g.trace, g.hm, image').length,
        }))"""
    )
    assert page.console == []
    assert len(charts) == CHARTS, [c["title"] for c in charts]
    for chart in charts:
        assert chart["points"] and all(chart["points"]), chart
        assert chart["drawn"] > 0, chart
    assert page.evaluate("document.body.innerText.includes('No data.')") is False
    shot = page.screenshot()
    (tmp_path / "report.png").write_bytes(shot)  # kept with the test's files for a person to look at
    assert shot[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", shot[16:24])
    assert (width, height) == (1400, 900)


def test_headline_says_what_kvaudit_sql_says(page: Browser, traces: Path, capsys: pytest.CaptureFixture[str]):
    shown = page.evaluate(
        """Object.fromEntries([...document.querySelectorAll('dd[data-figure]')].map(
            dd => [dd.dataset.figure, {value: dd.dataset.value, text: dd.textContent}]))"""
    )
    [expected] = _sql(
        "SELECT count(DISTINCT replica) AS replicas, count(DISTINCT request_id) AS requests,"
        " strftime(min(start_time), '%Y-%m-%d %H:%M:%SZ') AS first,"
        " strftime(max(end_time), '%Y-%m-%d %H:%M:%SZ') AS last,"
        " sum(tokens_hit) FILTER (op = 'fetch') AS hit, sum(tokens_requested) FILTER (op = 'fetch') AS requested,"
        " sum(bytes) FILTER (op = 'fetch') AS fetched"
        " FROM spans WHERE op IS NOT NULL",
        traces,
        capsys,
    )
    assert main(["audit", str(traces), "--format", "json"]) == 1
    findings = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    # One bad page is one critical page, whichever rules fired on it.
    bad = {(f["replica"], f["trace_id"], f["span_id"], f["key"]) for f in findings if f["severity"] == "critical"}
    critical = len(bad)
    assert critical > 0  # the fault shows

    assert int(shown["replicas"]["value"]) == expected["replicas"] == 2
    assert int(shown["requests"]["value"]) == expected["requests"]
    assert shown["time_range"]["text"] == f"{expected['first']} → {expected['last']}"
    assert float(shown["hit_rate"]["value"]) == pytest.approx(expected["hit"] / expected["requested"], rel=1e-12)
    assert shown["hit_rate"]["text"] == f"{expected['hit'] / expected['requested']:.1%}"
    assert int(shown["fetch_bytes"]["value"]) == expected["fetched"]
    assert shown["fetch_bytes"]["text"].endswith(" GiB")
    assert int(shown["critical_pages"]["value"]) == critical
    assert shown["critical_pages"]["text"] == f"{critical:,}"


@pytest.mark.parametrize("width", [1400, 1024])
def test_no_table_is_cut_off_and_the_mode_bar_is_clear_of_the_plots(page: Browser, width: int):
    page.resize(width, 900)
    page.evaluate("new Promise(done => requestAnimationFrame(() => setTimeout(done, 300)))")
    clipped = page.evaluate(
        """[...document.querySelectorAll('section, header')].filter(s => s.scrollWidth > s.clientWidth)
            .map(s => s.querySelector('h1, h2').textContent)"""
    )
    assert clipped == []
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    overlaps = page.evaluate(
        """[...document.querySelectorAll('.js-plotly-plot')].flatMap(plot => {
            const bar = plot.querySelector('.modebar').getBoundingClientRect();
            return [...plot.querySelectorAll('.nsewdrag')].map(d => d.getBoundingClientRect())
                .filter(r => bar.left < r.right && r.left < bar.right && bar.top < r.bottom && r.top < bar.bottom)
                .map(() => plot.closest('section').querySelector('h2').textContent);
        })"""
    )
    assert overlaps == []


# Each word of each table cell (a key, hexadecimal, excepted): where it sits on more than one line.
_SPLIT_WORDS = """[...document.querySelectorAll('th, td:not(.key)')].flatMap(cell => {
    const text = cell.firstChild;
    if (!text || text.nodeType !== Node.TEXT_NODE) return [];
    return [...text.textContent.matchAll(/\\S+/g)].filter(word => {
        const range = document.createRange();
        range.setStart(text, word.index);
        range.setEnd(text, word.index + word[0].length);
        return new Set([...range.getClientRects()].map(r => Math.round(r.top))).size > 1;
    }).map(word => cell.closest('section').querySelector('h2').textContent + ': ' + word[0]);
})"""


@pytest.mark.parametrize("width", [1400, 1024])
def test_no_table_breaks_a_word_inside_itself(page: Browser, width: int):
    page.resize(width, 900)
    page.evaluate("new Promise(done => requestAnimationFrame(() => setTimeout(done, 300)))")
    assert page.evaluate(_SPLIT_WORDS) == []
    assert page.evaluate("document.documentElement.scrollWidth") <= width


def test_units_scales_and_bars(page: Browser):
    traces = page.evaluate(
        """Object.fromEntries([...document.querySelectorAll('.js-plotly-plot')].map(plot => [
            plot.closest('section').querySelector('h2').textContent,
            plot.data.map(t => ({type: t.type || 'scatter', zmin: t.zmin, name: t.name, legend: t.showlegend})),
        ]))"""
    )
    [heatmap] = traces["Cross-replica reuse: tokens fetched, producer → consumer"]
    assert heatmap["type"] == "heatmap" and heatmap["zmin"] == 0
    assert {t["type"] for t in traces["Latency distribution of fetches and stores"]} == {"bar"}
    # Lookups and fetches in panels of their own: each legend entry names lines in both.
    hit_rate = traces["Hit rate over time"]
    assert len(hit_rate) == 2 * sum(t["legend"] is not False for t in hit_rate)
    text = page.evaluate("document.body.innerText")
    assert "GiB" in text and " ms" in text and "%" in text
    assert not any(word.isdigit() and len(word) > 9 for word in text.split())  # no raw byte counts


def test_print_layout(page: Browser, tmp_path: Path):
    page.call("Emulation.setEmulatedMedia", session=True, media="print")
    page.resize(PRINT_WIDTH, 700)
    page.evaluate(
        "window.dispatchEvent(new Event('beforeprint'));"
        "new Promise(done => requestAnimationFrame(() => setTimeout(done, 300)))"
    )
    assert page.evaluate("document.documentElement.scrollWidth") <= PRINT_WIDTH
    assert page.evaluate("[...document.querySelectorAll('details')].every(d => d.open)")
    assert page.evaluate(
        "[...document.querySelectorAll('.modebar-container')].every(m => getComputedStyle(m).display === 'none')"
    )
    plots = page.evaluate("[...document.querySelectorAll('.js-plotly-plot .main-svg')].map(s => s.width.baseVal.value)")
    assert plots and max(plots) <= PRINT_WIDTH
    pdf = page.pdf()
    (tmp_path / "report.pdf").write_bytes(pdf)
    assert pdf.startswith(b"%PDF")
    assert page.console == []
