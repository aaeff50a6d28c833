"""The web pages in a real browser: `veritrain ui` on a workspace with two real runs and a 3-trial search,
driven in headless Chromium (Debian's /usr/bin/chromium through Playwright) at 1400 × 1000, a run that trains
while its page is open, then the `veritrain publish` site opened from file:// with every network request blocked.

Run by `make test-slow`, which fails them when /usr/bin/chromium or the playwright package is missing; elsewhere
they skip with one reason (`apt-get install chromium`; `pip install -r requirements-slow.lock`). Screenshots of the runs
table, a run page, the compare page and the search page go to $VERITRAIN_SCREENSHOTS (default: a temporary folder;
`VERITRAIN_SCREENSHOTS=docs/screenshots` makes the ones the docs show), and also to test-artifacts/screenshots/
when $CI is set.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest
from conftest import ROOT, in_process_run, need_extra, veritrain

CHROMIUM = Path("/usr/bin/chromium")
STATIC = ROOT / "src" / "veritrain" / "web" / "static"
# the runs: tiny mlp on digits, two seeds, so the two differ in every metric
RUN_OVERRIDES = ["train.epochs=2", "model.name=mlp", "model.hidden=[16]", "logging.every_steps=5"]
# a run that trains for about ten seconds (about 11,000 steps, a steps.jsonl line every 20) while the browser watches it
LIVE_RUN = ["--set", "train.epochs=120", "--set", "train.batch_size=16", "--set", "model.name=mlp", "--set", "model.hidden=[16]",
            "--set", "logging.every_steps=20", "--set", "eval.baselines=false", "--set", "export.formats=[safetensors]",
            "--set", "exp_name=live", "--no-smoke"]
SEARCH_CONFIG = """\
exp_name: ui-search
model: {name: mlp, hidden: [16]}
train: {epochs: 1}
logging: {every_steps: 5}
eval: {baselines: false}
export: {formats: [safetensors]}
"""
SEARCH_SPACE = "optim.lr: {log_uniform: [1.0e-4, 0.1]}\nmodel.hidden: {choice: [[8], [16]]}\n"
VIEWPORT = {"width": 1400, "height": 1000}
SERVER_START_S = 30  # seconds to wait for `veritrain ui` to answer
WAIT_MS = 15_000  # per browser wait


def test_static_assets_are_vendored_and_small():
    names = {p.name for p in STATIC.iterdir()}
    assert {"uplot.iife.min.js", "uplot.min.css", "LICENSE.uplot", "README.md", "charts.js", "style.css"} <= names
    assert sum(p.stat().st_size for p in STATIC.rglob("*") if p.is_file()) < 500_000
    assert "MIT" in (STATIC / "LICENSE.uplot").read_text()
    assert "(v1.6.32)" in (STATIC / "uplot.iife.min.js").read_text()[:200]
    charts = (STATIC / "charts.js").read_text()
    # CSP-safe: the pages allow script-src 'self' only
    for forbidden in ("eval(", "new Function", "innerHTML", "document.write", "import "):
        assert forbidden not in charts, forbidden


# ---------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def playwright_api() -> Iterator[Any]:
    import importlib.util

    need_extra(CHROMIUM.exists(), "browser tests need /usr/bin/chromium (apt-get install chromium)")
    need_extra(importlib.util.find_spec("playwright") is not None,
               "browser tests need the playwright package (pip install -r requirements-slow.lock)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="module")
def browser(playwright_api: Any) -> Iterator[Any]:
    instance = playwright_api.chromium.launch(executable_path=str(CHROMIUM), args=["--headless", "--no-sandbox", "--disable-gpu"])
    yield instance
    instance.close()


@pytest.fixture(scope="module")
def workspace(playwright_api: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two completed runs (seed 1 and 2), made once for the module."""
    ws = tmp_path_factory.mktemp("ui-ws")
    runs = []
    for seed in (1, 2):
        outcome = in_process_run(ws, [*RUN_OVERRIDES, f"seed={seed}"])
        record = outcome.record
        assert record["status"] == "completed", record.get("error")
        runs.append({"id": record["run_id"], "accuracy": record["metrics"]["test"]["accuracy"], "seal": outcome.seal,
                     "data_version": record["data"]["version"]})
    (ws.parent / "search.yaml").write_text(SEARCH_CONFIG)
    (ws.parent / "space.yaml").write_text(SEARCH_SPACE)
    searched = veritrain("search", str(ws.parent / "search.yaml"), "--space", str(ws.parent / "space.yaml"), "--trials", "3",
                         "--sampler", "random", "--pruner", "none", "--metric", "val.accuracy", "--no-smoke", "--workdir", str(ws),
                         "--json", timeout=600)
    assert searched.code == 0, searched.stderr
    return {"dir": ws, "runs": runs, "search": searched.json()}


