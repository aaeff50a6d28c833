"""The run browser (`veritrain ui`) through Starlette's TestClient, and `veritrain publish`: the pages keep
the DOM the browser tests use, hostile text is escaped, nothing outside runs/ and data versions is
served, requests for another Host are refused, and no page or verify request writes to a run. The CLI,
the Verify button, `check` and `publish` give one verdict; a page shows only a verdict that was computed."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import shutil
import threading
import time
import warnings
from pathlib import Path
from urllib.parse import urlencode

import pytest

from conftest import FAST_OVERRIDES, in_process_run, veritrain

pytest.importorskip("starlette")
pytest.importorskip("jinja2")
with warnings.catch_warnings():  # Starlette's TestClient on httpx warns that httpx2 is its successor
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient
SCRIPT = "<script>alert(1)</script>"
ATTRIBUTE = '"><img src=x onerror=alert(1)>'
BASE = "http://127.0.0.1:8765"
VERIFY_HEADERS = {"X-Veritrain": "verify", "Origin": BASE}  # what the run page's button sends
JOB_POLLS = 6000  # reads of a verify job's progress, 0.05 s apart, before a test gives up on it


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A workspace with one real run (hostile hypothesis, experiment name and notes) and a forged copy of it
    (hostile class names, an edited per-class table so it no longer verifies, a link to a file outside)."""
    import torch

    from veritrain.orchestration import pipeline
    from veritrain.core.config import load_config
    from veritrain.records.workspace import Workspace

    root = tmp_path_factory.mktemp("web")
    workspace = Workspace.open(root / "ws")
    threads = torch.get_num_threads()
    try:
        resolved = load_config(None, [*FAST_OVERRIDES, "train.epochs=1", f"exp_name=x{SCRIPT}"])
        outcome = pipeline.run(resolved, workspace, ["veritrain", "run"], hypothesis=f"h {SCRIPT} {ATTRIBUTE}")
    finally:
        torch.set_num_threads(threads)
    run_id = outcome.record["run_id"]
    good = workspace.runs_dir / run_id
    with (good / "notes.jsonl").open("w", encoding="utf-8") as f:
        f.write(json.dumps({"text": f"note {ATTRIBUTE}", "at": "2026-01-01T00:00:00"}) + "\n")
        f.write(json.dumps({"text": f"done {SCRIPT}", "conclusion": True, "at": "2026-01-01T00:00:01"}) + "\n")
    forged_id = run_id[:-6] + "ffffff"
    forged = workspace.runs_dir / forged_id
    shutil.copytree(good, forged)
    record = json.loads((forged / "record.json").read_text(encoding="utf-8"))
    record["run_id"] = forged_id
    record["data"]["classes"] = [ATTRIBUTE, *record["data"]["classes"][1:]]
    (forged / "record.json").write_text(json.dumps(record), encoding="utf-8")
    rows = list(csv.reader((forged / "eval" / "test" / "per_class.csv").open(encoding="utf-8")))
    rows[1][0] = ATTRIBUTE
    with (forged / "eval" / "test" / "per_class.csv").open("w", encoding="utf-8", newline="") as f:
        csv.writer(f).writerows(rows)
    secret = root / "secret.png"
    secret.write_bytes(b"\x89PNG secret outside the workspace")
    (forged / "eval" / "test" / "leak.png").symlink_to(secret)
    return {"workspace": workspace, "good": run_id, "forged": forged_id, "root": root}


@pytest.fixture(scope="module")
def client(site):
    from veritrain.web.server import create_app

    return TestClient(create_app(site["workspace"]), base_url=BASE)


def _tree_hashes(workspace) -> dict[str, str]:
    found = {}
    for top in (workspace.runs_dir, workspace.state_dir / "data"):
        for path in sorted(top.rglob("*")):
            if path.is_file() and not path.is_symlink():
                found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def _no_raw_hostile_text(html: str) -> None:
    assert SCRIPT not in html and ATTRIBUTE not in html
    assert "<img src=x" not in html


def test_runs_table_keeps_its_dom_contract_and_escapes(client, site):
    page = client.get("/")
    assert page.status_code == 200
    html = page.text
    _no_raw_hostile_text(html)
    assert '<table id="runs-table" data-live="1">' in html and '<form id="runs-filter" method="get"' in html
    for name in ("status", "exp_name", "kind", "data_version", "metric", "min", "max", "q"):
        assert f'name="{name}"' in html
    assert re.search(r'<p id="runs-count">2 runs', html)
    for run_id in (site["good"], site["forged"]):
        assert f'<tr data-run-id="{run_id}" data-status="completed">' in html
        assert f'<a class="run-link" href="runs/{run_id}">' in html
    assert '<a class="sort" data-key="test.accuracy" href="?sort=test.accuracy"' in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_sort_filter_search_and_pages(client, site, monkeypatch):
    from veritrain.web import views

    html = client.get("/?sort=-run_id").text
    assert html.index(site["good"]) < html.index(site["forged"])
    html = client.get("/?sort=run_id").text
    assert html.index(site["forged"]) < html.index(site["good"])
    assert "runs-count\">0 runs" in client.get("/?status=failed").text
    assert "runs-count\">2 runs" in client.get("/?status=completed&kind=run").text
    assert "runs-count\">0 runs" in client.get("/?" + urlencode({"metric": "test.accuracy", "min": "1.5"})).text
    assert "runs-count\">2 runs" in client.get("/?" + urlencode({"metric": "test.accuracy", "min": "0", "max": "1"})).text
    assert "runs-count\">1 runs" in client.get("/?q=ffffff").text
    assert "runs-count\">2 runs" in client.get("/?" + urlencode({"q": "onerror"})).text  # notes and hypotheses are searched
    assert client.get("/?sort=x;drop").status_code == 400
    assert client.get("/?min=abc&metric=test.accuracy").status_code == 400
    monkeypatch.setattr(views, "PAGE_SIZE", 1)
    table = views.runs_table(site["workspace"], {"sort": "run_id"}, page_size=1)
    assert table["pages"] == 2 and [r["run_id"] for r in table["rows"]] == [site["forged"]]
    api = client.get("/api/runs?sort=run_id&page=2").json()
    assert api["total"] == 2 and api["page"] == 1 and len(api["rows"]) == 2  # 100 a page: page 2 is past the end, so page 1
    # a page number past the end (or past SQLite's 64-bit OFFSET) is the last page; below 1 the first
    assert views.runs_table(site["workspace"], {"sort": "run_id", "page": "99999999999999999999999"}, page_size=1)["page"] == 2
    assert views.runs_table(site["workspace"], {"sort": "run_id", "page": "-4"}, page_size=1)["page"] == 1
    huge = client.get("/?page=99999999999999999999999")
    assert huge.status_code == 200 and "runs-count\">2 runs" in huge.text
    assert client.get("/?page=two").status_code == 400


