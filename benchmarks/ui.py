"""`veritrain ui` over 10,000 runs in headless Chromium, and `veritrain publish` of 100 runs.

Makes one real run (tiny mlp on digits), copies its record.json to 10,000 run folders with new run
ids, metrics, statuses, experiment names, seeds and one of four learning rates (each sealed with its
record.sha256; no checkpoints), so the runs table has parameter columns (optim.lr, seed), and one real run
of 20,160 optimizer steps with a steps.jsonl line for each. Starts `veritrain ui` on them and times, in
Debian's /usr/bin/chromium through Playwright at 1400 × 1000: the first paint of the runs table
(first-contentful-paint, and until a `#runs-table tr[data-run-id]` row is visible, its parameter columns
with it), a sort by test.accuracy and a filter (until the table has changed), the real run's page (until
its curves are drawn) and the long run's page (until its per-step loss chart holds all 20,160 points).
Then `veritrain publish` of a workspace of 100 runs (copies of the real run folder, checkpoints included,
so each verifies), whole process.

    .venv/bin/python benchmarks/ui.py [--runs 10000] [--publish-runs 100] [--repeat 3]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
REAL_RUN = ["--set", "train.epochs=2", "--set", "model.name=mlp", "--set", "model.hidden=[16]", "--no-smoke"]
# 1,437 train samples / 8 = 180 steps an epoch, × 112 epochs = 20,160 steps, each a line of steps.jsonl
LONG_RUN = ["--set", "train.epochs=112", "--set", "train.batch_size=8", "--set", "model.name=mlp", "--set", "model.hidden=[16]",
            "--set", "logging.every_steps=1", "--set", "eval.baselines=false", "--set", "export.formats=[safetensors]",
            "--set", "exp_name=long", "--no-smoke"]
LEARNING_RATES = (0.1, 0.03, 0.01, 0.003)


def veritrain(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "veritrain", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"veritrain {args[0]} exited with {proc.returncode}:\n{proc.stderr[-2000:]}")
    return proc


def make_real_run(workdir: Path, args: list[str] = REAL_RUN) -> Path:
    before = set((workdir / "runs").iterdir()) if (workdir / "runs").is_dir() else set()
    veritrain("run", *args, "--workdir", str(workdir))
    return next(iter(set((workdir / "runs").iterdir()) - before))


def copy_runs(template: Path, runs_dir: Path, count: int, with_files: bool = False) -> None:
    """`count` run folders holding a copy of template's record with a new id, metrics and exp_name;
    with_files also copies every file of the run, so that each copy verifies (publish needs that)."""
    record = json.loads((template / "record.json").read_text())
    for i in range(count):
        run_id = f"20250101-{i // 3600 % 24:02d}{i // 60 % 60:02d}{i % 60:02d}-{i % 1000:03d}-{i:06x}"
        run_dir = runs_dir / run_id
        if with_files:
            shutil.copytree(template, run_dir)
            # the copy's record differs from the one the provenance statement is about: it gets a new, unsigned one below,
            # as a re-seal writes it (a record of format 1 must name its statement)
            record["provenance"] = {"file": "provenance.intoto.jsonl", "key_fingerprint": None}
        else:
            run_dir.mkdir(parents=True)
        # in the big table every 11th run failed; a published run is a completed one (publish leaves the others out)
        record.update(run_id=run_id, exp_name=f"exp{i % 20}", seed=i, status="completed" if with_files or i % 11 else "failed",
                      started_at=f"2025-01-01T{i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}.000+00:00")
        if not with_files:  # configs that differ, as a sweep's do: the table shows them as parameter columns
            record["config"] = {**record["config"], "seed": i, "optim": {**record["config"]["optim"], "lr": LEARNING_RATES[i % 4]}}
        test = record["metrics"]["test"]
        test["accuracy"] = (i * 7919 % 10_000) / 10_000
        test["macro_f1"] = test["f1_macro"] = test["accuracy"] * 0.97
        test["log_loss"] = test["loss"] = 2.5 - 2 * test["accuracy"]
        data = json.dumps(record, indent=2, sort_keys=True).encode()
        if with_files:
            from veritrain.records.record import statement_bytes

            (run_dir / "provenance.intoto.jsonl").write_bytes(statement_bytes(record, hashlib.sha256(data).hexdigest(), run_dir, None))
        (run_dir / "record.json").write_bytes(data)
        (run_dir / "record.sha256").write_text(hashlib.sha256(data).hexdigest() + "\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(workdir: Path) -> tuple[subprocess.Popen, str, float]:
    port = free_port()
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "veritrain", "ui", "--port", str(port), "--workdir", str(workdir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"veritrain ui exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(base + "/", timeout=60):
                return proc, base, time.perf_counter() - started
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.1)


def row_ids(page) -> list[str]:
    return page.locator("#runs-table tr[data-run-id]").evaluate_all("rows => rows.map(r => r.getAttribute('data-run-id'))")


def until_changed(page, before: list[str], started: float) -> float:
    deadline = time.perf_counter() + 60
    while time.perf_counter() < deadline:
        page.locator("#runs-table tr[data-run-id]").first.wait_for(state="visible")
        if row_ids(page) != before:
            return time.perf_counter() - started
        time.sleep(0.005)
    raise SystemExit("the table did not change within 60 s")


def measure_browser(base: str, real_run: str, long_run: str, steps: int, repeat: int) -> dict[str, list[float]]:
    from playwright.sync_api import sync_playwright

    figures: dict[str, list[float]] = {"fcp": [], "table": [], "sort": [], "filter": [], "run_page": [], "long_run_page": []}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
        for _ in range(repeat):
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            page = context.new_page()
            page.set_default_timeout(60_000)
            started = time.perf_counter()
            page.goto(base + "/", wait_until="commit")
            page.locator("#runs-table tr[data-run-id]").first.wait_for(state="visible")
            figures["table"].append(time.perf_counter() - started)
            params = page.locator('#runs-table th[data-kind="param"]').all_inner_texts()
            assert {"optim.lr", "seed"} <= {p.strip(" ▲▼") for p in params}, params  # the long run differs in more
            page.wait_for_load_state("load")
            fcp = page.evaluate("() => (performance.getEntriesByName('first-contentful-paint')[0] || {}).startTime || null")
            if fcp is not None:
                figures["fcp"].append(fcp / 1000)

            before = row_ids(page)
            started = time.perf_counter()
            page.locator('a.sort[data-key="test.accuracy"]').first.click()
            figures["sort"].append(until_changed(page, before, started))

            before = row_ids(page)
            page.locator("#runs-filter input[name=q]").fill("exp7")
            started = time.perf_counter()
            page.locator("#runs-filter [type=submit]").first.click()
            figures["filter"].append(until_changed(page, before, started))

            started = time.perf_counter()
            page.goto(f"{base}/runs/{real_run}", wait_until="commit")
            page.locator("#curves .uplot canvas").first.wait_for(state="visible")
            figures["run_page"].append(time.perf_counter() - started)

            started = time.perf_counter()
            page.goto(f"{base}/runs/{long_run}", wait_until="commit")
            page.wait_for_function("n => { const c = document.querySelector('.chart[data-chart=\"step_loss\"] .uplot');"
                                   " return c && +c.getAttribute('data-points') === n; }", arg=steps, timeout=60_000)
            figures["long_run_page"].append(time.perf_counter() - started)
            context.close()
        browser.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--publish-runs", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp) / "ws"
        real = make_real_run(workdir)
        publish_ws = Path(tmp) / "publish-ws"
        shutil.copytree(workdir, publish_ws)
        long = make_real_run(workdir, LONG_RUN)
        steps = sum(1 for _ in (long / "steps.jsonl").open())
        copy_runs(real, publish_ws / "runs", args.publish_runs - 1, with_files=True)
        copy_runs(real, workdir / "runs", args.runs - 1)
        print(f"workspace: 1 real run + {args.runs - 1} copies of its record, and a run of {steps} steps")

        proc, base, ready = start_server(workdir)
        try:
            print(f"veritrain ui: answered its first request after {ready:.2f}s (start-up and first index of {args.runs} runs)")
            figures = measure_browser(base, real.name, long.name, steps, args.repeat)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
        med = {k: statistics.median(v) for k, v in figures.items() if v}
        if "fcp" in med:
            print(f"runs table, first contentful paint: {med['fcp'] * 1000:.0f} ms (median of {args.repeat})")
        print(f"runs table with parameter columns, until the first row is visible: {med['table'] * 1000:.0f} ms")
        print(f"sort by test.accuracy, until the table changed: {med['sort'] * 1000:.0f} ms")
        print(f"filter (search 'exp7'), until the table changed: {med['filter'] * 1000:.0f} ms")
        print(f"run page, until its curves are drawn: {med['run_page'] * 1000:.0f} ms")
        print(f"run page of {steps} steps, until its per-step loss chart holds them all: {med['long_run_page'] * 1000:.0f} ms")

        times = []
        for i in range(args.repeat):
            started = time.perf_counter()
            veritrain("publish", "--out", str(Path(tmp) / f"site{i}"), "--workdir", str(publish_ws))
            times.append(time.perf_counter() - started)
        pages = len(list((Path(tmp) / "site0" / "runs").glob("*.html")))
        print(f"veritrain publish of {args.publish_runs} runs ({pages} run pages), whole process: {statistics.median(times):.2f}s")


if __name__ == "__main__":
    main()