@pytest.fixture(scope="module")
def server(workspace: dict[str, Any]) -> Iterator[str]:
    port = _free_port()
    log = workspace["dir"] / "ui.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "veritrain", "ui", "--port", str(port), "--workdir", str(workspace["dir"])],
                                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"`veritrain ui` exited with {proc.returncode} before answering:\n{log.read_text()}")
            try:
                with urllib.request.urlopen(base + "/", timeout=2) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"`veritrain ui` did not answer on {base} within {SERVER_START_S}s:\n{log.read_text()}")
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def site(workspace: dict[str, Any]) -> Path:
    out = workspace["dir"].parent / "site"
    result = veritrain("publish", *(run["id"] for run in workspace["runs"]), "--out", str(out), "--workdir", str(workspace["dir"]), timeout=120)
    assert result.code == 0, result.stderr
    return out


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = Path(os.environ["VERITRAIN_SCREENSHOTS"]) if os.environ.get("VERITRAIN_SCREENSHOTS") else tmp_path_factory.mktemp("screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class Watched:
    """A page with its console errors, CSP violations, script errors and blocked requests collected."""

    def __init__(self, context: Any) -> None:
        self.page = context.new_page()
        self.page.set_default_timeout(WAIT_MS)
        self.console_errors: list[str] = []
        self.csp: list[str] = []
        self.script_errors: list[str] = []
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda error: self.script_errors.append(str(error)))

    def _console(self, message: Any) -> None:
        text = message.text
        if "Content Security Policy" in text or "Content-Security-Policy" in text:
            self.csp.append(text)
        elif message.type == "error":
            self.console_errors.append(text)

    def assert_clean(self) -> None:
        assert not self.csp, f"CSP violations: {self.csp}"
        assert not self.script_errors, f"script errors: {self.script_errors} (console errors: {self.console_errors})"
        assert not self.console_errors, f"console errors: {self.console_errors}"


@pytest.fixture
def watched(browser: Any) -> Iterator[Watched]:
    context = browser.new_context(viewport=VIEWPORT)
    page = Watched(context)
    yield page
    context.close()
    page.assert_clean()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _shot(page: Any, folder: Path, name: str, full_page: bool = True) -> None:
    path = folder / f"{name}.png"
    page.wait_for_load_state("networkidle")
    page.screenshot(path=str(path), full_page=full_page)
    assert path.stat().st_size > 0
    if os.environ.get("CI"):
        artifacts = ROOT / "test-artifacts" / "screenshots"
        artifacts.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, artifacts / path.name)


def _row_ids(page: Any) -> list[str]:
    return page.locator("#runs-table tr[data-run-id]").evaluate_all("rows => rows.map(r => r.getAttribute('data-run-id'))")


def _wait_loaded(image: Any) -> int:
    """naturalWidth of an <img> once it has loaded (0 when it failed)."""
    image.wait_for(state="attached")
    deadline = time.monotonic() + WAIT_MS / 1000
    while time.monotonic() < deadline:
        if image.evaluate("img => img.complete"):
            break
        time.sleep(0.1)
    return image.evaluate("img => img.naturalWidth")


def _assert_charts(page: Any, container: str, at_least: int) -> None:
    page.locator(f"{container} .uplot canvas").first.wait_for(state="visible")
    assert page.locator(f"{container} .chart .uplot").count() >= at_least