def test_pagination_links(site):
    from veritrain.web import views
    from veritrain.web.server import create_app

    original = views.runs_table
    views.runs_table = lambda workspace, params, page_size=1, only=None, fresh=False: original(workspace, params, page_size=1)
    try:
        client = TestClient(create_app(site["workspace"]), base_url=BASE)
        first = client.get("/?sort=run_id").text
        assert 'class="page-next" href="?sort=run_id&amp;page=2"' in first and "page-prev" not in first
        second = client.get("/?sort=run_id&page=2").text
        assert 'class="page-prev"' in second and "page-next" not in second
        assert site["good"] in second and site["forged"] not in second
    finally:
        views.runs_table = original


def test_run_page(client, site):
    html = client.get(f"/runs/{site['good']}").text
    _no_raw_hostile_text(html)
    assert f'<h1 id="run-title">run {site["good"]}</h1>' in html
    seal = (site["workspace"].runs_dir / site["good"] / "record.sha256").read_text().strip()
    assert f'<code class="hash-short" id="seal" title="{seal}" data-full="{seal}">{seal[:12]}</code>' in html
    assert f'data-copy="{seal}"' in html  # the copy button copies the whole seal
    for section in ("overview", "curves", "evaluation", "data", "trust", "files"):
        assert f'<section id="{section}" class="card">' in html and f'<a href="#{section}">' in html
    for needle in ( '<div class="chart" data-chart="loss"></div>', '<div class="chart" data-chart="accuracy"></div>',
                   '<table id="per-class"', '<table id="check">', f'<button id="verify-button" data-run="{site["good"]}"',
                   '<output id="verify-result"></output>', 'id="confusion-matrix" src="../files/runs/', 'id="bad-cases" src="../files/runs/'):
        assert needle in html, needle
    data = json.loads(re.search(r'<script type="application/json" id="curves-data">(.*?)</script>', html, re.S).group(1))
    assert data["epochs"] == [1] and set(data["series"]) >= {"train_loss", "val_loss", "train_acc", "val_acc", "lr"}
    image = re.search(r'id="confusion-matrix" src="\.\./(files/[^"]+)"', html).group(1)
    response = client.get("/" + image)
    assert response.status_code == 200 and response.headers["content-type"] == "image/png"
    forged = client.get(f"/runs/{site['forged']}").text
    _no_raw_hostile_text(forged)
    assert "&#34;&gt;&lt;img src=x onerror=alert(1)&gt;" in forged  # the class name, escaped


def test_compare_data_and_experiments_pages(client, site):
    html = client.get(f"/compare?runs={site['good']},{site['forged']}").text
    _no_raw_hostile_text(html)
    assert '<table id="compare-metrics">' in html and '<section id="compare-curves" class="card">' in html
    assert html.index('id="compare-change"') < html.index('id="compare-curves"') < html.index('id="compare-metrics"'), "the change leads"
    data = json.loads(re.search(r'id="curves-data">(.*?)</script>', html, re.S).group(1))
    assert set(data["runs"]) == {site["good"], site["forged"]}
    assert client.get(f"/compare?runs={site['good']}").status_code == 400
    assert client.get("/compare?runs=a,b").status_code == 404
    version = json.loads((site["workspace"].runs_dir / site["good"] / "record.json").read_text())["data"]["version"]
    page = client.get(f"/data/{version}")
    assert page.status_code == 200 and f'<h1 id="data-title">data version {version}</h1>' in page.text
    assert client.get("/data/%2e%2e").status_code == 404 and client.get("/data/0123abcd").status_code == 404
    experiments = client.get("/experiments").text
    _no_raw_hostile_text(experiments)
    assert site["good"] in experiments


def test_files_refuse_traversal_links_and_other_files(client, site):
    run = site["good"]
    assert client.get(f"/files/runs/{run}/eval/test/per_class.csv").status_code == 200
    for path in ("/files/../x", "/files/%2e%2e/x", "/files/runs/%2e%2e/%2e%2e/secret.png", "/files//etc/passwd", "/files/%2fetc/passwd",
                 f"/files/runs/{site['forged']}/eval/test/leak.png", f"/files/runs/{run}/checkpoints/best.pt",
                 f"/files/runs/{run}", "/files/.veritrain/registry.sqlite", "/files/runs/../../secret.png", "/static/../server.py"):
        response = client.get(path)
        assert response.status_code in (400, 404), path
        assert b"secret outside" not in response.content


def test_host_header_and_security_headers(client, site):
    from veritrain.web.server import create_app

    assert client.get("/", headers={"host": "evil.example:8765"}).status_code == 400
    assert client.get("/", headers={"host": "127.0.0.1:9999"}).status_code == 400
    assert client.get("/", headers={"host": "localhost:8765"}).status_code == 200
    response = client.get("/")
    assert "default-src 'none'" in response.headers["content-security-policy"]
    assert "script-src 'self'" in response.headers["content-security-policy"]
    assert response.headers["x-content-type-options"] == "nosniff" and response.headers["referrer-policy"] == "no-referrer"
    other = TestClient(create_app(site["workspace"], host="10.1.2.3", port=9000), base_url="http://10.1.2.3:9000")
    assert other.get("/").status_code == 200
    assert client.post("/").status_code == 405


def test_no_page_or_verify_writes_to_runs_or_data(client, site):
    before = _tree_hashes(site["workspace"])
    version = json.loads((site["workspace"].runs_dir / site["good"] / "record.json").read_text())["data"]["version"]
    for path in ("/", "/?sort=test.accuracy", "/api/runs", f"/runs/{site['good']}", f"/runs/{site['forged']}", "/experiments",
                 f"/compare?runs={site['good']},{site['forged']}", f"/data/{version}"):
        assert client.get(path).status_code == 200, path
    good = _verify_in_browser(client, site["good"])
    forged = _verify_in_browser(client, site["forged"])
    assert good["ok"] is True and forged["ok"] is False
    assert client.post("/api/runs/..%2F..%2Fx/verify", headers=VERIFY_HEADERS).status_code == 404
    assert client.get("/api/runs/..%2F..%2Fx/verdict").status_code == 404
    assert _tree_hashes(site["workspace"]) == before


def _assert_relative_site(out: Path) -> list[Path]:
    """Every page of a published site: no hostile text, every link relative and every linked file present."""
    pages = sorted(out.rglob("*.html"))
    for page in pages:
        html = page.read_text(encoding="utf-8")
        _no_raw_hostile_text(html)
        assert 'id="live-data"' not in html and 'data-live="1"' not in html, f"{page.name}: a published page stays static"
        for link in re.findall(r'(?:src|href)="([^"]*)"', html):
            assert not re.match(r"[a-z]+:|//|/", link), f"{page.name}: {link}"
            target = link.split("?")[0].split("#")[0]
            if target and not target.startswith("static/") and "/static/" not in "/" + target:
                assert (page.parent / target).exists(), f"{page.name}: {link}"
    return pages


