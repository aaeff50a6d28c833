"""The data report of a data version: `data_report.json` (for scripts), `data_report.md` (for people)
and one class-distribution chart per split (`class_distribution_<split>.png`).

    veritrain data report <version or run>
"""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from veritrain.core.errors import RunFailed

if TYPE_CHECKING:
    import numpy as np

CARD_REQUIRED = ("origin", "license")  # the seed of open training: say where data comes from and on what terms


def card_warnings(card: dict[str, Any]) -> list[str]:
    return [f"data.card.{key} is missing: say {'where the data comes from' if key == 'origin' else 'under which license it may be used'}"
            for key in CARD_REQUIRED if not card.get(key)]


def card_gaps(card: dict[str, Any]) -> list[str]:
    """One line per card field left empty: `card_warnings` for origin and license (named even when the card lacks
    them), then each other empty field, in the same words. The Croissant record leaves these out, and mlcroissant
    warns for them (veritrain.data.croissant)."""
    from veritrain.core.config.schema import DataCard

    gaps = card_warnings(card)
    for key, value in card.items():
        if key in CARD_REQUIRED or value:
            continue
        described = DataCard.model_fields.get(key)
        what = described.description if described is not None and described.description else None
        gaps.append(f"data.card.{key} is missing" + (f": say {what}" if what else ""))
    return gaps


GALLERY_FILE = "flagged.png"  # the top label issues and outliers, each with its given and suggested label
GALLERY_SIZE = 24  # samples shown: the first label issues, then outliers, by rank