def _assert_run_page(page: Any, run: dict[str, Any]) -> None:
    page.locator("#run-title").wait_for()
    assert run["id"] in page.locator("#run-title").inner_text()
    _assert_charts(page, "#curves", 2)  # loss and accuracy; lr too when recorded
    assert page.locator('#curves .chart[data-chart="loss"] .uplot').count() == 1
    assert page.locator('#curves .chart[data-chart="accuracy"] .uplot').count() == 1
    assert _wait_loaded(page.locator("img#confusion-matrix")) > 0
    assert _wait_loaded(page.locator("img#bad-cases")) > 0
    assert page.locator("#per-class").count() == 1
    assert page.locator('#curves .chart[data-chart="step_loss"] .uplot').count() == 1  # per step, from steps.jsonl
    assert page.locator('#curves .chart[data-chart="step_grad_norm"] .uplot').count() == 1


# ---------------------------------------------------------------------------------------------- server


@pytest.mark.slow  # a browser: checked in `make test-slow`
def test_runs_table_sorts_and_filters(server: str, workspace: dict[str, Any], watched: Watched, screenshots: Path):
    page = watched.page
    page.goto(server + "/")
    page.locator("#runs-table tr[data-run-id]").first.wait_for(state="visible")
    ids = {run["id"] for run in workspace["runs"]}
    assert ids <= set(_row_ids(page))  # the two runs, beside the search's trials
    assert page.locator("#runs-count").count() == 1
    _shot(page, screenshots, "runs-table", full_page=False)

    page.locator('a.sort[data-key="test.accuracy"]').first.click()
    page.wait_for_load_state()
    page.locator("#runs-table tr[data-run-id]").first.wait_for(state="visible")
    accuracy = {p.parent.name: json.loads(p.read_text())["metrics"]["test"]["accuracy"] for p in (workspace["dir"] / "runs").glob("*/record.json")}
    shown = [accuracy[i] for i in _row_ids(page)]
    assert shown == sorted(shown, reverse=True), "sorting by test.accuracy puts the largest first"

    first, second = workspace["runs"]
    page.locator("#runs-filter input[name=q]").fill(first["id"])
    submit = page.locator("#runs-filter [type=submit]")
    if submit.count():
        submit.first.click()
    else:
        page.locator("#runs-filter input[name=q]").press("Enter")
    page.wait_for_function("id => !document.querySelector(`#runs-table tr[data-run-id='${id}']`)", arg=second["id"])
    assert _row_ids(page) == [first["id"]]
    assert "q=" in page.url


@pytest.mark.slow  # a browser: checked in `make test-slow`
def test_run_page_draws_curves_and_verifies(server: str, workspace: dict[str, Any], watched: Watched, screenshots: Path):
    page = watched.page
    run = workspace["runs"][0]
    page.goto(server + "/")
    page.locator(f'#runs-table tr[data-run-id="{run["id"]}"] a.run-link').first.click()
    page.wait_for_url(f"**/runs/{run['id']}")
    _assert_run_page(page, run)
    assert page.locator("#check").count() == 1
    assert page.locator("#seal").get_attribute("data-full") == run["seal"] and page.locator("#seal").inner_text() == run["seal"][:12]

    verdict = page.locator("#verdict")
    assert verdict.get_attribute("data-state") == "none"  # nothing verified yet: the page shows no verdict
    assert page.locator("#verdict-summary").inner_text().startswith("not verified yet")
    assert page.locator('#check tr[data-row="run_verifies"]').get_attribute("class") == "check-unknown"

    button = page.locator("#verify-button")
    assert button.get_attribute("data-run") == run["id"]
    button.click()  # a POST with the X-Veritrain header, then the verdict URL polled until the job is done
    result = page.locator("#verify-result")
    result.filter(has_text="verified: seal").wait_for()
    assert result.inner_text().strip() == f"verified: seal {run['seal']}"
    assert verdict.get_attribute("data-state") == "ok" and run["seal"] in page.locator("#verdict-summary").inner_text()
    page.evaluate("window.scrollTo(0, 0)")
    _shot(page, screenshots, "run-page", full_page=False)

    page.reload()  # the verdict is kept: the page shows it, with its time and seal, and the checklist passes on it
    page.locator("#verdict").wait_for()
    assert page.locator("#verdict").get_attribute("data-state") == "ok"
    assert page.locator("#verdict-seal").inner_text() == run["seal"]
    assert page.locator("#verdict-summary").inner_text().startswith("verified at ")
    assert page.locator('#check tr[data-row="run_verifies"]').get_attribute("class") == "check-pass"