def test_publish_writes_a_relative_site_and_refuses_runs_that_do_not_verify(site, tmp_path):
    workdir = str(site["workspace"].root)
    refused = veritrain("publish", site["forged"], "--out", str(tmp_path / "refused"), "--workdir", workdir)
    assert refused.code == 1 and site["forged"] in refused.stderr and "does not verify" in refused.stderr
    assert refused.stderr.startswith("error: ") and len(refused.stderr.strip().splitlines()) == 1
    out = tmp_path / "site"
    result = veritrain("publish", site["good"], "--out", str(out), "--with-archives", "--json", "--workdir", workdir)
    assert result.code == 0, result.stderr
    summary = result.json()
    assert summary["runs"] == [site["good"]] and len(summary["archives"]) == 1
    pages = _assert_relative_site(out)
    assert {p.relative_to(out).as_posix() for p in pages} >= {"index.html", f"runs/{site['good']}.html", "experiments.html"}
    assert not (out / "compare.html").exists() and 'id="compare-link"' not in (out / "index.html").read_text(encoding="utf-8")
    run_html = (out / "runs" / f"{site['good']}.html").read_text(encoding="utf-8")
    seal = (site["workspace"].runs_dir / site["good"] / "record.sha256").read_text().strip()
    assert f"veritrain verify {site['good']} --expect {seal}" in run_html and "verify-button" not in run_html
    # the verdict publish computed for the page (the CLI's defaults), with its time and seal
    assert 'id="verdict" class="verdict verdict-ok" data-state="ok"' in run_html
    assert re.search(r'verified at <time>\d{4}-\d\d-\d\dT[^<]+</time> for seal <code id="verdict-seal">' + seal, run_html)
    assert '<tr data-row="run_verifies" class="check-pass">' in run_html
    assert f"veritrain import {site['good']}.tar.gz" in run_html
    elsewhere = tmp_path / "elsewhere"
    imported = veritrain("import", str(out / "runs" / f"{site['good']}.tar.gz"), "--workdir", str(elsewhere))
    assert imported.code == 0, imported.stderr
    assert veritrain("verify", site["good"], "--expect", seal, "--workdir", str(elsewhere)).code == 0


def test_publish_of_the_workspace_publishes_the_runs_that_verify_and_names_the_one_that_does_not(site, tmp_path):
    out = tmp_path / "whole"
    result = veritrain("publish", "--out", str(out), "--json", "--workdir", str(site["workspace"].root))
    assert result.code == 1, result.stdout + result.stderr
    summary = result.json()  # one JSON document: what was published and what was skipped
    assert summary["runs"] == [site["good"]] and [s["run_id"] for s in summary["skipped"]] == [site["forged"]]
    assert (out / "runs" / f"{site['good']}.html").is_file() and not (out / "runs" / f"{site['forged']}.html").exists()
    named = [line for line in result.stderr.splitlines() if line.startswith(f"publish: skipped {site['forged']}: ")]
    assert len(named) == 1 and "does not verify" in named[0]
    assert result.stderr.strip().splitlines()[-1].startswith("error: publish: 1 run(s) skipped")


def test_data_page_tables_gallery_and_limits(tmp_path):
    """A data version's page from its data_report.json: achieved split, quarantine, findings by kind, label issues
    and outliers with the gallery, the card; hostile text escaped, long tables cut at 500 rows."""
    from PIL import Image

    from veritrain.web import views
    from veritrain.web.server import create_app
    from veritrain.records.workspace import Workspace

    workspace = Workspace.open(tmp_path / "ws")
    version = "0123456789abcdef" * 4
    folder = workspace.state_dir / "data" / version
    folder.mkdir(parents=True)
    (folder / "version.json").write_text("{}", encoding="utf-8")
    Image.new("RGB", (12, 8), (200, 30, 30)).save(folder / "flagged.png")
    Image.new("RGB", (12, 8), (30, 30, 200)).save(folder / "class_distribution_train.png")
    quarantined = [{"sample_id": f"cat/bad_{i:03d}.png", "kind": "undecodable", "reason": "not a readable image"} for i in range(510)]
    quarantined[0] = {"sample_id": f"cat/{SCRIPT}.png", "kind": "exact_duplicate", "reason": f"same bytes as dog/{ATTRIBUTE}"}
    findings = [
        {"kind": "label_issue", "severity": "warning", "samples": [f"dog/{ATTRIBUTE}.png"], "reason": "r", "label": "dog",
         "suggested": SCRIPT, "score": 0.91234, "rank": 1, "split": "train"},
        {"kind": "outlier", "severity": "warning", "samples": ["cat/odd.png"], "reason": "far from its class", "label": "cat",
         "score": 3.5, "rank": 1, "split": "val"},
        {"kind": "near_duplicate", "severity": "warning", "samples": ["a.png", "b.png", "c.png", "d.png"], "reason": f"hash {SCRIPT}"},
    ]
    report = {
        "data_version": version, "source": "imagefolder", "counts": {"train": 8, "val": 2, "test": 2}, "classes": ["cat", "dog"],
        "summary": {"quarantined_by_kind": {"exact_duplicate": 1, "undecodable": 509},
                    "achieved_split": {"asked": {"train": 0.8, "val": 0.1, "test": 0.1}, "wanted_for_free_samples": {"train": 0.8, "val": 0.1, "test": 0.1},
                                       "judged": True, "skewed": [f"class {SCRIPT!r}: too few units to place"],
                                       "per_class": {"cat": {"samples": 6, "train": 0.6667, "val": 0.1667, "test": 0.1667, "largest_gap": 0.1333, "allowed": 0.1667},
                                                     ATTRIBUTE: {"samples": 6, "train": 1.0, "val": 0.0, "test": 0.0, "largest_gap": 0.2, "allowed": 0.1667}}}},
        "quarantined": quarantined, "findings": findings,
        "findings_by_kind": {"label_issue": 1, "near_duplicate": 1, "outlier": 1},
        "card": {"origin": f"made by hand {SCRIPT}", "license": ""}, "card_warnings": ["data.card.license is missing"], "gallery": "flagged.png",
    }
    (folder / "data_report.json").write_text(json.dumps(report), encoding="utf-8")

    d = views.data_page(workspace, version)
    assert d["quarantine"]["total"] == 510 and len(d["quarantine"]["rows"]) == 500 and d["quarantine"]["more"] == 10
    assert d["gallery"] == f".veritrain/data/{version}/flagged.png"
    assert d["images"] == [f".veritrain/data/{version}/class_distribution_train.png"]

    client = TestClient(create_app(workspace), base_url=BASE)
    page = client.get(f"/data/{version}")
    assert page.status_code == 200
    html = page.text
    _no_raw_hostile_text(html)
    assert f'<h1 id="data-title">data version {version}</h1>' in html
    for table in ("split-table", "quarantine", "quarantine-by-kind", "findings-by-kind", "flagged-table", "findings-table", "card-table"):
        assert f'id="{table}"' in html, table
    split = re.search(r'<table id="split-table">(.*?)</table>', html, re.S).group(1)
    assert "<td>cat</td>" in split and ">0.67<" in split and ">0.17<" in split and 'class="skewed"' in split
    assert "&#34;&gt;&lt;img src=x onerror=alert(1)&gt;" in split  # a hostile class name, escaped
    assert re.search(r'id="split-asked">asked \(train / val / test\): train 0.80, val 0.10, test 0.10<', html)
    quarantine = re.search(r'<table id="quarantine">(.*?)</table>', html, re.S).group(1)
    assert quarantine.count("<tr>") == 501  # the header and the first 500 rows
    assert "cat/&lt;script&gt;alert(1)&lt;/script&gt;.png" in quarantine and "<td>exact_duplicate</td>" in quarantine
    assert "10 more quarantined samples not shown (first 500 of 510)" in html
    by_kind = re.search(r'<table id="findings-by-kind"[^>]*>(.*?)</table>', html, re.S).group(1)
    assert "<th>label_issue</th>" in by_kind and "<th>near_duplicate</th>" in by_kind
    flagged = re.search(r'<table id="flagged-table">(.*?)</table>', html, re.S).group(1)
    assert "<td>dog</td><td>&lt;script&gt;alert(1)&lt;/script&gt;</td><td class=\"num\">0.9123</td>" in flagged
    assert "cat/odd.png" in flagged and "3.5" in flagged
    assert "a.png, b.png, c.png (+1)" in html
    assert "made by hand &lt;script&gt;" in html and "warning: data.card.license is missing" in html
    assert f'<img id="flagged" src="../files/.veritrain/data/{version}/flagged.png"' in html
    assert "[{" not in html.split('<section id="report">')[0]  # no raw JSON rows
    image = client.get(f"/files/.veritrain/data/{version}/flagged.png")
    assert image.status_code == 200 and image.headers["content-type"] == "image/png"