def write(out: Path, info: dict[str, Any], findings: list[dict[str, Any]], quarantined: list[dict[str, Any]],
          images: dict[str, Any], leakage_pairs: int, achieved: dict[str, Any], label_method: dict[str, Any],
          timings: dict[str, float], card: dict[str, Any],
          image_of: Optional[Callable[[str], Optional[np.ndarray]]] = None) -> dict[str, Any]:
    """data_report.json, data_report.md, the class charts and the gallery of flagged samples in `out`.
    Samples are named by their id (the path relative to data.root), never by an absolute path.
    `image_of(sample_id)` gives a flagged sample's picture for the gallery (uint8 H×W×C), or None."""
    by_kind = Counter(f["kind"] for f in findings)
    flagged = [f for f in findings if f["kind"] == "label_issue"]
    outliers = [f for f in findings if f["kind"] == "outlier"]
    report = {
        "data_version": info["data_version"],
        "hash_algorithm": info["hash_algorithm"],
        "source": info["preprocessing"]["data"]["source"],
        "counts": info["counts"],
        "counts_per_class": info["counts_per_class"],
        "classes": info["classes"],
        "summary": {
            "quarantined_by_kind": dict(sorted(Counter(q["kind"] for q in quarantined).items())),
            "achieved_split": achieved,
            "label_issues": {"found": len(flagged), "in_test": sum(1 for f in flagged if f.get("split") == "test"),
                             "quarantined": sum(1 for f in flagged if f["severity"] == "quarantine")},
            "outliers": {"found": len(outliers)},
            "near_duplicate_groups": by_kind.get("near_duplicate", 0),
        },
        "quarantined": quarantined,
        "ignored": info.get("ignored"),  # recipe 5 on: files under data.root that are not images, no samples
        "findings": findings,
        "findings_by_kind": dict(sorted(by_kind.items())),
        "label_issue_method": label_method,
        "leakage": {"cross_split_duplicate_pairs": leakage_pairs, "required": 0, "ok": leakage_pairs == 0},
        "normalization": info["normalization"],
        "images": images,
        "input_shape": info["input_shape"],
        "card": card,
        "card_warnings": card_warnings(card),
        "decoders": info.get("decoders"),
        "timings_seconds": timings,
        "charts": [],
        "gallery": None,
    }
    if info["counts_per_class"]:
        report["charts"] = _charts(out, info["counts_per_class"])
    if (flagged or outliers) and image_of is not None:
        report["gallery"] = _gallery(out, (flagged + outliers)[:GALLERY_SIZE], image_of)
    (out / "data_report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (out / "data_report.md").write_text(markdown(report), encoding="utf-8")
    return report


def _charts(out: Path, per_class: dict[str, dict[str, int]]) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    names = []
    for split, counts in per_class.items():
        fig, ax = plt.subplots(figsize=(max(4.0, 0.45 * len(counts) + 1.5), 3.2), dpi=100)
        ax.bar(list(counts), list(counts.values()), color="#4c72b0")
        ax.set_title(f"{split}: samples per class ({sum(counts.values())} total)")
        ax.set_ylabel("samples")
        ax.tick_params(axis="x", labelrotation=45 if len(counts) > 8 else 0)
        fig.tight_layout()
        name = f"class_distribution_{split}.png"
        fig.savefig(out / name, metadata={"Software": None})  # no version stamp: same data, same bytes
        plt.close(fig)
        names.append(name)
    return names


def _gallery(out: Path, shown: list[dict[str, Any]], image_of: Callable[[str], Optional[np.ndarray]]) -> str:
    """A grid of flagged samples: the picture, its sample id, the given label and (label issues) the suggested one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(6, len(shown))
    rows = (len(shown) + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(1.9 * columns, 2.3 * rows), dpi=100, squeeze=False)
    for ax in axes.ravel():
        ax.axis("off")
    for ax, finding in zip(axes.ravel(), shown):
        image = image_of(finding["samples"][0])
        if image is not None:
            ax.imshow(image[:, :, 0] if image.shape[-1] == 1 else image, cmap="gray" if image.shape[-1] == 1 else None,
                      vmin=0, vmax=255, interpolation="nearest")
        title = (f"label issue #{finding['rank']}\ngiven {finding['label']} → {finding['suggested']}" if finding["kind"] == "label_issue"
                 else f"outlier #{finding['rank']}\nclass {finding['label']}")
        ax.set_title(title, fontsize=8, color="#b03030" if finding["kind"] == "label_issue" else "#3050b0")
        ax.text(0.5, -0.08, finding["samples"][0][-24:], transform=ax.transAxes, ha="center", va="top", fontsize=6)
    fig.tight_layout()
    fig.savefig(out / GALLERY_FILE, metadata={"Software": None})
    plt.close(fig)
    return GALLERY_FILE


def markdown(report: dict[str, Any]) -> str:
    """The report for people: what matters first (quarantine, achieved split, label issues and outliers),
    then the details, near-duplicates as one row per group."""
    summary = report.get("summary") or {}
    lines = [f"# Data report: {report['data_version'][:12]}", ""]
    lines += summary_lines(summary)
    lines += achieved_lines(summary.get("achieved_split") or {})
    lines += [
        "",
        "## Version",
        "",
        f"- data version: `{report['data_version']}`",
        f"- source: `{report['source']}`, content hash: {report['hash_algorithm']}",
        "- samples: " + ", ".join(f"{k} {v}" for k, v in report["counts"].items()) + f"; quarantined {len(report['quarantined'])}",
        f"- input shape: {report['input_shape']}",
        f"- leakage check: {report['leakage']['cross_split_duplicate_pairs']} cross-split duplicate pairs "
        f"({'ok' if report['leakage']['ok'] else 'FAILED'}; 0 required)",
        f"- normalization (train split only): mean {_fmt(report['normalization']['mean'])}, std {_fmt(report['normalization']['std'])}",
        "",
        "## Data card",
        "",
    ]
    for key, value in report["card"].items():
        lines.append(f"- {key}: {value if value else '_not given_'}")
    for warning in report["card_warnings"]:
        lines.append(f"- **warning:** {warning}")
    if report["counts_per_class"]:
        splits = list(report["counts_per_class"])
        lines += ["", "## Samples per class", "", "| class | " + " | ".join(splits) + " |", "|---|" + "---|" * len(splits)]
        for name in report["classes"]:
            lines.append(f"| {name} | " + " | ".join(str(report["counts_per_class"][s][name]) for s in splits) + " |")
        lines += [""] + [f"![{c}]({c})" for c in report["charts"]]
    flagged = [f for f in report["findings"] if f["kind"] in ("label_issue", "outlier")]
    if flagged:
        lines += ["", "## Label issues and outliers", ""]
        if report.get("gallery"):
            lines += [f"![flagged samples]({report['gallery']})", ""]
        lines += ["| kind | rank | sample | split | suggested | score |", "|---|---|---|---|---|---|"]
        for f in flagged[:200]:
            lines.append(f"| {f['kind']} | {f.get('rank')} | {f['samples'][0]} | {f.get('split') or '-'} | {f.get('suggested', '-')} | {f.get('score')} |")
    lines += ["", "## Findings", ""]
    others = [f for f in report["findings"] if f["kind"] not in ("label_issue", "outlier")]
    if report["findings"]:
        lines += ["| kind | count |", "|---|---|"] + [f"| {k} | {n} |" for k, n in report["findings_by_kind"].items()]
    if others:
        lines += ["", "| kind | severity | samples | reason |", "|---|---|---|---|"]
        for f in others[:200]:  # one row per finding: a near-duplicate group is one row with its size and an example
            shown = ", ".join(f["samples"][:3]) + (f" (+{len(f['samples']) - 3})" if len(f["samples"]) > 3 else "")
            lines.append(f"| {f['kind']} | {f['severity']} | {shown} | {_cell(f['reason'])} |")
        if len(others) > 200:
            lines.append(f"| … | | | {len(others) - 200} more in data_report.json |")
    elif not report["findings"]:
        lines.append("None.")
    lines += ["", "## Quarantine", ""]
    if report["quarantined"]:
        lines += ["| sample | kind | reason |", "|---|---|---|"]
        lines += [f"| {q['sample_id']} | {q['kind']} | {_cell(q['reason'])} |" for q in report["quarantined"][:500]]
    else:
        lines.append("Nothing quarantined.")
    ignored = report.get("ignored") or {}
    if ignored.get("count"):
        lines += ["", "## Ignored files", "", f"{ignored['count']} file(s) under data.root are not images (by their extension), so no samples:", ""]
        lines += [f"- {name}" for name in ignored["files"][:500]]
        if ignored["count"] > min(len(ignored["files"]), 500):
            lines.append(f"- … {ignored['count'] - min(len(ignored['files']), 500)} more")
    if report["images"]:
        lines += ["", "## Images", ""] + images_table(report["images"])
    lines += ["", "## Timings (seconds)", ""] + [f"- {k}: {v}" for k, v in report["timings_seconds"].items()]
    return "\n".join(lines) + "\n"


IMAGE_PROPERTIES = {  # keys of the report's `images` → how the table names them
    "shape": "shape (height × width × channels)",
    "sizes": "size (width × height)",
    "modes": "mode",
    "formats": "format",
}


def images_table(images: dict[str, Any]) -> list[str]:
    """The report's `images` (stored shapes of an array source; sizes, modes and formats of image files,
    each with its sample count) as a Markdown table: one row per property and value."""
    lines = ["| property | value | samples |", "|---|---|---|"]
    for key, values in images.items():
        name = IMAGE_PROPERTIES.get(key, key.replace("_", " "))
        if isinstance(values, dict):
            for value, count in values.items():  # prepare lists them most common first
                lines.append(f"| {name} | {_cell(str(value))} | {count} |")
        else:
            lines.append(f"| {name} | {_cell(str(values))} | |")
    return lines


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """The lines a data report and a run's report.md begin with: quarantined by kind, achieved split against
    asked, label issues and outliers."""
    if not summary:
        return []
    quarantined = summary.get("quarantined_by_kind") or {}
    achieved = summary.get("achieved_split") or {}
    issues = summary.get("label_issues") or {}
    lines = ["## What matters", ""]
    lines.append("- quarantined: " + (", ".join(f"{k} {n}" for k, n in quarantined.items()) if quarantined else "none"))
    if achieved.get("judged"):
        per_class = achieved.get("per_class") or {}
        asked = _asked_ratios(achieved)
        worst = max(per_class.items(), key=lambda item: item[1]["largest_gap"], default=None)
        skewed = achieved.get("skewed") or []
        sigmas = [(abs(v), name, split) for name, found in per_class.items() for split, v in (found.get("gap_sigma") or {}).items()]
        lines.append(f"- achieved split (train / val / test, per class, of the samples the split placed freely): asked {asked}; "
                     + (f"**{len(skewed)} skewed (split_skew)**" if skewed else "every class within tolerance")
                     + (f"; largest gap {worst[1]['largest_gap']:.3f} in class {worst[0]!r}" if worst else "")
                     + (f"; largest deviation {max(sigmas)[0]:.1f}σ (class {max(sigmas)[1]!r}, {max(sigmas)[2]})" if sigmas else ""))
        whole = achieved.get("whole")
        if whole:  # recipe 4 on
            lines.append(f"  - all classes together: {' / '.join(f'{whole[s]:.4f}' for s in ('train', 'val', 'test'))} of {whole['samples']} samples "
                         f"({' / '.join(f'{v:+.1f}σ' for v in whole['gap_sigma'].values())}), allowed gap {whole['allowed']:.4f}")
        lines += [f"  - **split_skew:** {reason}" for reason in skewed]
        test_from = achieved.get("test_from")
        if test_from:
            lines.append(f"- test split carried over from {test_from['version'][:12]} (data.test_from): {test_from['kept_in_test']} of its "
                         f"{test_from['former_test_samples']} test samples still here are in test; {test_from['kept_out_of_test']} former "
                         "train/val samples kept out of test")
            lines += [f"  - **test_from_leak:** {reason}" for reason in test_from.get("leaks") or []]
    else:
        lines.append("- achieved split: not judged (fixed or time-ordered split)")
    lines.append(f"- label issues: {issues.get('found', 0)} found"
                 + (f", {issues['quarantined']} quarantined" if issues.get("quarantined") else "")
                 + (f", {issues['in_test']} in the test split (reported, never removed)" if issues.get("in_test") else ""))
    lines.append(f"- outliers: {(summary.get('outliers') or {}).get('found', 0)} found")
    lines.append(f"- near-duplicate groups: {summary.get('near_duplicate_groups', 0)}")
    return lines


def _asked_ratios(achieved: dict[str, Any]) -> str:
    """data.split_ratios as the config gives them; when the data fixes a split (a csv split column, an official
    test set), the ratios the other samples follow instead, and why."""
    wanted = achieved.get("wanted_for_free_samples") or {}
    asked = achieved.get("asked") or wanted  # a report of an older version may hold only the derived ratios
    shown = " / ".join(f"{r:g}" for r in asked.values()) + " (data.split_ratios)"
    fixed = [split for split, r in asked.items() if r > 0 and wanted.get(split) == 0]
    if fixed and wanted:
        shown += (f", so the samples without a fixed split follow {' / '.join(f'{r:.2f}' for r in wanted.values())}"
                  f" as the data fixes {' and '.join(fixed)}")
    return shown


def achieved_lines(achieved: dict[str, Any]) -> list[str]:
    """Each class's achieved fractions and their gaps from the asked ratios in σ = √(p(1−p)/n) (data recipe 4 on)."""
    per_class = achieved.get("per_class") or {}
    if not achieved.get("judged") or not all("gap_sigma" in found for found in per_class.values()) or not per_class:
        return []
    lines = ["", "## Achieved split", "",
             "Each sample's split follows the hash of its key, so a class of n samples lands about σ = √(p(1−p)/n) from each "
             "ratio p by chance; a gap beyond max(data.split_tolerance, 3σ) is `split_skew`.", "",
             "| class | samples | train | val | test | gap train | gap val | gap test | allowed |", "|---|---|---|---|---|---|---|---|---|"]
    rows = list(per_class.items()) + ([("(all classes)", achieved["whole"])] if achieved.get("whole") else [])
    for name, found in rows:
        gaps = " | ".join(f"{found['gap_sigma'][s]:+.1f}σ" for s in ("train", "val", "test"))
        lines.append(f"| {_cell(str(name))} | {found['samples']} | {found['train']:.4f} | {found['val']:.4f} | {found['test']:.4f} | {gaps} | {found['allowed']:.4f} |")
    return lines