@pytest.mark.slow  # a browser: checked in `make test-slow`
def test_compare_page_overlays_the_runs(server: str, workspace: dict[str, Any], watched: Watched, screenshots: Path):
    page = watched.page
    a, b = (run["id"] for run in workspace["runs"])
    page.goto(f"{server}/compare?runs={a},{b}")
    page.locator("#compare-config").wait_for()
    metrics = page.locator("#compare-metrics")
    metrics.wait_for()
    assert a in metrics.inner_text() and b in metrics.inner_text()
    assert page.locator("#compare-config").count() == 1
    _assert_charts(page, "#compare-curves", 2)
    legend = page.locator('#compare-curves .chart[data-chart="accuracy"] .u-legend').inner_text()
    assert "seed=1" in legend and "seed=2" in legend, "one line per run, named by what changed"
    assert page.locator("#compare-change").bounding_box()["y"] < page.locator("#compare-metrics").bounding_box()["y"]
    _assert_compare_fits(page)
    _shot(page, screenshots, "compare-page", full_page=False)
    # the two runs and the search's three trials: five run columns, and long names of what changed (export formats,
    # learning rates, …) in the metrics table's header and the legends
    trials = [t["run_id"] for t in workspace["search"]["trials"] if t.get("run_id")]
    assert len(trials) == 3
    page.goto(f"{server}/compare?runs={','.join([a, b, *trials])}")
    page.locator("#compare-metrics").wait_for()
    _assert_charts(page, "#compare-curves", 2)
    assert page.locator("#compare-metrics thead th").count() == 6
    _assert_compare_fits(page)


def _intersect(a: dict[str, float], b: dict[str, float]) -> bool:
    return a["left"] < b["right"] and b["left"] < a["right"] and a["top"] < b["bottom"] and b["top"] < a["bottom"]


def _assert_compare_fits(page: Any) -> None:
    """The compare page in the 1400 px window: nothing wider than the window, the last run's column (header and values) of
    each table within it, and each chart's legend under its plot and inside its chart's box, overlapping no other
    legend and no plot."""
    width = VIEWPORT["width"]
    assert page.evaluate("document.documentElement.scrollWidth") <= width, "nothing wider than the window"
    for table in ("#compare-config", "#compare-metrics"):
        rights = page.locator(f"{table} tr > :last-child").evaluate_all("cells => cells.map(c => c.getBoundingClientRect().right)")
        assert rights and max(rights) <= width, f"{table}: the last run's column ends at {max(rights or [0])} px"
    charts = page.locator("#compare-curves .chart").evaluate_all(
        "charts => charts.filter(c => c.querySelector('.u-legend')).map(c => Object.fromEntries("
        "[['chart', c], ['legend', c.querySelector('.u-legend')], ['plot', c.querySelector('.u-over')]]"
        ".map(([k, e]) => [k, e.getBoundingClientRect().toJSON()])))")
    assert len(charts) >= 2
    for chart in charts:
        legend, plot, box = chart["legend"], chart["plot"], chart["chart"]
        assert legend["top"] >= plot["bottom"], "the legend is under its plot"
        assert box["left"] <= legend["left"] and legend["right"] <= box["right"] + 0.5, (legend, box)
        assert legend["right"] <= width
    for i, chart in enumerate(charts):
        for other in charts[i + 1:]:
            assert not _intersect(chart["legend"], other["legend"]), "two legends overlap"
            assert not _intersect(chart["legend"], other["plot"]) and not _intersect(other["legend"], chart["plot"]), "a legend over a plot"