def test_publish_writes_a_compare_page_for_several_runs(site, tmp_path):
    """Two published runs: compare.html (the server's template, data inlined, relative links), linked from index.html."""
    import torch

    from veritrain.orchestration import pipeline
    from veritrain.core.config import load_config
    from veritrain.records.workspace import Workspace

    copied = tmp_path / "ws"
    shutil.copytree(site["workspace"].root, copied, symlinks=True)
    workspace = Workspace.open(copied)
    threads = torch.get_num_threads()
    try:
        resolved = load_config(None, [*FAST_OVERRIDES, "train.epochs=1", "seed=2", f"exp_name=y{SCRIPT}"])
        second = pipeline.run(resolved, workspace, ["veritrain", "run"], hypothesis=f"h2 {ATTRIBUTE}").record["run_id"]
    finally:
        torch.set_num_threads(threads)
    out = tmp_path / "site"
    result = veritrain("publish", site["good"], second, "--out", str(out), "--json", "--workdir", str(copied))
    assert result.code == 0, result.stderr
    assert "compare.html" in result.json()["files"]
    pages = _assert_relative_site(out)
    assert out / "compare.html" in pages
    index = (out / "index.html").read_text(encoding="utf-8")
    assert '<a id="compare-link" href="compare.html">' in index
    html = (out / "compare.html").read_text(encoding="utf-8")
    assert '<table id="compare-metrics">' in html and '<section id="compare-curves" class="card">' in html
    assert html.index('id="compare-change"') < html.index('id="compare-curves"') < html.index('id="compare-metrics"'), "the change leads"
    assert f'href="runs/{site["good"]}.html"' in html and f'href="runs/{second}.html"' in html
    assert 'src="static/charts.js"' in html and 'id="compare-note"' not in html
    data = json.loads(re.search(r'id="curves-data">(.*?)</script>', html, re.S).group(1))
    assert set(data["runs"]) == {site["good"], second} and all(c["epochs"] for c in data["runs"].values())


# ---------------------------------------------------------------------------------------------- one verdict


def _job(client, run_id: str) -> dict:
    """The run's verify job once it is no longer queued or running (read as the button polls it)."""
    for _ in range(JOB_POLLS):
        job = client.get(f"/api/runs/{run_id}/verdict").json()["job"]
        if job is None or job["state"] not in ("queued", "running"):
            return job
        time.sleep(0.05)
    pytest.fail(f"the verify job of {run_id} did not finish: {job}")


def _verify_in_browser(client, run_id: str) -> dict:
    """What the run page's Verify button does: POST with its header, then poll the verdict until the job is done."""
    response = client.post(f"/api/runs/{run_id}/verify", headers=VERIFY_HEADERS)
    assert response.status_code == 202, response.text
    job = _job(client, run_id)
    assert job["state"] == "done", job
    return job["result"]


def _verdict_box(html: str) -> str:
    return re.search(r'<div id="verdict".*?</div>', html, re.S).group(0)


def _check_row(html: str, row: str) -> str:
    return re.search(rf'<tr data-row="{row}" class="check-([a-z]+)">', html).group(1)


@pytest.fixture(scope="module")
def raw_run(tmp_path_factory):
    """One short run on a folder of PNGs, so that verify has raw data to prepare again, in a workspace of its own."""
    from datafixtures import good_imagefolder
    from veritrain.records.workspace import Workspace

    root = tmp_path_factory.mktemp("raw")
    images = good_imagefolder(root / "images", per_class=15)  # 24 / 2 / 4 by the split's hash: fewer leave val empty
    config = root / "images.yaml"
    config.write_text(f"data:\n  source: imagefolder\n  root: {images}\n", encoding="utf-8")
    outcome = in_process_run(root / "ws", ["train.epochs=1", "model.name=mlp", "model.hidden=[8]"], config)
    assert outcome.record["status"] == "completed", outcome.record.get("error")
    return {"workspace": Workspace.open(root / "ws"), "run": outcome.record["run_id"], "images": images, "seal": outcome.seal}


def test_verify_is_a_post_from_this_page_only(raw_run):
    """A GET of the verify URL is 405 and starts nothing; a POST without the button's header, or from another
    origin or site, is 403 and starts nothing (no job, no verdict kept)."""
    from veritrain.records import verdicts
    from veritrain.web.server import create_app

    workspace, run = raw_run["workspace"], raw_run["run"]
    kept = verdicts.path_of(workspace.state_dir, run)
    kept.unlink(missing_ok=True)
    client = TestClient(create_app(workspace), base_url=BASE)
    assert client.get(f"/api/runs/{run}/verify").status_code == 405
    refused = [client.post(f"/api/runs/{run}/verify"),
               client.post(f"/api/runs/{run}/verify", headers={"X-Veritrain": "yes"}),
               client.post(f"/api/runs/{run}/verify", headers={**VERIFY_HEADERS, "Origin": "http://evil.example"}),
               client.post(f"/api/runs/{run}/verify", headers={**VERIFY_HEADERS, "Origin": "null"}),
               client.post(f"/api/runs/{run}/verify", headers={**VERIFY_HEADERS, "Origin": "http://127.0.0.1:9999"}),
               client.post(f"/api/runs/{run}/verify", headers={"X-Veritrain": "verify", "Sec-Fetch-Site": "cross-site"})]
    assert [r.status_code for r in refused] == [403] * len(refused)
    assert all(r.json()["error"].startswith("refused: ") for r in refused)
    assert client.post(f"/api/runs/{run}/verify", headers={"X-Veritrain": "verify", "Host": "evil.example:8765"}).status_code == 400
    assert client.get(f"/api/runs/{run}/verdict").json() == {"run_id": run, "verdict": None, "job": None}
    assert not kept.exists()
    assert client.post("/api/runs/20990101-000000-000-abcdef/verify", headers=VERIFY_HEADERS).status_code == 404