def _fmt(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.4f}" for v in values) + "]"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def diff(old_dir: Path, new_dir: Path) -> dict[str, Any]:
    """Samples added, removed, relabelled, moved between splits, or changed in content between two versions.

    Samples are matched by their key (the manifest's `key` column from data recipe 4 on; the content hash when a
    version has none), so a renamed or relabelled file is the same sample, then what is left by sample id (its
    content or id changed: `content_changed` lists those of the same id). Each move says why: `key` (the sample's
    own key changed, so the hash placed it anew), `group` (its unit's smallest key changed: the change merged or
    split its group), `quarantine` (quarantined or released), or `placement` (the split rule differs: recipe,
    split_seed, split_ratios, test_from, a fixed split). Between versions of one rule no `placement` move occurs.
    """

    def read(path: Path) -> tuple[dict[str, dict[str, str]], str, dict[str, Any]]:
        """The manifest's rows by sample id, its content-hash column (named by the algorithm version.json records,
        `hash_algorithm`, as `prepare.version_id_of_manifest` reads it), and version.json."""
        try:
            info = json.loads((path / "version.json").read_text(encoding="utf-8"))
            algorithm = info["hash_algorithm"]
            with open(path / "manifest.csv", newline="", encoding="utf-8") as f:
                rows = {row["sample_id"]: row for row in csv.DictReader(f)}
            if any(algorithm not in row for row in rows.values()):
                raise KeyError(algorithm)
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise RunFailed(f"{path}: not a readable data version ({err.__class__.__name__}: {err}); `veritrain verify` on a run that uses it says more") from None
        return rows, algorithm, info

    (old, old_hash, old_info), (new, new_hash, new_info) = read(old_dir), read(new_dir)
    common_ids = sorted(set(old) & set(new))

    def where(row: dict[str, str]) -> str:
        return row["split"] if row["status"] == "ok" else "quarantined"

    keyed = all("key" in row for rows in (old, new) for row in rows.values())
    matched_by = "key" if keyed else old_hash if old_hash == new_hash else "sample_id"

    def key_of(row: dict[str, str], algorithm: str) -> str:
        # unreadable samples have no content hash: they match by sample id only
        if matched_by == "sample_id":
            return "\0" + row["sample_id"]
        return (row["key"] if keyed else "") or row[algorithm] or "\0" + row["sample_id"]

    rule = {name: [(info.get("preprocessing") or {}).get("data", {}).get(name) for info in (old_info, new_info)]
            for name in ("split_seed", "split_ratios", "split_by", "test_from")}
    rule["recipe"] = [old_info.get("format"), new_info.get("format")]
    rule_changed = any(a != b for a, b in rule.values())
    pairs = _matched_rows(old, new, lambda r: key_of(r, old_hash), lambda r: key_of(r, new_hash))
    relabelled, moved = [], []
    for old_id, new_id in pairs:
        before, after = old[old_id], new[new_id]
        named = {"sample_id": new_id, **({"old_sample_id": old_id} if old_id != new_id else {})}
        if before["label"] != after["label"]:
            relabelled.append({**named, "old": before["label"], "new": after["label"]})
        if where(before) != where(after):
            if "quarantined" in (where(before), where(after)):
                why = "quarantine"
            elif key_of(before, old_hash) != key_of(after, new_hash):
                why = "key"
            elif keyed and (before["unit"] or key_of(before, old_hash)) != (after["unit"] or key_of(after, new_hash)):
                why = "group"
            else:  # under one rule a sample moves only with its group (a manifest without units, as a text version's, cannot show it)
                why = "placement" if rule_changed else "group"
            moved.append({**named, "old": where(before), "new": where(after), "why": why})
    matched_old, matched_new = {a for a, _ in pairs}, {b for _, b in pairs}
    return {
        "old": old_dir.name,
        "new": new_dir.name,
        "added": sorted(set(new) - matched_new),
        "removed": sorted(set(old) - matched_old),
        "relabelled": relabelled,
        "moved": moved,
        "matched_by": matched_by,
        "moved_by_cause": {why: sum(1 for m in moved if m["why"] == why) for why in ("key", "group", "quarantine", "placement")},
        "split_rule_changed": {name: {"old": a, "new": b} for name, (a, b) in rule.items() if a != b},
        "content_hash": old_hash if old_hash == new_hash else f"{old_hash} → {new_hash}",
        # hashes by different algorithms cannot be compared: then no sample counts as changed
        "content_compared": old_hash == new_hash,
        "content_changed": [s for s in common_ids if old[s][old_hash] != new[s][new_hash]] if old_hash == new_hash else [],
    }


