"""A data version's page: its card, counts, findings, splits and quarantine.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from veritrain.core.errors import UserError
from veritrain.core.files import read_regular
from veritrain.web.common import VERSION_ID, finite_number, first_rows, read_json, shown_text

if TYPE_CHECKING:
    from veritrain.records.workspace import Workspace



def data_dir_of(workspace: Workspace, version: str) -> Path:
    if not VERSION_ID.fullmatch(version or "") or not (workspace.state_dir / "data" / version / "version.json").is_file():
        raise UserError(f"{version}: no such data version in {workspace.state_dir / 'data'}")
    return workspace.state_dir / "data" / version


SPLITS = ("train", "val", "test")


def data_page(workspace: Workspace, version: str) -> dict[str, Any]:
    """A data version: the achieved split against the asked ratios, the quarantine, findings counted by kind,
    label issues and outliers with the gallery of flagged samples, the other findings, the data card and charts.
    Every table is plain rows of text and numbers (the template renders them), the long ones cut at MAX_DATA_ROWS."""
    folder = data_dir_of(workspace, version)
    report = read_json(folder / "data_report.json")
    report = report if isinstance(report, dict) else {}
    found = read_regular(folder / "data_report.md")
    report_md = found[0].decode("utf-8", errors="replace") if found is not None else None
    findings = [f for f in report.get("findings") or [] if isinstance(f, dict)] if isinstance(report.get("findings"), list) else []
    quarantined = [q for q in report.get("quarantined") or [] if isinstance(q, dict)] if isinstance(report.get("quarantined"), list) else []
    summary = report["summary"] if isinstance(report.get("summary"), dict) else {}

    gallery_name = report["gallery"] if isinstance(report.get("gallery"), str) else "flagged.png"
    gallery_path = folder / gallery_name
    gallery = (f".veritrain/data/{version}/{gallery_name}"
               if "/" not in gallery_name and gallery_path.is_file() and not gallery_path.is_symlink() else None)
    images = [f".veritrain/data/{version}/{p.name}" for p in sorted(folder.glob("*.png"))
              if p.is_file() and not p.is_symlink() and p.name != gallery_name]

    achieved = summary["achieved_split"] if isinstance(summary.get("achieved_split"), dict) else {}
    per_class = achieved["per_class"] if isinstance(achieved.get("per_class"), dict) else {}
    split_rows = [{"class": str(name), "samples": (s or {}).get("samples"), **{k: finite_number((s or {}).get(k)) for k in SPLITS},
                   "largest_gap": finite_number((s or {}).get("largest_gap")), "allowed": finite_number((s or {}).get("allowed"))}
                  for name, s in per_class.items() if isinstance(s, dict) or s is None]
    asked = achieved["asked"] if isinstance(achieved.get("asked"), dict) else {}
    wanted = achieved["wanted_for_free_samples"] if isinstance(achieved.get("wanted_for_free_samples"), dict) else {}
    split = {"judged": bool(achieved.get("judged")), "asked": {k: finite_number(v) for k, v in asked.items()},
             "wanted": {k: finite_number(v) for k, v in wanted.items()}, "rows": split_rows,
             "skewed": [shown_text(r) for r in achieved.get("skewed") or []] if isinstance(achieved.get("skewed"), list) else [],
             "present": bool(achieved)}

    quarantine = [{"sample_id": shown_text(q.get("sample_id")), "kind": shown_text(q.get("kind")), "reason": shown_text(q.get("reason"))} for q in quarantined]
    flagged, others = [], []
    for f in findings:
        samples = [shown_text(s) for s in f.get("samples") or []] if isinstance(f.get("samples"), list) else []
        if f.get("kind") in ("label_issue", "outlier"):
            flagged.append({"kind": shown_text(f.get("kind")), "rank": f.get("rank") if isinstance(f.get("rank"), int) else None,
                            "sample_id": samples[0] if samples else "", "split": shown_text(f.get("split")),
                            "label": shown_text(f.get("label")), "suggested": shown_text(f.get("suggested")), "score": finite_number(f.get("score")),
                            "severity": shown_text(f.get("severity"))})
        else:
            others.append({"kind": shown_text(f.get("kind")), "severity": shown_text(f.get("severity")), "samples": samples[:3],
                           "more_samples": max(0, len(samples) - 3), "reason": shown_text(f.get("reason"))})
    by_kind = report["findings_by_kind"] if isinstance(report.get("findings_by_kind"), dict) else {}
    q_by_kind = summary["quarantined_by_kind"] if isinstance(summary.get("quarantined_by_kind"), dict) else {}
    card = report["card"] if isinstance(report.get("card"), dict) else {}
    warnings = report["card_warnings"] if isinstance(report.get("card_warnings"), list) else []
    return {"version": version, "report": report, "report_md": report_md, "source": report.get("source"),
            "counts": report.get("counts") if isinstance(report.get("counts"), dict) else {},
            "classes": [shown_text(c) for c in report.get("classes") or []] if isinstance(report.get("classes"), list) else [],
            "findings_by_kind": {shown_text(k): v for k, v in by_kind.items()},
            "quarantined_by_kind": {shown_text(k): v for k, v in q_by_kind.items()},
            "achieved_split": split, "quarantine": first_rows(quarantine), "flagged": first_rows(flagged), "other_findings": first_rows(others),
            "card": [{"key": shown_text(k), "value": shown_text(v)} for k, v in card.items()], "card_warnings": [shown_text(w) for w in warnings],
            "gallery": gallery, "images": images}