@pytest.mark.slow  # a browser: checked in `make test-slow`
def test_data_and_experiments_pages_answer(server: str, workspace: dict[str, Any], watched: Watched):
    page = watched.page
    version = workspace["runs"][0]["data_version"]
    page.goto(f"{server}/data/{version}")
    assert version[:12] in page.locator("#data-title").inner_text()
    response = page.goto(f"{server}/experiments")
    assert response is not None and response.status == 200


def _significant_digits(text: str) -> int:
    """How many significant digits a number as shown has: 0.06667 has 4."""
    return len(text.strip().lstrip("-").split("e")[0].replace(".", "").lstrip("0"))


def _differing(ws: Path, run_ids: list[str]) -> list[str]:
    """The oracle: the config keys whose value is not the same in every listed run, from their whole configs."""
    from veritrain.records.experiments import flatten

    configs = [flatten(json.loads((ws / "runs" / r / "record.json").read_text())["config"]) for r in run_ids]
    return sorted(k for k in set().union(*configs) if k != "exp_name"
                  and len({json.dumps(c.get(k, "<absent>"), sort_keys=True) for c in configs}) > 1)


@pytest.mark.slow  # a browser: checked in `make test-slow`
def test_the_run_page_is_in_sections_a_person_scans(server: str, workspace: dict[str, Any], watched: Watched):
    page = watched.page
    run = workspace["runs"][0]
    page.goto(f"{server}/runs/{run['id']}")
    _assert_run_page(page, run)
    tops = [page.locator(f"section#{name}").bounding_box()["y"] for name in ("overview", "curves", "evaluation", "data", "trust", "files")]
    assert tops == sorted(tops), "Overview, Curves, Evaluation, Data, Trust and Files, in that order"
    assert tops[1] < 1000, "the curves begin on the first screen"
    page.locator('nav.sections a[href="#trust"]').click()
    page.wait_for_function("() => document.querySelector('#trust').getBoundingClientRect().top < 200")
    legend = page.locator('#curves .chart[data-chart="step_loss"] .u-legend').inner_text()
    assert "–" not in legend and re.search(r"\d", legend), f"a legend shows the last value, not a dash: {legend!r}"
    cells = page.locator("#per-class td.num").all_inner_texts()
    assert cells and all(_significant_digits(c) <= 4 for c in cells if "." in c), cells[:6]
    assert page.evaluate("document.documentElement.scrollWidth") <= 1400, "nothing wider than the window"


@pytest.mark.slow  # a browser: checked in `make test-slow`
def test_the_parameter_columns_list_exactly_the_config_keys_that_differ(server: str, workspace: dict[str, Any], watched: Watched):
    page = watched.page
    for query in ("", f"?exp_name={workspace['search']['exp_name']}", "?status=completed&kind=run"):
        page.goto(f"{server}/{query}")
        page.locator("#runs-table tr[data-run-id]").first.wait_for(state="visible")
        shown = page.locator('#runs-table th[data-kind="param"]').all_inner_texts()
        assert [s.strip(" ▲▼") for s in shown] == _differing(workspace["dir"], _row_ids(page)), query
    assert "optim.lr" in shown  # the search varied it
    page.goto(f"{server}/?cols=test.ece,val.accuracy")
    page.locator("#runs-table tr[data-run-id]").first.wait_for(state="visible")
    assert page.locator('#runs-table th[data-kind="metric"]').all_inner_texts() == ["test.ece", "val.accuracy"]
    assert page.locator("#cols-input").input_value() == "test.ece,val.accuracy"
    page.locator('a.group-link[data-group="sweep"]').click()
    page.locator("#groups-table").wait_for()
    assert "cols=test.ece%2Cval.accuracy" in page.url and "group=sweep" in page.url  # the picked columns stay in the URL
    assert page.locator(f'#groups-table tr[data-group="{workspace["search"]["id"]}"]').count() == 1