def test_a_second_post_joins_the_running_verify_off_the_event_loop(site, monkeypatch):
    """While one verify runs (held here in its worker thread), pages still answer, a second POST for the run joins
    its job (one verify), and the job's latest progress is served."""
    from veritrain.trust import verify
    from veritrain.web.server import create_app

    release, calls = threading.Event(), []

    def held(run_dir, state_dir, expect=None, strict=False, progress=None):
        calls.append((run_dir.name, expect, strict))
        progress("files", 3, 7)
        release.wait(120)
        return {"ok": True, "seal": "s", "problems": [], "drift": [], "verified_at": "now"}

    monkeypatch.setattr(verify, "verify_and_keep", held)
    client = TestClient(create_app(site["workspace"]), base_url=BASE)
    first = client.post(f"/api/runs/{site['good']}/verify", headers=VERIFY_HEADERS).json()
    try:
        for _ in range(JOB_POLLS):  # the worker has taken the job and told its progress
            job = client.get(f"/api/runs/{site['good']}/verdict").json()["job"]
            if job["stage"] == "files":
                break
            time.sleep(0.05)
        assert job["state"] == "running" and (job["done"], job["total"]) == (3, 7)
        assert client.get("/").status_code == 200  # the event loop is free while the verify runs
        second = client.post(f"/api/runs/{site['good']}/verify", headers=VERIFY_HEADERS).json()
        assert first["started"] is True and second["started"] is False
    finally:
        release.set()
    assert _job(client, site["good"])["result"]["ok"] is True
    assert calls == [(site["good"], None, False)]  # one verify, with the CLI's defaults


def test_every_view_says_a_run_with_one_changed_pixel_does_not_verify(raw_run):
    """One raw pixel of the run's data changed: `veritrain verify` (exit 1), the Verify button, `check` and
    `publish` all say the run does not verify, with data_changed; the run page shows that verdict."""
    from PIL import Image

    from veritrain.records import verdicts
    from veritrain.web.server import create_app

    workspace, run = raw_run["workspace"], raw_run["run"]
    workdir = str(workspace.root)
    image = sorted(raw_run["images"].rglob("*.png"))[0]
    original = image.read_bytes()
    client = TestClient(create_app(workspace), base_url=BASE)
    try:
        with Image.open(image) as opened:
            picture = opened.convert("RGB")
        red, green, blue = picture.getpixel((0, 0))
        picture.putpixel((0, 0), ((red + 1) % 256, green, blue))
        picture.save(image, format="PNG")

        cli = veritrain("verify", run, "--json", "--workdir", workdir)
        assert cli.code == 1 and cli.stderr.strip().splitlines()[-1].startswith(f"error: verify {run}: ")
        assert "data_changed" in [p["kind"] for p in cli.json()["problems"]]
        kept = verdicts.latest(workspace.runs_dir / run, workspace.state_dir)
        assert kept["ok"] is False and kept["stale"] is False and "data_changed" in [p["kind"] for p in kept["problems"]]

        button = _verify_in_browser(client, run)
        assert button["ok"] is False and "data_changed" in [p["kind"] for p in button["problems"]]
        assert _job(client, run)["stage"] == "raw data"  # the last stage it told: the raw data was prepared again

        check = veritrain("check", run, "--json", "--workdir", workdir)
        assert check.code == 1
        row = next(i for i in check.json()["items"] if i["id"] == "run_verifies")
        assert row["status"] == "fail" and "data_changed" in row["detail"]

        published = veritrain("publish", run, "--out", str(raw_run["images"].parent / "site"), "--workdir", workdir)
        assert published.code == 1 and "does not verify" in published.stderr and "data_changed" in published.stderr

        html = client.get(f"/runs/{run}").text
        box = _verdict_box(html)
        assert 'data-state="failed"' in box and "does not verify at <time>" in box and "data_changed" in box
        assert _check_row(html, "run_verifies") == "fail"
    finally:
        image.write_bytes(original)
    assert _verify_in_browser(client, run)["ok"] is True  # the pixel restored, the run verifies again


def test_the_run_page_shows_only_a_kept_verdict_and_marks_it_stale(raw_run):
    """No verdict kept: the page says "not verified yet" and its checklist does not pass run_verifies. After the
    Verify button, it shows that verdict with its time and seal; once a file of the run (or of its raw data)
    changes, the verdict is stale and the checklist no longer passes on it."""
    from veritrain.records import verdicts
    from veritrain.trust.check import PASSING
    from veritrain.web.server import create_app

    workspace, run = raw_run["workspace"], raw_run["run"]
    run_dir = workspace.runs_dir / run
    verdicts.path_of(workspace.state_dir, run).unlink(missing_ok=True)
    client = TestClient(create_app(workspace), base_url=BASE)

    html = client.get(f"/runs/{run}").text
    box = _verdict_box(html)
    assert 'data-state="none"' in box and "not verified yet" in box
    assert "verified at" not in box and "verified: seal" not in html and "<time>" not in box
    assert _check_row(html, "run_verifies") == "unknown" and "unknown" not in PASSING
    assert "not verified yet" in re.search(r'<tr data-row="run_verifies".*?</tr>', html, re.S).group(0)
    assert client.get(f"/api/runs/{run}/verdict").json()["verdict"] is None  # reading the page verified nothing

    assert _verify_in_browser(client, run)["ok"] is True
    shown = client.get(f"/api/runs/{run}/verdict").json()["verdict"]
    assert shown["ok"] is True and shown["stale"] is False and shown["seal"] == raw_run["seal"] and shown["verified_at"]
    html = client.get(f"/runs/{run}").text
    box = _verdict_box(html)
    assert 'data-state="ok"' in box and f'verified at <time>{shown["verified_at"]}</time> for seal <code id="verdict-seal">{raw_run["seal"]}</code>' in box
    assert _check_row(html, "run_verifies") == "pass"

    log = run_dir / "train.log"
    original = log.read_bytes()
    try:
        log.write_bytes(original[:-1] + (b"X" if original[-1:] != b"X" else b"Y"))  # the same size: only verify can tell
        shown = client.get(f"/api/runs/{run}/verdict").json()["verdict"]
        assert shown["stale"] is True and shown["ok"] is True
        assert shown["stale_reasons"] == ["1 file(s) of the run changed since: train.log"]
        html = client.get(f"/runs/{run}").text
        box = _verdict_box(html)
        assert 'data-state="stale"' in box and "stale: 1 file(s) of the run changed since: train.log" in box
        assert _check_row(html, "run_verifies") == "unknown"
        log.write_bytes(original + b"one more line\n")  # another size: the page sees it, and says what verify would
        html = client.get(f"/runs/{run}").text
        box = _verdict_box(html)
        assert 'data-state="failed"' in box and "does not verify" in box and "changed: train.log (size differs" in box
        assert _check_row(html, "run_verifies") == "fail"
    finally:
        log.write_bytes(original)
    image = sorted(raw_run["images"].rglob("*.png"))[-1]
    before = image.stat()
    os.utime(image, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))  # touched: verify would prepare it again
    shown = client.get(f"/api/runs/{run}/verdict").json()["verdict"]
    assert shown["stale"] is True and "a file of the run's raw data changed since" in shown["stale_reasons"]


