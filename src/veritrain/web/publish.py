"""`veritrain publish`: the run browser's pages as a static site (no server, no network).

Only runs that verify are published: each is verified as `veritrain verify` does (its verdict kept as verify
keeps it), and its page shows that verdict with its time and seal. Every link is relative and every chart's data is inlined, so the
folder can be opened from disk or served by any static host; with archives, each run page names the
commands that check it elsewhere: `veritrain import FILE` and `veritrain verify RUN --expect SEAL`.

    veritrain publish latest --out site/ --with-archives
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from veritrain.core.errors import RunFailed, UserError
from veritrain.web import STATIC_DIR, environment, page_context, views

if TYPE_CHECKING:
    from veritrain.records.workspace import Workspace

COMPARE_MAX = 6  # runs on the static compare page, as on the server's


def refuse_out_in_workspace(workspace: Workspace, out_dir: Path) -> None:
    """A site is never written into runs/ or .veritrain/ (sealed runs and data versions), nor into the workspace
    folder itself, whose runs/ would receive the site's runs/<id>.html. Paths are compared resolved, links followed."""
    out = out_dir.resolve()
    for protected in (workspace.runs_dir, workspace.state_dir):
        place = protected.resolve()
        if out == place or out.is_relative_to(place) or out == place.parent:
            raise UserError(f"--out {out_dir}: {'is the workspace folder' if out == place.parent else 'is inside ' + str(place)}, "
                            "where the runs and data versions are sealed; publish to a folder outside them, e.g. --out site")


def publish(workspace: Workspace, run_dirs: list[Path], out_dir: Path, with_archives: bool = False, named: bool = True) -> dict[str, Any]:
    """Write index.html, runs/<id>.html, data/<version>.html, experiments.html, compare.html (2 or more
    runs: the first COMPARE_MAX of them), static/ and the images the pages show into `out_dir`. Runs the user
    `named`: one that does not verify is refused before anything is written. The whole workspace (`named` False):
    every run that verifies is published, and each one skipped is in the result's `skipped` with the reason
    (the caller fails after saying so); none that verifies is refused."""
    from veritrain.trust.verify import verify_and_keep

    refuse_out_in_workspace(workspace, out_dir)
    verified_runs, skipped = {}, []
    for run_dir in run_dirs:
        verified = verify_and_keep(run_dir, workspace.state_dir)  # the CLI's defaults: the raw data is prepared again too
        if not verified["ok"]:
            first = (verified["problems"] or [{"path": "the environment", "kind": "drift"}])[0]
            reason = f"{first['path']}: {first['kind']}" + (f" ({first['detail']})" if first.get("detail") else "")
            if named:
                raise RunFailed(f"publish {run_dir.name}: {reason}; the run does not verify, see `veritrain verify {run_dir.name}`")
            skipped.append({"run_id": run_dir.name, "reason": reason})
            continue
        verified_runs[run_dir.name] = verified  # the run pages show it and their checklists reuse it: each file is hashed once
    run_dirs = [d for d in run_dirs if d.name in verified_runs]
    if not run_dirs:
        raise RunFailed(f"publish: none of the {len(skipped)} run(s) verifies, first {skipped[0]['run_id']}: {skipped[0]['reason']}; "
                        f"see `veritrain verify {skipped[0]['run_id']}`")
    env = environment()
    ids = [d.name for d in run_dirs]
    written: list[str] = []

    def write(rel: str, template: str, depth: int, **context: Any) -> None:
        path = out_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(env.get_template(template).render(**page_context(depth, static=True), **context), encoding="utf-8")
        written.append(rel)

    def copy(rel: str) -> None:
        source = views.safe_source(workspace.root, rel)
        if source is not None:
            target = out_dir / "files" / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
            written.append(f"files/{rel}")

    out_dir.mkdir(parents=True, exist_ok=True)
    table = views.runs_table(workspace, {}, page_size=max(1, len(ids)), only=ids)
    columns = views.table_columns(table)
    compared = ids[:COMPARE_MAX] if len(ids) >= 2 else []
    write("index.html", "index.html", 0, table=table, columns=columns, sort_links={}, prev_link=None, next_link=None,
          compare_link="compare.html" if compared else None)
    archives = []
    versions = []
    for run_id in ids:
        run = views.run_page(workspace, run_id, verified=verified_runs[run_id])
        archive_name = None
        if with_archives:
            from veritrain.trust import archive

            archive_name = f"{run_id}.tar.gz"
            # with the checkpoints kept for audit: whoever downloads a published run can audit it, not only verify it
            result = archive.create(workspace.runs_dir / run_id, workspace.state_dir, out_dir / "runs" / archive_name, with_data=True, with_audit=True)
            archives.append({"run_id": run_id, "archive": f"runs/{archive_name}", "sha256": result["sha256"]})
            written.append(f"runs/{archive_name}")
        for e in run["evals"]:
            for rel in e["images"].values():
                copy(rel)
        write(f"runs/{run_id}.html", "run.html", 1, run=run, archive=archive_name, curves_data=run["curves"])
        version = run["data"].get("version")
        if version and version not in versions:
            versions.append(version)
    data_pages = []
    for version in versions:
        try:
            d = views.data_page(workspace, version)
        except views.UserError:
            continue  # a run imported without its data: its page says which version it used
        for rel in [*d["images"], *([d["gallery"]] if d["gallery"] else [])]:
            copy(rel)
        write(f"data/{version}.html", "data.html", 1, d=d)
        data_pages.append(version)
    if compared:
        cmp = views.compare_page(workspace, compared)
        note = (f"The first {len(compared)} of the {len(ids)} published runs; the browser (`veritrain ui`) compares any "
                f"{COMPARE_MAX}." if len(ids) > len(compared) else None)
        write("compare.html", "compare.html", 0, cmp=cmp, curves_data=cmp["curves"], note=note,
              data_pages=data_pages)
    exp = views.experiments_page(workspace, only=ids)
    for shown in [*exp["sweeps"], *exp["searches"]]:  # a sweep or search whose runs are all published gets its page
        sweep = views.sweep_page(workspace, shown["id"])
        write(f"sweeps/{shown['id']}.html", "sweep.html", 1, s=sweep, sweep_data=sweep["plot"])
    write("experiments.html", "experiments.html", 0, exp=exp)
    if STATIC_DIR.is_dir():
        shutil.copytree(STATIC_DIR, out_dir / "static", dirs_exist_ok=True)
        written.append("static/")
    return {"out": str(out_dir), "runs": ids, "data_versions": versions, "archives": archives, "files": written, "skipped": skipped}
