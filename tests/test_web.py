"""The run browser (`veritrain ui`) through Starlette's TestClient, and `veritrain publish`: the pages keep
the DOM the browser tests use, hostile text is escaped, nothing outside runs/ and data versions is
served, requests for another Host are refused, and no page or verify request writes to a run."""

from __future__ import annotations

import csv
import hashlib
import json
import re
import shutil
import warnings
from pathlib import Path
from urllib.parse import urlencode

import pytest

from conftest import FAST_OVERRIDES, veritrain

pytest.importorskip("starlette")
pytest.importorskip("jinja2")
with warnings.catch_warnings():  # Starlette's TestClient on httpx warns that httpx2 is its successor
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient
SCRIPT = "<script>alert(1)</script>"
ATTRIBUTE = '"><img src=x onerror=alert(1)>'
BASE = "http://127.0.0.1:8765"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A workspace with one real run (hostile hypothesis, experiment name and notes) and a forged copy of it
    (hostile class names, an edited per-class table so it no longer verifies, a link to a file outside)."""
    import torch

    from veritrain import pipeline
    from veritrain.config import load_config
    from veritrain.workspace import Workspace

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
    assert '<table id="runs-table">' in html and '<form id="runs-filter" method="get"' in html
    for name in ("status", "exp_name", "kind", "data_version", "metric", "min", "max", "q"):
        assert f'name="{name}"' in html
    assert re.search(r'<p id="runs-count">2 runs', html)
    for run_id in (site["good"], site["forged"]):
        assert f'<tr data-run-id="{run_id}">' in html
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
    assert api["total"] == 2 and api["page"] == 2 and api["rows"] == []  # 100 a page: page 2 is empty


def test_pagination_links(site):
    from veritrain.web import views
    from veritrain.web.server import create_app

    original = views.runs_table
    views.runs_table = lambda workspace, params, page_size=1, only=None: original(workspace, params, page_size=1)
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
    assert f'<code id="seal">{seal}</code>' in html
    for needle in ('<section id="curves">', '<div class="chart" data-chart="loss"></div>', '<div class="chart" data-chart="accuracy"></div>',
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
    assert '<table id="compare-metrics">' in html and '<table id="compare-config">' in html and '<section id="compare-curves">' in html
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
    good = client.get(f"/api/runs/{site['good']}/verify").json()
    forged = client.get(f"/api/runs/{site['forged']}/verify").json()
    assert good["ok"] is True and forged["ok"] is False
    assert client.get("/api/runs/..%2F..%2Fx/verify").status_code == 404
    assert _tree_hashes(site["workspace"]) == before


def _assert_relative_site(out: Path) -> list[Path]:
    """Every page of a published site: no hostile text, every link relative and every linked file present."""
    pages = sorted(out.rglob("*.html"))
    for page in pages:
        html = page.read_text(encoding="utf-8")
        _no_raw_hostile_text(html)
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
    assert f"veritrain import {site['good']}.tar.gz" in run_html
    elsewhere = tmp_path / "elsewhere"
    imported = veritrain("import", str(out / "runs" / f"{site['good']}.tar.gz"), "--workdir", str(elsewhere))
    assert imported.code == 0, imported.stderr
    assert veritrain("verify", site["good"], "--expect", seal, "--workdir", str(elsewhere)).code == 0


def test_data_page_tables_gallery_and_limits(tmp_path):
    """A data version's page from its data_report.json: achieved split, quarantine, findings by kind, label issues
    and outliers with the gallery, the card; hostile text escaped, long tables cut at 500 rows."""
    from PIL import Image

    from veritrain.web import views
    from veritrain.web.server import create_app
    from veritrain.workspace import Workspace

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

    from veritrain import pipeline
    from veritrain.config import load_config
    from veritrain.workspace import Workspace

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
    assert '<table id="compare-metrics">' in html and '<table id="compare-config">' in html and '<section id="compare-curves">' in html
    assert f'href="runs/{site["good"]}.html"' in html and f'href="runs/{second}.html"' in html
    assert 'src="static/charts.js"' in html and 'id="compare-note"' not in html
    data = json.loads(re.search(r'id="curves-data">(.*?)</script>', html, re.S).group(1))
    assert set(data["runs"]) == {site["good"], second} and all(c["epochs"] for c in data["runs"].values())
