"""verify tells unchanged raw data from its hashes (no decoding), names a changed raw file, and keeps checkpoint
state hashes by the file's SHA-256; folder sources take image files only from data recipe 5 on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from datafixtures import good_imagefolder
from veritrain.core.config import load_config
from veritrain.data import identity, prepare


def _config(root: Path):
    resolved = load_config(None, ["data.source=imagefolder", f"data.root={root}", "data.image_size=[32,32]", "data.channels=3",
                                  "data.on_split_skew=warn", "data.workers=1"])  # no worker processes to start for 26 files
    return resolved.config.data, resolved.data_paths


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """An imagefolder of 24 PNGs with a README.txt and a Thumbs.db, prepared under this recipe and under recipe 4."""
    base = tmp_path_factory.mktemp("raw")
    root = good_imagefolder(base / "images")
    (root / "README.txt").write_text("where these pictures come from\n")
    (root / "cat" / "Thumbs.db").write_bytes(b"\x00thumbnail cache")
    cfg, paths = _config(root)
    state = base / "ws" / ".veritrain"
    current = prepare.run(cfg, paths, state)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(identity, "FORMAT_VERSION", 4)  # every reader looks the recipe up there
        earlier = prepare.run(cfg, paths, state)
    return {"root": root, "cfg": cfg, "paths": paths, "state": state, "current": current, "earlier": earlier}


def test_recipe_5_ignores_files_that_are_not_images_and_lists_them_recipe_4_kept_them_as_samples(folder):
    current, earlier = folder["current"], folder["earlier"]
    assert current.info["format"] == prepare.FORMAT_VERSION >= 5 and earlier.info["format"] == 4 and current.version != earlier.version
    assert current.info["ignored"] == {"count": 2, "files": ["README.txt", "cat/Thumbs.db"]}
    report = current.report()
    assert report["ignored"]["files"] == ["README.txt", "cat/Thumbs.db"] and not report["quarantined"]
    assert "## Ignored files" in (current.path / "data_report.md").read_text() and "- cat/Thumbs.db" in (current.path / "data_report.md").read_text()
    assert sum(current.counts.values()) == 24
    quarantined = {q["sample_id"]: q["kind"] for q in earlier.report()["quarantined"]}
    assert quarantined["cat/Thumbs.db"] == "undecodable" and "README.txt" in quarantined  # the earlier recipe's samples, kept
    assert "listing_sha256" in current.info and "listing_sha256" not in earlier.info
    assert not prepare.is_image_name("notes.TXT") and prepare.is_image_name("IMG_0001.JPG")


def test_unchanged_raw_data_is_told_from_its_hashes_without_decoding_under_either_recipe(folder, monkeypatch):
    def no_decoding(*args, **kwargs):
        raise AssertionError("decoded")

    from veritrain.data import validate

    monkeypatch.setattr(validate, "header_counts", no_decoding)
    monkeypatch.setattr(validate, "checks_for", no_decoding)
    monkeypatch.setattr(validate, "decode_into", no_decoding)
    monkeypatch.setattr(validate, "decoded", no_decoding)
    for version, samples in ((folder["current"], 24), (folder["earlier"], 26)):
        raw = prepare.raw_data_check(folder["cfg"], folder["paths"], version.path, folder["state"] / "data")
        assert raw.unchanged and raw.files and raw.samples == samples and raw.changed is None, raw
    monkeypatch.setattr(identity, "decoder_versions", lambda: {"pillow": "0.0", "numpy": "0.0"})
    raw = prepare.raw_data_check(folder["cfg"], folder["paths"], folder["current"].path, folder["state"] / "data")
    assert not raw.unchanged and raw.undecided.startswith("decoders changed: pillow") and raw.changed is None


def test_one_changed_raw_file_is_named(folder, tmp_path):
    image = folder["root"] / "dog" / "dog_07.png"
    original = image.read_bytes()
    try:
        image.write_bytes(original + b"\x00")  # one byte more: same pixels, other bytes
        raw = prepare.raw_data_check(folder["cfg"], folder["paths"], folder["current"].path, folder["state"] / "data")
        assert not raw.unchanged and raw.changed.startswith("dog/dog_07.png: its bytes hash to "), raw
        image.unlink()
        raw = prepare.raw_data_check(folder["cfg"], folder["paths"], folder["current"].path, folder["state"] / "data")
        assert raw.changed == "dog/dog_07.png: in the manifest, no longer in the raw data"
    finally:
        image.write_bytes(original)
    (folder["root"] / "cat" / "notes.md").write_text("not a picture")  # ignored under recipe 5, a new sample under recipe 4
    try:
        assert prepare.raw_data_check(folder["cfg"], folder["paths"], folder["current"].path, folder["state"] / "data").unchanged
        raw = prepare.raw_data_check(folder["cfg"], folder["paths"], folder["earlier"].path, folder["state"] / "data")
        assert raw.unchanged and raw.grown == 1 and "1 sample(s) added since" in raw.not_compared  # growth is not a change
    finally:
        (folder["root"] / "cat" / "notes.md").unlink()


def test_a_run_verifies_after_new_raw_files_are_added_and_fails_when_one_it_used_changes(cli, tmp_path):
    from datafixtures import good_imagefolder, save, structured_image

    root = good_imagefolder(tmp_path / "images", per_class=15)
    config = tmp_path / "c.yaml"
    config.write_text("data:\n  source: imagefolder\n  root: images\nmodel:\n  name: mlp\n  hidden: [8]\ntrain:\n  epochs: 1\n")
    run_id = cli("train", str(config), "--workdir", str(tmp_path), "--json").json()["run_id"]
    for index in range(3):  # the user's folder grows, as docs/own-data.md says to add data
        save(structured_image(900 + index), root / "cat" / f"new_{index}.png")
    grown = cli("verify", run_id, "--workdir", str(tmp_path), "--json")
    assert grown.code == 0, grown.stdout
    assert "3 added since, which data version" in grown.json()["raw_data"] and "(growth, not a change)" in grown.json()["raw_data"]
    used = sorted((root / "dog").glob("*.png"))[0]
    used.write_bytes(used.read_bytes() + b"\x00")
    changed = cli("verify", run_id, "--workdir", str(tmp_path), "--json").json()
    assert not changed["ok"] and [p["kind"] for p in changed["problems"]] == ["data_changed"]
    assert f"dog/{used.name}: its bytes hash to" in changed["problems"][0]["detail"]