def _matched_rows(old: dict[str, dict[str, str]], new: dict[str, dict[str, str]], old_key: Callable[[dict[str, str]], str],
                  new_key: Callable[[dict[str, str]], str]) -> list[tuple[str, str]]:
    """(old sample id, new sample id) of the same sample: same key, the same sample id first, then copies of one
    content paired in sample-id order (so a renamed file is matched to its former self); last, rows left over on
    both sides with the same sample id (new content, or a new id in the source)."""
    by_key_old: dict[str, list[str]] = {}
    by_key_new: dict[str, list[str]] = {}
    for sid, row in sorted(old.items()):
        by_key_old.setdefault(old_key(row), []).append(sid)
    for sid, row in sorted(new.items()):
        by_key_new.setdefault(new_key(row), []).append(sid)
    pairs = []
    for key, olds in by_key_old.items():
        news = by_key_new.get(key, [])
        same = set(olds) & set(news)
        pairs += [(sid, sid) for sid in olds if sid in same]
        pairs += list(zip([s for s in olds if s not in same], [s for s in news if s not in same]))
    matched_old, matched_new = {a for a, _ in pairs}, {b for _, b in pairs}
    pairs += [(sid, sid) for sid in sorted(set(old) & set(new)) if sid not in matched_old and sid not in matched_new]
    return pairs