@pytest.mark.slow  # a browser: checked in `make test-slow`
def test_the_search_page_shows_trials_best_and_parallel_coordinates(server: str, workspace: dict[str, Any], watched: Watched, screenshots: Path):
    page = watched.page
    summary = workspace["search"]
    page.goto(f"{server}/sweeps/{summary['id']}")
    page.locator("#parallel svg").wait_for()
    assert page.locator("#trials-table tr[data-trial]").count() == 3
    assert page.locator("#parallel polyline.trial-line").count() == 3
    best = summary["best"]["number"]
    assert page.locator(f'#trials-table tr[data-trial="{best}"]').get_attribute("class").startswith("best")
    assert page.locator(f'#parallel polyline[data-trial="{best}"]').get_attribute("stroke-width") == "4"
    assert "not used for selection" in page.locator("#trials-table thead").inner_text()
    assert page.locator("#sweep-seal").get_attribute("data-ok") == "true"
    _shot(page, screenshots, "search-page", full_page=False)


@pytest.mark.slow  # a browser, and a run trained while it watches: checked in `make test-slow`
def test_a_run_that_trains_updates_its_page_and_the_runs_table_without_a_reload(server: str, workspace: dict[str, Any], browser: Any):
    context = browser.new_context(viewport=VIEWPORT)
    table, view = Watched(context), Watched(context)
    runs_dir = workspace["dir"] / "runs"
    before = {p.name for p in runs_dir.iterdir()}
    table.page.goto(server + "/")
    table.page.locator("#runs-table tr[data-run-id]").first.wait_for(state="visible")
    log = workspace["dir"].parent / "live-run.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "veritrain", "run", *LIVE_RUN, "--workdir", str(workspace["dir"])],
                                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    try:
        deadline, run_dir = time.monotonic() + 120, None
        while run_dir is None:  # the new run, once it trains: its record says running and steps.jsonl has a line
            assert time.monotonic() < deadline and proc.poll() is None, f"the run did not start training:\n{log.read_text()[-3000:]}"
            for candidate in set(p.name for p in runs_dir.iterdir()) - before:
                steps = runs_dir / candidate / "steps.jsonl"
                if steps.is_file() and steps.stat().st_size and json.loads((runs_dir / candidate / "record.json").read_text())["status"] == "running":
                    run_dir = runs_dir / candidate
            time.sleep(0.1)
        run_id = run_dir.name
        row = table.page.locator(f'#runs-table tr[data-run-id="{run_id}"]')
        row.wait_for(timeout=10_000)  # the table fetched itself again: no reload
        assert row.get_attribute("data-status") == "running"
        progress = row.locator(".progress")
        shown = progress.inner_text()
        table.page.wait_for_function("([id, was]) => { const p = document.querySelector(`[data-progress='${id}']`); return p && p.textContent !== was; }",
                                     arg=[run_id, shown], timeout=10_000)

        view.page.goto(f"{server}/runs/{run_id}")
        chart = view.page.locator('#curves .chart[data-chart="step_loss"] .uplot')
        chart.wait_for()
        points = int(chart.get_attribute("data-points"))
        view.page.wait_for_function("n => +document.querySelector('.chart[data-chart=\"step_loss\"] .uplot').getAttribute('data-points') > n",
                                    arg=points, timeout=10_000)
        assert proc.poll() is None, "the chart gained points while the run trained"
        assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
        view.page.locator("body[data-live-state='completed']").wait_for(timeout=10_000)
        assert "now completed" in view.page.locator("#live-state").inner_text()
        lines = sum(1 for _ in (run_dir / "steps.jsonl").open())
        view.page.wait_for_function("n => +document.querySelector('.chart[data-chart=\"step_loss\"] .uplot').getAttribute('data-points') == n",
                                    arg=lines, timeout=10_000)  # every line of steps.jsonl, each once
        shutil.rmtree(run_dir)  # deleted while its page is open: the page says so, and the table drops its row
        view.page.locator("body[data-live-state='deleted']").wait_for(timeout=10_000)
        assert "deleted" in view.page.locator("#live-state").inner_text()
        table.page.wait_for_function("id => !document.querySelector(`#runs-table tr[data-run-id='${id}']`)", arg=run_id, timeout=10_000)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        context.close()
    table.assert_clean()
    view.assert_clean()


# ---------------------------------------------------------------------------------------------- published site


