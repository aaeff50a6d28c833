"""Grouping and split: exact and confirmed near-duplicates and data.group_regex groups joined into the units the
split keeps whole, data.test_from's former splits carried over, the split itself, and the checks on it (leakage,
achieved fractions against chance, class balance, label issues and outliers, data.on_bad_file)."""

from __future__ import annotations

import csv
import json
import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from veritrain.core.errors import RunFailed, UserError
from veritrain.core.hashing import DATA_HASH_ALGORITHM
from veritrain.data import label_issues, split as splitting
from veritrain.data.dedup import near_duplicates
from veritrain.data.identity import check_version
from veritrain.data.split import SPLITS, Placement
from veritrain.data.table import ContentGroups, Table

if TYPE_CHECKING:
    from veritrain.core.config import DataConfig

SPLIT_PRIORITY = {"test": 0, "val": 1, "train": 2}  # where copies disagree, the most protected split wins


def duplicates_and_units(cfg: DataConfig, table: Table, classes: Optional[list[str]]) -> tuple[splitting.Units, np.ndarray]:
    """Exact duplicates, confirmed near-duplicates and groups, joined into the units the split keeps whole.
    Returns the units and the confirmed near-duplicate pairs (sample indices), which the leakage count checks."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components


    instants = _instants(cfg, table)
    included = table.included()
    # exact duplicates: same content, same label → kept together; different labels → all quarantined
    links: list[list[int]] = []
    contents = ContentGroups(table, np.array(included, dtype=np.int64))
    for k in contents.copied():
        members = contents.members(k)
        labels = {table.labels[i] for i in members}
        if len(labels) > 1:
            shown = ", ".join(f"{table.ids[i]}={table.labels[i]}" for i in members[:6])
            table.add("conflicting_duplicate", members, f"same content, different labels ({shown})", exclude=True)
            if table.keep_usable:
                links.append(members)  # kept under on_bad_file: warn, but still in one split
        else:
            table.add("duplicate", members, f"{len(members)} identical copies; kept together in one split")
            links.append(members)
        for i in members:
            table.units_of[i] = "exact duplicates"

    near_pairs = _near_duplicates(cfg, table, links)

    # groups: the csv group column or data.group_regex over the relpath
    pattern = re.compile(cfg.group_regex) if cfg.group_regex else None
    by_group: dict[str, list[int]] = defaultdict(list)
    for i in table.included():
        group = table.groups[i]
        if pattern is not None:
            match = pattern.search(table.ids[i])
            group = match.group(1) if match else group
        if group is not None:
            by_group[group].append(i)
    for name, members in by_group.items():
        if len(members) > 1:
            links.append(members)
            for i in members:
                table.units_of[i] = f"group {name!r}"

    # units: connected components of every link (scipy), so one rule joins duplicates, near-duplicates and groups
    n = len(table.ids)
    heads = [members[0] for members in links for _ in members[1:]]
    tails = [other for members in links for other in members[1:]]
    graph = coo_matrix((np.ones(len(heads)), (heads, tails)), shape=(n, n))
    _, component_of = connected_components(graph, directed=False)

    return _units(table, np.array(table.included(), dtype=np.int64), component_of, classes, instants), near_pairs


def _units(table: Table, included: np.ndarray, component_of: np.ndarray, classes: Optional[list[str]], instants: dict[int, int]) -> splitting.Units:
    """The included samples as units, one per component, in the order of their first member: lone samples as arrays,
    and the few units of several members one by one. A unit whose members have different fixed splits would leak:
    the most protected split wins and the copies fixed elsewhere are quarantined as `leak_duplicate`."""
    order = np.argsort(component_of[included], kind="stable")  # stable: a component's members in row order
    grouped = included[order]
    ordered = component_of[grouped]
    starts = np.flatnonzero(np.concatenate([[True], ordered[1:] != ordered[:-1]])) if len(grouped) else np.zeros(0, np.int64)
    ends = np.concatenate([starts[1:], [len(grouped)]]).astype(np.int64)
    lone = ends - starts == 1
    firsts = [grouped[starts[lone]]]
    member_lists = [grouped[starts[lone]]]
    fixed_of_lone = table.fixed.mapped(grouped[starts[lone]], {name: k for k, name in enumerate(SPLITS)})
    fixed_codes = [fixed_of_lone]
    keys, timestamps, several = {}, {}, []
    for a, b in zip(starts[~lone].tolist(), ends[~lone].tolist()):
        members = grouped[a:b].tolist()
        fixed = {split for split in (table.fixed[i] for i in members) if split}
        winner = min(fixed, key=SPLIT_PRIORITY.__getitem__) if fixed else None
        if len(fixed) > 1:
            keepers = [i for i in members if table.fixed[i] in (winner, None)]
            for i in members:
                if table.fixed[i] not in (winner, None):
                    table.add("leak_duplicate", [i],
                              f"a copy (or group member) of {table.ids[keepers[0]]} in the fixed {winner} split, fixed to {table.fixed[i]}; quarantined so nothing leaks",
                              exclude=True)
            members = keepers
        several.append((members, winner))
    if several:
        firsts.append(np.array([members[0] for members, _ in several], dtype=np.int64))
        member_lists.append(np.array([i for members, _ in several for i in members], dtype=np.int64))
        fixed_codes.append(np.array([SPLITS.index(winner) if winner else -1 for _, winner in several], dtype=np.int32))
    # units in the order of their first member: each member moved to its unit's new place, all at once
    sizes = np.concatenate([np.ones(int(lone.sum()), dtype=np.int64), np.array([len(m) for m, _ in several], dtype=np.int64)])
    by_first = np.argsort(np.concatenate(firsts), kind="stable")
    position = np.empty(len(by_first), dtype=np.int64)
    position[by_first] = np.arange(len(by_first))
    unit_starts = np.concatenate([[0], np.cumsum(sizes[by_first])]).astype(np.int64)
    flat = np.concatenate(member_lists)
    unit_of_flat = np.repeat(np.arange(len(sizes)), sizes)
    within = np.arange(len(flat)) - (np.cumsum(sizes) - sizes)[unit_of_flat]
    members = np.empty_like(flat)
    members[unit_starts[position[unit_of_flat]] + within] = flat
    del unit_of_flat, within, flat
    fixed = np.concatenate(fixed_codes)[by_first].astype(np.int8)
    lone_count = int(lone.sum())
    for k, (unit_members, _) in enumerate(several):
        keys[int(position[lone_count + k])] = splitting.unit_key(table.key(i) for i in unit_members)
    class_index = {c: k for k, c in enumerate(classes)} if classes else {}
    labels = table.labels.mapped(members, class_index) if classes else np.full(len(members), -1, dtype=np.int32)
    if instants:
        for u in range(len(by_first)):
            found = [instants[i] for i in members[unit_starts[u]:unit_starts[u + 1]].tolist() if i in instants]
            if found:
                timestamps[u] = max(found)
    return splitting.Units(len(table.ids), members, unit_starts, labels, fixed, keys, timestamps, table.key)


def _near_duplicates(cfg: DataConfig, table: Table, links: list[list[int]]) -> np.ndarray:
    """Confirmed near-duplicate pairs among the included samples with pictures (dedup.near_duplicates),
    reported one finding per group; groups with different labels are quarantined like conflicting
    duplicates. Appends each kept group to `links`; returns the confirmed pairs as sample indices."""

    # one picture per distinct content: exact copies are linked by their hash already, and 10,000 copies of one
    # blank frame would otherwise make 50 million candidate pairs
    included = np.array(table.included(), dtype=np.int64)
    copies = ContentGroups(table, included[table.pictures.present[included]])
    candidates = copies.firsts
    if len(candidates) < 2:
        return np.zeros((0, 2), dtype=np.int64)
    found = near_duplicates(table.phash[candidates], table.pictures.of(candidates), cfg.near_duplicate_distance, cfg.near_duplicate_difference)
    pairs = candidates[found.pairs] if len(found.pairs) else np.zeros((0, 2), dtype=np.int64)
    difference_of = {(int(a), int(b)): float(d) for (a, b), d in zip(pairs, found.differences)}
    for component in found.components:
        members = sorted(i for k in component for i in copies.members(k))
        inside = [(int(a), int(b)) for a, b in pairs[np.isin(pairs[:, 0], members)][:2]]  # a pair never leaves its group (of representatives)
        examples = "; ".join(f"{table.ids[a]} ~ {table.ids[b]} (difference {difference_of[(a, b)]:.3f})" for a, b in inside[:2])
        labels = {table.labels[i] for i in members}
        if len(labels) > 1:
            shown = ", ".join(f"{table.ids[i]}={table.labels[i]}" for i in members[:6])
            table.add("conflicting_near_duplicate", members, f"the same picture with different labels ({shown}); e.g. {examples}", exclude=True)
            if not table.keep_usable:
                continue
        else:
            table.add("near_duplicate", members, f"{len(members)} copies of one picture (e.g. {examples}); kept together in one split")
        links.append(members)
        for i in members:
            table.units_of[i] = "near-duplicate group"
        if len(members) > cfg.max_cluster_size:
            table.add("near_duplicate_cluster_capped", members,
                      f"a near-duplicate group of {len(members)} samples (more than data.max_cluster_size {cfg.max_cluster_size}), e.g. {examples}; "
                      "check the data, or lower data.near_duplicate_difference")
    return pairs


def _instants(cfg: DataConfig, table: Table) -> dict[int, int]:
    """Under data.split_by: time, each included sample's timestamp as an instant (split.parse_instant), the count
    of each format it was written in kept on the table (`timestamp_formats`, recorded with the achieved split); a
    value that is not a timestamp is a `bad_timestamp` finding that quarantines its sample."""
    instants: dict[int, int] = {}
    if cfg.split_by != "time":
        return instants
    for i in table.included():
        value = table.timestamps[i]
        if not value:
            continue
        try:
            instants[i], kind = splitting.parse_instant(value)
        except ValueError as err:
            table.add("bad_timestamp", [i], f"{err}; the sample is quarantined, since it cannot be placed in time", exclude=True)
            continue
        table.timestamp_formats[kind] += 1
    return instants


def former_version(cfg: DataConfig, versions: Path) -> Optional[Path]:
    """The stored data version data.test_from names (full id or unique prefix), checked like every open; None
    when the key is not set. A missing or ambiguous one is a usage error naming the key."""
    ref = getattr(cfg, "test_from", None)
    if ref is None:
        return None
    if not re.fullmatch(r"[0-9a-f]{4,64}", ref):  # the config checks it; a value set in code or read from a record may not be
        raise UserError(f"data.test_from: {ref!r}: expected a data version id or a prefix of it (4 to 64 lowercase hex digits)")
    stored = sorted(p for p in versions.glob(f"{ref}*") if (p / "version.json").is_file()) if versions.is_dir() else []
    if not stored:
        raise UserError(f"data.test_from: {ref!r}: no data version with this id or prefix in {versions}; give the id of a version "
                        "stored in this workspace (`veritrain data report ID` shows one), or import the run that used it with --with-data")
    if len(stored) > 1:
        raise UserError(f"data.test_from: {ref!r}: matches {len(stored)} data versions ({', '.join(p.name[:12] for p in stored[:3])}); give a longer prefix or the full id")
    check_version(stored[0])
    return stored[0]


@dataclass
class _Former:
    """What data.test_from's version says about today's samples."""

    version: str
    matched_by: str  # "key and <hash>": by either (its manifest has a key column, recipe 4 on), or the content hash only
    split_of: dict[int, str]  # sample index → its split in that version (samples it placed; quarantined ones are new)


def mark_former_splits(folder: Path, table: Table, units: splitting.Units) -> _Former:
    """Give each unit the splits its members had in data.test_from's version (`Unit.former`), matching samples by
    key and by content hash (the most protected split where they disagree), so a sample whose id was renamed keeps
    its former split; a version of recipe 3 or before has no key column, so there the content hash alone matches."""
    info = json.loads((folder / "version.json").read_text(encoding="utf-8"))
    if info.get("hash_algorithm") != DATA_HASH_ALGORITHM:
        raise UserError(f"data.test_from: {folder.name[:12]}: hashes samples with {info.get('hash_algorithm')!r}, not {DATA_HASH_ALGORITHM}; "
                        "its samples cannot be matched to these, give a version prepared by this veritrain")
    with open(folder / "manifest.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    by_key = bool(rows) and "key" in rows[0]
    former_by_key: dict[str, str] = {}
    former_by_content: dict[str, str] = {}
    for row in rows:
        if row["status"] == "ok" and row["split"] in SPLITS:
            # copies of one content share a key and a split; should they not, the most protected split counts
            for table_of, key in ((former_by_key, (row["key"] if by_key else "") or row[DATA_HASH_ALGORITHM]),
                                  (former_by_content, row[DATA_HASH_ALGORITHM])):
                if key and (key not in table_of or SPLIT_PRIORITY[row["split"]] < SPLIT_PRIORITY[table_of[key]]):
                    table_of[key] = row["split"]
    split_of = {}
    for u, unit in enumerate(units):
        for i in unit.members:
            # by key, and by content as well: a renamed id does not move a former test sample (recipe 6 on)
            found = [split for split in (former_by_key.get(table.key(i)), former_by_content.get(table.hashes[i] or ""))
                     if split is not None]
            if found:
                split_of[i] = min(found, key=SPLIT_PRIORITY.__getitem__)
        units.set_former(u, frozenset(split_of[i] for i in unit.members if i in split_of))
    return _Former(folder.name, f"key and {DATA_HASH_ALGORITHM}" if by_key else DATA_HASH_ALGORITHM, split_of)


def test_from_outcome(cfg: DataConfig, former: _Former, table: Table, units: splitting.Units,
                       assigned: Placement) -> dict[str, Any]:
    """What data.test_from did, bound with the achieved split: former test samples kept in test, former train/val
    samples kept out of the test split the hash gave them, and each group that mixes the two (`test_from_leak`:
    kept out of test, so its former test members leave it; data.on_split_skew decides whether that stops)."""
    outcome: dict[str, Any] = {"version": former.version, "matched_by": former.matched_by,
                               "former_test_samples": 0, "kept_in_test": 0, "kept_out_of_test": 0, "leaks": []}
    ratios = splitting.free_ratios(cfg.split_ratios, {u.fixed for u in units if u.fixed})  # as splitting.assign places
    for unit in units:
        placed = [i for i in unit.members if i in assigned]
        earlier = [i for i in placed if i in former.split_of]
        outcome["former_test_samples"] += sum(1 for i in earlier if former.split_of[i] == "test")
        outcome["kept_in_test"] += sum(1 for i in earlier if former.split_of[i] == "test" and assigned[i] == "test")
        if unit.fixed is not None or not placed:
            continue
        if unit.former & {"train", "val"} and splitting.place(unit.key, ratios, cfg.split_seed) == "test":
            outcome["kept_out_of_test"] += len(placed)  # the hash said test; formerly trained on, so kept where it was
        if "test" in unit.former and unit.former & {"train", "val"}:
            tested = [i for i in unit.members if former.split_of.get(i) == "test"]
            trained = [i for i in unit.members if former.split_of.get(i) in ("train", "val")]
            why = table.units_of.get(unit.members[0], "tied samples")
            reason = (f"a unit of {len(unit.members)} samples kept together ({why}) holds {len(tested)} former test sample(s) of data "
                      f"version {former.version[:12]} (e.g. {table.ids[tested[0]]}) and {len(trained)} former train/val one(s) (e.g. {table.ids[trained[0]]}); it went to {assigned[placed[0]]}, "
                      "so no former training sample enters test and those test samples leave it")
            outcome["leaks"].append(reason)
            table.add("test_from_leak", tested + trained, reason)
    return outcome


def assign_splits(cfg: DataConfig, table: Table, units: splitting.Units, classes: Optional[list[str]]) -> splitting.Placement:
    splits = splitting.assign(units, cfg.split_ratios, cfg.split_seed, by_time=cfg.split_by == "time", class_names=classes)
    assigned = splitting.Placement(len(table.ids))
    for unit, split in zip(units, splits):
        for i in unit.members:
            if i not in table.excluded:
                assigned[i] = split
    return assigned


def count_leakage_pairs(table: Table, assigned: Placement, near_pairs: np.ndarray) -> int:
    """Pairs of identical samples, or confirmed near-duplicate pairs, that sit in different splits."""
    contents = ContentGroups(table, np.fromiter(assigned, dtype=np.int64, count=len(assigned)))
    pairs = 0
    for k in contents.copied():
        values = list(Counter(assigned[i] for i in contents.members(k)).values())
        pairs += sum(a * b for k, a in enumerate(values) for b in values[k + 1 :])
    for a, b in near_pairs.tolist():
        if table.hashes[a] != table.hashes[b] and a in assigned and b in assigned and assigned[a] != assigned[b]:
            pairs += 1
    return pairs


def measure_achieved_split(cfg: DataConfig, table: Table, units: splitting.Units, assigned: Placement,
                    classes: Optional[list[str]]) -> dict[str, Any]:
    """Each class's achieved train/val/test fractions over the samples the split was free to place, against the
    ratios they were meant to follow, and the same over all those samples together (`whole`). Each sample's place
    follows the hash of its key, so a class of n samples lands within a few σ = √(p(1−p)/n) of each ratio p by
    chance alone: a class further off than max(data.split_tolerance, 3σ) in some split is a `split_skew` finding
    that names what forced it, and so is the whole set further off than max(data.split_tolerance, 3σ) (the
    tolerance, once there are a few thousand samples). Every gap is also given in σ. Fixed splits and time splits
    are not judged."""
    fixed_present = {u.fixed for u in units if u.fixed}
    wanted = splitting.free_ratios(cfg.split_ratios, fixed_present)  # type: ignore[arg-type]
    result: dict[str, Any] = {"asked": dict(zip(SPLITS, cfg.split_ratios)), "wanted_for_free_samples": dict(zip(SPLITS, wanted)),
                              "judged": cfg.split_by == "random" and classes is not None, "per_class": {}, "whole": None, "skewed": [],
                              "bound": "max(data.split_tolerance, 3 sigma), sigma = sqrt(p (1 - p) / n)"}
    if cfg.split_by == "time":  # how the timestamps were read, so the order can be checked (recipe 6 on)
        result["timestamps"] = {"formats": dict(sorted(table.timestamp_formats.items())), "ordered_by": "instant (UTC)",
                                "without_timestamp": sum(1 for i in assigned if not table.timestamps[i])}
    if not result["judged"]:
        return result
    unit_of = units.unit_of_row
    free: dict[str, list[int]] = defaultdict(list)
    for i in assigned:
        if unit_of[i] >= 0 and units.fixed[unit_of[i]] < 0:
            free[table.labels[i] or ""].append(i)
    for name in classes or []:
        members = free.get(name, [])
        if not members:
            continue
        judged = _judged_fractions(cfg, [assigned[i] for i in members], wanted)
        result["per_class"][name] = judged
        if judged["skewed"]:
            # the biggest tied unit of this class in the split that got too many: what forced the skew
            over = max(SPLITS, key=lambda s: judged[s] - wanted[SPLITS.index(s)])
            tied = [units[int(unit_of[i])] for i in members if assigned[i] == over and units.size(int(unit_of[i])) > 1]
            biggest = max(tied, key=lambda u: len(u.members), default=None)
            cause = (f"a unit of {len(biggest.members)} samples that must stay together ({table.units_of.get(biggest.members[0], 'tied samples')}, "
                     f"e.g. {table.ids[biggest.members[0]]}) went to {over}") if biggest else "no group forced it: the hash of the keys placed them so by chance, another data.split_seed places every sample anew"
            reason = (f"class {name!r}: train/val/test {_shown_fractions(judged)} of {len(members)} samples, "
                      f"asked {' / '.join(f'{w:.2f}' for w in wanted)} ({_shown_gaps(judged)}; allowed max(data.split_tolerance "
                      f"{cfg.split_tolerance:g}, 3σ)); {cause}")
            result["skewed"].append(reason)
            table.add("split_skew", [], reason)
    everything = [i for members in free.values() for i in members]
    if everything:
        whole = result["whole"] = _judged_fractions(cfg, [assigned[i] for i in everything], wanted)
        if whole["skewed"]:
            reason = (f"all classes together: train/val/test {_shown_fractions(whole)} of {len(everything)} samples, "
                      f"asked {' / '.join(f'{w:.2f}' for w in wanted)} ({_shown_gaps(whole)}; allowed max(data.split_tolerance "
                      f"{cfg.split_tolerance:g}, 3σ)); large groups tip the whole split")
            result["skewed"].append(reason)
            table.add("split_skew", [], reason)
    for name, found in result["per_class"].items():
        found.pop("skewed")
    if result["whole"]:
        result["whole"].pop("skewed")
    return result


def _judged_fractions(cfg: DataConfig, splits: list[str], wanted: list[float]) -> dict[str, Any]:
    """Achieved fractions of `splits` against `wanted`: per split the gap, σ = √(p(1−p)/n), the gap in σ and what is
    allowed, max(data.split_tolerance, 3σ); `largest_gap` and `allowed` are those of the split furthest past (or
    nearest to) its bound."""
    n = len(splits)
    counts = Counter(splits)
    fractions = {s: counts[s] / n for s in SPLITS}
    gap = {s: fractions[s] - w for s, w in zip(SPLITS, wanted)}
    sigma = {s: math.sqrt(w * (1 - w) / n) for s, w in zip(SPLITS, wanted)}
    allowed = {s: max(cfg.split_tolerance, 3 * sigma[s]) for s in SPLITS}
    worst = max(SPLITS, key=lambda s: abs(gap[s]) - allowed[s])
    return {"samples": n, **{s: round(fractions[s], 4) for s in SPLITS},
            "largest_gap": round(abs(gap[worst]), 4), "allowed": round(allowed[worst], 4),
            "gap_sigma": {s: round(gap[s] / sigma[s], 2) if sigma[s] > 0 else 0.0 for s in SPLITS},
            "skewed": any(abs(gap[s]) > allowed[s] + 1e-12 for s in SPLITS)}


def _shown_fractions(judged: dict[str, Any]) -> str:
    return " / ".join(f"{judged[s]:.2f}" for s in SPLITS)


def _shown_gaps(judged: dict[str, Any]) -> str:
    return "gaps " + " / ".join(f"{judged['gap_sigma'][s]:+.1f}σ" for s in SPLITS)


def check_balance(cfg: DataConfig, table: Table, assigned: Placement, classes: Optional[list[str]]) -> None:
    """`imbalance` when the largest class has at least data.imbalance_ratio times the samples of the smallest,
    over the whole set and within each split."""
    if not classes:
        return
    counts = Counter(table.labels[i] for i in assigned)
    empty = [c for c in classes if counts[c] == 0]
    if empty:
        raise RunFailed(f"data: class(es) {', '.join(map(repr, empty))} have no usable samples (too_small); add samples, fix the quarantined ones, or drop them from data.classes")
    scopes = [("all splits", counts)] + [(name, Counter(table.labels[i] for i, s in assigned.items() if s == name)) for name in SPLITS]
    for scope, found in scopes:
        present = [c for c in classes if found[c] > 0]
        if not present:
            continue
        big = max(present, key=lambda c: found[c])
        small = min(present, key=lambda c: found[c])
        ratio = found[big] / found[small]
        if ratio >= cfg.imbalance_ratio:
            table.add("imbalance", [], f"{scope}: class {big!r} has {found[big]} samples, {small!r} has {found[small]} "
                      f"(ratio {ratio:.1f} ≥ data.imbalance_ratio {cfg.imbalance_ratio:g})")


def label_issues_and_outliers(cfg: DataConfig, table: Table, assigned: Placement, classes: Optional[list[str]]) -> dict[str, Any]:
    """`label_issue` and `outlier` findings over the placed samples' thumbnails (data.label_issues).

    With data.on_label_issue: quarantine (and data.on_bad_file other than warn, which keeps every usable
    sample), label issues in train and val are removed, judged against train and val only, so no test label
    decides what is trained on; test-split label issues are judged against all the data and only reported,
    since removing them would inflate test accuracy. Returns the method as recorded.
    """

    placed = [i for i in sorted(assigned) if i in table.thumbs]
    if not classes or len(placed) < 2:
        return {"skipped": "no classes" if not classes else "fewer than two samples"}
    class_index = {c: k for k, c in enumerate(classes)}
    quarantine = cfg.on_label_issue == "quarantine" and not table.keep_usable

    def find(rows: list[int]) -> Any:
        return label_issues.find_label_issues_and_outliers(
            table.thumbs.of(rows), np.array([class_index[table.label(i)] for i in rows], dtype=np.int64),
            len(classes), cfg.split_seed)

    found = find(placed)
    issues = [(placed[flag.index], flag) for flag in found.label_issues]
    if quarantine:  # train and val decided without the test split; the test split's own issues from the whole run
        training = [i for i in placed if assigned[i] != "test"]
        from_training = [(training[f.index], f) for f in find(training).label_issues] if len(training) >= 2 else []
        issues = sorted(from_training + [(i, f) for i, f in issues if assigned[i] == "test"], key=lambda item: -item[1].score)
    for rank, (i, flag) in enumerate(issues, 1):
        suggested = classes[flag.suggested] if flag.suggested is not None else "?"
        where = assigned[i]
        removed = quarantine and where != "test"
        # the reason is stored (quarantine.csv): no float-derived score or rank in it, those are details
        finding = table.add("label_issue", [i], f"labelled {table.labels[i]!r}, the data points to {suggested!r} ({where} split)", exclude=removed)
        finding.details = {"label": table.labels[i], "suggested": suggested, "score": round(flag.score, 6), "rank": rank, "split": where}
        if removed:
            finding.severity = "quarantine"
            del assigned[i]
    for rank, flag in enumerate(found.outliers, 1):
        i = placed[flag.index]
        finding = table.add("outlier", [i], f"far from everything else in class {table.labels[i]!r} and in the data")
        finding.details = {"label": table.labels[i], "score": round(flag.score, 6), "rank": rank, "split": assigned.get(i)}
    return found.method


def apply_policy(cfg: DataConfig, table: Table) -> None:
    """data.on_bad_file: fail stops here, listing what would have been quarantined."""
    bad = [f for f in table.findings if f.severity == "quarantine"]
    if cfg.on_bad_file == "fail" and bad:
        listed = "; ".join(f"{', '.join(f.samples[:3])}: {f.kind}" for f in bad[:5])
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise RunFailed(f"data: {len(bad)} bad sample finding(s) with data.on_bad_file: fail: {listed}{more}; fix or remove them, or use on_bad_file: quarantine")