def test_runs_of_an_outside_checkpoint_are_marked(raw_run, tmp_path):
    """An eval or export run of a checkpoint from outside is shown as not from the audited training, in the runs
    table and on its page; a training run is not."""
    from veritrain.web.server import create_app
    from veritrain.records.workspace import Workspace

    workspace = Workspace.open(tmp_path / "ws")
    parent = raw_run["run"]
    child = parent[:-6] + "eeeeee"
    shutil.copytree(raw_run["workspace"].runs_dir / parent, workspace.runs_dir / parent)
    shutil.copytree(raw_run["workspace"].runs_dir / parent, workspace.runs_dir / child)
    record = json.loads((workspace.runs_dir / child / "record.json").read_text(encoding="utf-8"))
    record.update(run_id=child, kind="eval", parent=parent)
    (workspace.runs_dir / child / "record.json").write_text(json.dumps(record), encoding="utf-8")
    client = TestClient(create_app(workspace), base_url=BASE)
    index = client.get("/").text
    rows = {run_id: row for run_id, row in re.findall(r'<tr data-run-id="([^"]+)"[^>]*>(.*?)</tr>', index, re.S)}
    assert "not from the audited training" in rows[child] and "not from the audited training" not in rows[parent]
    page = client.get(f"/runs/{child}").text
    kind = re.search(r'<td id="kind">(.*?)</td>', page, re.S).group(1)
    assert kind.startswith("eval <span class=\"badge outside-checkpoint\">not from the audited training</span>")
    assert f'href="../runs/{parent}"' in kind
    assert "not from the audited training" not in client.get(f"/runs/{parent}").text


def test_the_run_page_and_the_verify_button_say_an_amend_is_pending(site):
    """While an amend of a run is unfinished, the page says what `veritrain verify` says, and the button's verdict
    fails as the CLI does: the journal is a workspace file, never taken on trust."""
    from veritrain.records.journal import folder_of
    from veritrain.web.server import create_app

    workspace, run_id = site["workspace"], site["good"]
    journal = folder_of(workspace.state_dir, run_id)
    (journal / "new").mkdir(parents=True)  # staged, not committed: verify judges the run as it is
    try:
        client = TestClient(create_app(workspace), base_url=BASE)
        html = client.get(f"/runs/{run_id}").text
        assert f"an amend of this run is pending (.veritrain/journal/{run_id}/)" in html
        result = _verify_in_browser(client, run_id)
        assert not result["ok"] and result["interrupted_amend"].startswith("an amend of this run is pending")
    finally:
        shutil.rmtree(journal)
    assert "interrupted-amend" not in TestClient(create_app(workspace), base_url=BASE).get(f"/runs/{run_id}").text


# ---------------------------------------------------------------- the runs table's columns, live updates, damaged runs


def _copies(site, tmp_path, changes: list[dict]) -> tuple:
    """A workspace of copies of the good run, the i-th with `changes[i]` ({"config": {dotted key: value}, "metrics": {...},
    "exp_name": ..., "status": ...}) applied to its record; returns (workspace, run ids)."""
    from veritrain.records.workspace import Workspace

    workspace = Workspace.open(tmp_path / "copies")
    good = site["workspace"].runs_dir / site["good"]
    ids = []
    for index, change in enumerate(changes):
        run_id = site["good"][:-6] + f"{index:06x}"
        shutil.copytree(good, workspace.runs_dir / run_id)
        record = json.loads((good / "record.json").read_text(encoding="utf-8"))
        record["run_id"] = run_id
        record["started_at"] = f"2026-01-01T00:00:{index:02d}.000+00:00"
        for key, value in (change.get("config") or {}).items():
            *parents, leaf = key.split(".")
            node = record["config"]
            for part in parents:
                node = node[part]
            node[leaf] = value
        for key, value in (change.get("metrics") or {}).items():
            split, name = key.split(".")
            record["metrics"][split][name] = value
        record.update({k: v for k, v in change.items() if k not in ("config", "metrics")})
        data = json.dumps(record).encode()
        (workspace.runs_dir / run_id / "record.json").write_bytes(data)
        (workspace.runs_dir / run_id / "record.sha256").write_text(hashlib.sha256(data).hexdigest() + "\n")
        ids.append(run_id)
    return workspace, ids


def _significant_digits(text: str) -> int:
    """How many significant digits a number as shown has: 0.06667 has 4."""
    return len(text.strip().lstrip("-").split("e")[0].replace(".", "").lstrip("0"))


def _differing(workspace, ids: list[str]) -> list[str]:
    """The oracle: config keys whose value is not the same in every listed run, from the whole configs."""
    from veritrain.records.experiments import flatten

    configs = [flatten(json.loads((workspace.runs_dir / r / "record.json").read_text())["config"]) for r in ids]
    keys = set().union(*configs)
    return sorted(k for k in keys if k != "exp_name" and len({json.dumps(c.get(k, "<absent>"), sort_keys=True) for c in configs}) > 1)


def test_parameter_columns_are_exactly_the_config_keys_that_differ(site, tmp_path):
    from veritrain.web import views
    from veritrain.web.server import create_app

    workspace, ids = _copies(site, tmp_path, [{}, {"config": {"optim.lr": 0.01}}, {"config": {"model.hidden": [64]}},
                                              {"config": {"optim.lr": 0.01, "seed": 3}}, {}, {"config": {"exp_name": "other"}, "exp_name": "other"}])
    table = views.runs_table(workspace, {})
    assert table["param_keys"] == _differing(workspace, ids) == ["model.hidden", "optim.lr", "seed"]
    by_id = {r["run_id"]: r for r in table["rows"]}
    assert by_id[ids[1]]["params"] == {"model.hidden": [32], "optim.lr": 0.01, "seed": 0}
    assert by_id[ids[0]]["params"]["optim.lr"] == json.loads((workspace.runs_dir / ids[0] / "record.json").read_text())["config"]["optim"]["lr"]
    # the keys of the runs listed, all pages: two runs that differ only in their experiment name have none
    only_two = views.runs_table(workspace, {"q": ids[0][-6:]}, only=[ids[0], ids[4], ids[5]])
    assert only_two["param_keys"] == _differing(workspace, [ids[0], ids[4], ids[5]]) == []
    assert views.runs_table(workspace, {"exp_name": "other"})["param_keys"] == []
    assert views.runs_table(workspace, {}, page_size=1)["param_keys"] == table["param_keys"]
    rows = views.runs_table(workspace, {"sort": "-optim.lr"})["rows"]
    ordered = [r["params"]["optim.lr"] for r in rows]
    assert ordered == sorted(ordered)
    html = TestClient(create_app(workspace), base_url=BASE).get("/").text
    assert re.findall(r'<th data-kind="param" class="param"><a class="sort" data-key="([^"]+)"', html) == table["param_keys"]
    assert f'<td class="param" data-param="optim.lr" title="0.01">0.01</td>' in html