@pytest.mark.slow  # a browser: checked in `make test-slow`
def test_published_site_works_offline(site: Path, workspace: dict[str, Any], browser: Any, screenshots: Path):
    context = browser.new_context(viewport=VIEWPORT)
    blocked: list[str] = []

    def only_files(route: Any) -> None:
        if route.request.url.startswith("file://"):
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    context.route("**/*", only_files)
    watched = Watched(context)
    page = watched.page
    try:
        page.goto((site / "index.html").as_uri())
        page.locator("#runs-table tr[data-run-id]").first.wait_for(state="visible")
        assert set(_row_ids(page)) == {run["id"] for run in workspace["runs"]}
        _shot(page, screenshots, "site-runs-table")

        run = workspace["runs"][1]
        page.locator(f'#runs-table tr[data-run-id="{run["id"]}"] a.run-link').first.click()
        page.wait_for_url(f"**/runs/{run['id']}.html")
        _assert_run_page(page, run)
        assert not page.locator("#verify-button").is_visible(), "a static page has no server to verify with"
        assert page.locator("#verdict").get_attribute("data-state") == "ok"  # the verdict publish computed for the page
        assert page.locator("#verdict-seal").inner_text() == run["seal"]
        _shot(page, screenshots, "site-run-page")

        for name in ("experiments.html", f"data/{run['data_version']}.html"):
            assert (site / name).is_file(), name

        page.goto((site / "index.html").as_uri())
        page.locator("#compare-link").click()
        page.wait_for_url("**/compare.html")
        metrics = page.locator("#compare-metrics")
        metrics.wait_for()
        a, b = (r["id"] for r in workspace["runs"])
        assert a in metrics.inner_text() and b in metrics.inner_text()
        _assert_charts(page, "#compare-curves", 2)
        legend = page.locator('#compare-curves .chart[data-chart="accuracy"] .u-legend').inner_text()
        assert "seed=1" in legend and "seed=2" in legend, "one line per run, named by what changed"
        _assert_compare_fits(page)
        _shot(page, screenshots, "site-compare-page")

        page.goto((site / "data" / f"{run['data_version']}.html").as_uri())
        assert run["data_version"][:12] in page.locator("#data-title").inner_text()
        assert page.locator("#split-table").count() == 1
        if (site / "files" / ".veritrain" / "data" / run["data_version"] / "flagged.png").is_file():
            assert _wait_loaded(page.locator("img#flagged")) > 0
        assert blocked == [], f"the published site fetched from the network: {blocked}"
    finally:
        context.close()
    watched.assert_clean()


@pytest.mark.slow  # a browser: checked in `make test-slow`
def test_a_run_that_validates_inside_epochs_is_drawn_by_step(browser: Any, tmp_path: Path):
    """A run with eval.every_steps has several rows in one epoch: its charts of metrics.jsonl place them by step, say
    so on the axis and in the title, and the page names the best validation by its step."""
    ws = tmp_path / "ws"
    outcome = in_process_run(ws, ["model.name=mlp", "model.hidden=[16]", "train.max_steps=40", "eval.every_steps=10",
                                  "eval.baselines=false", "export.formats=[safetensors]"])
    record = outcome.record
    assert record["status"] == "completed", record.get("error")
    out = tmp_path / "site"
    assert veritrain("publish", record["run_id"], "--out", str(out), "--workdir", str(ws), timeout=120).code == 0
    watched = Watched(browser.new_context(viewport=VIEWPORT))
    page = watched.page
    page.goto((out / "runs" / f"{record['run_id']}.html").as_uri())
    chart = page.locator('#curves .chart[data-chart="loss"] .uplot')
    chart.wait_for()
    assert page.locator('#curves .chart[data-chart="loss"] .u-title').inner_text() == "loss per validation"
    labels = page.locator('#curves .chart[data-chart="loss"] .u-legend .u-label').all_inner_texts()
    assert labels[0] == "step", labels  # the x series: steps, not epochs (two rows share epoch 2)
    best = record["training"]
    assert f"step {best['best_step']} (epoch {best['best_epoch']})" in page.locator("body").inner_text()
    watched.assert_clean()
