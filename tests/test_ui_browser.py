"""The web pages in a real browser: `veritrain ui` on a workspace with two real runs, driven in headless
Chromium (Debian's /usr/bin/chromium through Playwright), then the `veritrain publish` site opened
from file:// with every network request blocked.

Run by `make test-slow`, which fails them when /usr/bin/chromium or the playwright package is missing; elsewhere
they skip with one reason (`apt-get install chromium`; `pip install -r requirements-slow.lock`). Screenshots of the runs
table, a run page and the compare page go to $VERITRAIN_SCREENSHOTS (default: a temporary folder),
and also to test-artifacts/screenshots/ when $CI is set.
"""

from __future__ import annotations

import os
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
RUN_OVERRIDES = ["train.epochs=2", "model.name=mlp", "model.hidden=[16]"]
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
    return {"dir": ws, "runs": runs}


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
    result = veritrain("publish", "--out", str(out), "--workdir", str(workspace["dir"]), timeout=120)
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


@pytest.fixture
def watched(browser: Any) -> Iterator[Watched]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = Watched(context)
    yield page
    context.close()
    page.assert_clean()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _shot(page: Any, folder: Path, name: str) -> None:
    path = folder / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
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


# ---------------------------------------------------------------------------------------------- server


@pytest.mark.slow  # a browser: checked in `make test-slow`
def test_runs_table_sorts_and_filters(server: str, workspace: dict[str, Any], watched: Watched, screenshots: Path):
    page = watched.page
    page.goto(server + "/")
    page.locator("#runs-table tr[data-run-id]").first.wait_for(state="visible")
    ids = {run["id"] for run in workspace["runs"]}
    assert set(_row_ids(page)) == ids
    assert page.locator("#runs-count").count() == 1
    _shot(page, screenshots, "runs-table")

    page.locator('a.sort[data-key="test.accuracy"]').first.click()
    page.wait_for_load_state()
    page.locator("#runs-table tr[data-run-id]").first.wait_for(state="visible")
    accuracy = {run["id"]: run["accuracy"] for run in workspace["runs"]}
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
    assert run["seal"] in page.locator("#seal").inner_text()

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
    _shot(page, screenshots, "run-page")

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
    metrics = page.locator("#compare-metrics")
    metrics.wait_for()
    assert a in metrics.inner_text() and b in metrics.inner_text()
    assert page.locator("#compare-config").count() == 1
    _assert_charts(page, "#compare-curves", 2)
    legend = page.locator('#compare-curves .chart[data-chart="accuracy"] .u-legend').inner_text()
    assert a in legend and b in legend, "one line per run, named by its run id"
    _shot(page, screenshots, "compare-page")


@pytest.mark.slow  # a browser: checked in `make test-slow`
def test_data_and_experiments_pages_answer(server: str, workspace: dict[str, Any], watched: Watched):
    page = watched.page
    version = workspace["runs"][0]["data_version"]
    page.goto(f"{server}/data/{version}")
    assert version[:12] in page.locator("#data-title").inner_text()
    response = page.goto(f"{server}/experiments")
    assert response is not None and response.status == 200


# ---------------------------------------------------------------------------------------------- published site


@pytest.mark.slow  # a browser: checked in `make test-slow`
def test_published_site_works_offline(site: Path, workspace: dict[str, Any], browser: Any, screenshots: Path):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
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
        assert a in legend and b in legend, "one line per run, named by its run id"
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