def test_the_compare_page_lists_only_the_config_keys_that_differ(site, tmp_path):
    """A run of a user's model (`model.target`) against one of a built-in model: the built-in models' keys
    (model.widths, model.hidden, model.layers, …) are compared only among the runs that use them, so the config diff
    lists model.target alone, by the rule of the runs table's parameter columns; the experiment name, which the table
    shows in a column of its own, is a row of the diff."""
    from veritrain.web import views
    from veritrain.web.server import create_app

    workspace, ids = _copies(site, tmp_path, [{}, {"config": {"model.target": "mypkg.models:build"}},
                                              {"config": {"model.name": "cnn", "optim.lr": 0.01}},
                                              {"config": {"exp_name": "other"}, "exp_name": "other"}])

    def keys(run_ids: list[str]) -> list[str]:
        return [row["key"] for row in views.compare_page(workspace, run_ids)["config"]]

    # the mlp's own settings (name, hidden) tell it from no run that uses them: only model.target is listed
    assert views.compare_page(workspace, ids[:2])["config"] == [{"key": "model.target", "values": [None, "mypkg.models:build"]}]
    assert keys(ids[:2]) == views.runs_table(workspace, {}, only=ids[:2])["param_keys"]
    assert keys(ids[1:3]) == ["model.target", "optim.lr"]
    assert keys(ids[1:3]) == views.runs_table(workspace, {}, only=ids[1:3])["param_keys"]
    assert keys([ids[0], ids[3]]) == ["exp_name"]
    html = TestClient(create_app(workspace), base_url=BASE).get(f"/compare?runs={ids[0]},{ids[1]}").text
    assert "<tr><td>model.target</td>" in html
    assert "model.widths" not in html and "model.hidden" not in html and "model.layers" not in html


def test_metric_columns_come_from_the_url_and_groups_show_mean_and_sd(site, tmp_path):
    import statistics

    from veritrain.web import views
    from veritrain.web.server import create_app

    accuracies = [0.5, 0.7, 0.9, 0.4, 0.6]
    groups = ["a", "a", "a", "b", "b"]
    workspace, ids = _copies(site, tmp_path, [{"metrics": {"test.accuracy": acc, "test.ece": 0.1 * i}, "exp_name": g, "config": {"exp_name": g}}
                                              for i, (acc, g) in enumerate(zip(accuracies, groups))])
    client = TestClient(create_app(workspace), base_url=BASE)
    html = client.get("/?cols=test.ece,test.accuracy").text
    assert re.findall(r'<th data-kind="metric" class="num"><a class="sort" data-key="([^"]+)"', html) == ["test.ece", "test.accuracy"]
    assert 'value="test.ece,test.accuracy"' in html  # kept in the form, so the next filter keeps them
    assert "?cols=test.ece%2Ctest.accuracy&amp;sort=test.accuracy" in html  # and in every sort link
    for bad in ("test.accuracy;drop", "accuracy", ",".join(f"test.m{i}" for i in range(20))):
        assert client.get("/?" + urlencode({"cols": bad})).status_code == 400
    table = views.runs_table(workspace, {"group": "exp_name", "cols": "test.accuracy"})
    found = {g["name"]: g for g in table["groups"]}
    assert set(found) == {"a", "b"} and found["a"]["runs"] == 3 and found["b"]["completed"] == 2
    stats = found["a"]["stats"]["test.accuracy"]
    assert stats["mean"] == pytest.approx(statistics.fmean(accuracies[:3])) and stats["sd"] == pytest.approx(statistics.stdev(accuracies[:3]))
    assert found["b"]["stats"]["test.accuracy"]["n"] == 2
    page = client.get("/?group=exp_name&cols=test.accuracy").text
    assert '<table id="groups-table">' in page and "0.7 ± 0.2" in page
    assert client.get("/?group=seed").status_code == 400


def test_numbers_show_four_significant_digits_and_the_api_keeps_them_raw(client, site):
    from veritrain.web import significant

    assert [significant(v) for v in (0.9444444444444444, 12345.678, 1.5e-05, 3, 0.1, 2.0, -0.000123456)] == \
        ["0.9444", "12350", "1.5e-05", "3", "0.1", "2", "-0.0001235"]
    html = client.get(f"/runs/{site['good']}").text
    per_class = re.search(r'<table id="per-class".*?</table>', html, re.S).group(0)
    cells = re.findall(r'<td class="num" title="[^"]*">([^<]*)</td>', per_class)
    assert cells and all(_significant_digits(c) <= 4 for c in cells if "." in c), cells[:5]
    record = json.loads((site["workspace"].runs_dir / site["good"] / "record.json").read_text())
    api = client.get(f"/api/runs/{site['good']}").json()
    assert api["metrics"]["test"]["accuracy"] == record["metrics"]["test"]["accuracy"]  # not rounded
    overview = re.search(r'<table id="headline".*?</table>', html, re.S).group(0)
    assert f"<strong>{significant(record['metrics']['test']['accuracy'])}</strong>" in overview


def test_the_live_api_gives_new_lines_only_and_says_when_a_run_changed_or_is_gone(site, tmp_path):
    from veritrain.web import views

    workspace, (run,) = _copies(site, tmp_path, [{"status": "running", "ended_at": None}])
    run_dir = workspace.runs_dir / run
    first = views.curves(run_dir)
    stamp = views.live_stamp(run_dir)
    live = views.run_live(workspace, run, first["offsets"]["metrics"], first["offsets"]["steps"], stamp)
    assert live["epochs"]["epochs"] == [] and live["steps"]["steps"] == [] and "state" not in live  # nothing new, nothing read
    with open(run_dir / "steps.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({"step": 7, "epoch": 1, "loss": 0.5, "lr": 0.1, "grad_norm": 1.5}) + "\n")
        f.write('{"step": 8, "loss"')  # a line being written is left for the next read
    live = views.run_live(workspace, run, live["offsets"]["metrics"], live["offsets"]["steps"], stamp)
    assert live["steps"]["steps"] == [7] and live["steps"]["step_series"]["grad_norm"] == [1.5]
    with open(run_dir / "steps.jsonl", "a", encoding="utf-8") as f:
        f.write(': 0.4}\n')
    again = views.run_live(workspace, run, live["offsets"]["metrics"], live["offsets"]["steps"], stamp)
    assert again["steps"]["steps"] == [8] and again["reset"]["steps"] is False
    (run_dir / "steps.jsonl").write_text(json.dumps({"step": 1, "loss": 2.0}) + "\n")  # a resume rewound the log
    rewound = views.run_live(workspace, run, again["offsets"]["metrics"], again["offsets"]["steps"], stamp)
    assert rewound["reset"]["steps"] is True and rewound["steps"]["steps"] == [1]

    record = json.loads((run_dir / "record.json").read_text())
    record["status"] = "completed"
    data = json.dumps(record).encode()
    (run_dir / "record.json").write_bytes(data)
    (run_dir / "record.sha256").write_text(hashlib.sha256(data).hexdigest() + "\n")
    finished = views.run_live(workspace, run, 0, 0, stamp)
    assert finished["state"] == "completed" and finished["seal"] == hashlib.sha256(data).hexdigest()
    (run_dir / "record.sha256").write_text("0" * 64 + "\n")  # re-sealed (here: a seal that no longer matches)
    resealed = views.run_live(workspace, run, 0, 0, finished["stamp"])
    assert resealed["seal"] == "0" * 64  # the page sees the re-seal: the seal file is part of what it watches
    token = views.table_live(workspace, [run])["token"]
    shutil.rmtree(run_dir)
    assert views.run_live(workspace, run, 0, 0, stamp) == {"state": "deleted", "run_id": run}
    assert views.table_live(workspace, [run])["token"] != token
    client = TestClient(__import__("veritrain.web.server", fromlist=["create_app"]).create_app(workspace), base_url=BASE)
    assert client.get(f"/api/runs/{run}/live?metrics=x").status_code == 400
    assert client.get(f"/api/runs/{run}/live").json()["state"] == "deleted"


def test_a_run_with_damaged_files_says_it_does_not_verify_and_never_500(site, tmp_path):
    from veritrain.web.server import create_app

    workspace, ids = _copies(site, tmp_path, [{}, {}, {}, {}])
    runs = workspace.runs_dir
    (runs / ids[0] / "record.json").write_bytes(b"{not json")
    (runs / ids[1] / "eval" / "test" / "per_class.csv").write_bytes(b"\x00\xff binary \x89PNG")
    (runs / ids[2] / "metrics.jsonl").unlink()
    (runs / ids[3] / "record.json").write_text(json.dumps({"run_id": ids[3], "status": ["not", "a", "status"]}))
    client = TestClient(create_app(workspace), base_url=BASE, raise_server_exceptions=False)
    for run_id, problem in zip(ids, ("not a valid record", "changed: eval/test/per_class.csv (size differs", "missing: metrics.jsonl",
                                     "not a valid record")):
        page = client.get(f"/runs/{run_id}")
        assert page.status_code == 200, (run_id, page.status_code)
        box = _verdict_box(page.text)
        assert 'data-state="failed"' in box and "does not verify" in box and problem in page.text, (problem, box)
        assert client.get(f"/api/runs/{run_id}/live").status_code == 200
    assert client.get("/").status_code == 200 and client.get("/?group=exp_name").status_code == 200


def test_an_index_of_the_earlier_layout_is_made_again(site, tmp_path):
    import sqlite3

    from veritrain.records import registry

    workspace, ids = _copies(site, tmp_path, [{}])
    workspace.state_dir.mkdir(parents=True, exist_ok=True)
    old = sqlite3.connect(workspace.state_dir / "registry.sqlite")
    old.execute("CREATE TABLE runs (run_id TEXT PRIMARY KEY, exp_name TEXT, stamp TEXT)")
    old.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
    old.execute("INSERT INTO meta VALUES ('schema', '1')")
    old.execute("INSERT INTO runs VALUES ('x', 'y', 'z')")
    old.commit()
    old.close()
    rows = registry.query(workspace.state_dir, workspace.runs_dir)
    assert [r["run_id"] for r in rows] == ids and rows[0]["world_size"] == 1 and "params" not in rows[0]


def test_a_sweep_page_shows_the_seed_spread_of_repeated_trials(site, tmp_path):
    """A sweep with --repeat 3: each trial's val metric is the mean over its seeds, the page shows that mean with the
    sd and every seed's value, and only the best trial's test result, labelled as not used for selection."""
    from veritrain.orchestration.repeats import spread
    from veritrain.web.server import create_app

    workspace, ids = _copies(site, tmp_path, [{} for _ in range(6)])
    values = {0: [0.80, 0.82, 0.78], 1: [0.90, 0.93, 0.87]}
    trials = [{"index": i, "change": {"optim.lr": lr}, "hypothesis": None, "config_hash": "0" * 64, "status": "completed",
               "run_ids": ids[3 * i:3 * i + 3], "metrics": {"accuracy": sum(values[i]) / 3}, "spread": {"accuracy": spread(values[i], (0.0, 1.0))},
               "deltas": {}, "group": f"sweep-s1-{i}", "data_version": None, "error": None} for i, lr in ((0, 0.1), (1, 0.01))]
    summary = {"sweep_version": 1, "id": "s1", "status": "completed", "exp_name": "digits", "repeat": 3, "split": "val",
               "selection": {"split": "val", "metric": "accuracy", "mode": "max", "given": True, "report_split": "test"},
               "headline": {"metric": "accuracy", "mode": "max"}, "parent": {"run_ids": [], "status": "skipped", "metrics": {}},
               "trials": trials, "best": {"trial": 1, "change": {"optim.lr": 0.01}, "split": "val", "metric": "accuracy", "mode": "max",
                                          "value": trials[1]["metrics"]["accuracy"], "delta": None, "run_ids": trials[1]["run_ids"],
                                          "test": {"split": "test", "used_for_selection": False, "label": "not used for selection",
                                                   "metrics": {"accuracy": 0.88}}}, "counts": {"trials": 2, "completed": 2}}
    folder = workspace.state_dir / "sweeps" / "s1"
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps(summary))
    html = TestClient(create_app(workspace), base_url=BASE).get("/sweeps/s1").text
    rows = dict(re.findall(r'<tr data-trial="(\d)"(.*?)</tr>', html, re.S))
    assert "sd 0.02 over 3 seeds (0.8, 0.82, 0.78)" in rows["0"] and "sd 0.03 over 3 seeds (0.9, 0.93, 0.87)" in rows["1"]
    assert 'class="best' in rows["1"] and "0.88" in rows["1"] and "0.88" not in rows["0"]  # only the best trial's test result
    assert "3 seeds per trial" in html and "not used for selection" in html and 'id="sweep-seal"' not in html


def test_the_run_page_shows_the_format_and_the_signer_verify_found(site):
    """The Trust section renders the kept verdict's record format and signer, as `veritrain verify` prints them."""
    from veritrain.trust.verify import verify_and_keep
    from veritrain.web.server import create_app

    workspace, run_id = site["workspace"], site["good"]
    verify_and_keep(workspace.runs_dir / run_id, workspace.state_dir)
    html = TestClient(create_app(workspace), base_url=BASE).get(f"/runs/{run_id}").text
    assert "<th>format</th><td class=\"trust-line\">judged under record format 2 (declared 2; this veritrain writes 2)" in html
    assert "<th>signer</th><td class=\"trust-line\">none (the provenance statement is unsigned)" in html
