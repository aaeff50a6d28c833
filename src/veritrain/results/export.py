"""The export stage: the trained model as ONNX, TorchScript (or torch.export `.pt2` where a model
cannot be scripted) and safetensors in `export/`, with `model.json` describing inputs, preprocessing,
classes, the architecture, how the source's raw values became images, and provenance — and a parity
certificate: every exported form must give the same answers as the trained model on real test samples
(`export/parity.json`), or the export fails. The ONNX and safetensors files carry the essentials of
model.json in their own metadata, so each is usable on its own.

    veritrain export latest
    veritrain export latest --format onnx      # refresh ONNX; the other formats stay when from the same checkpoint
    veritrain predict latest some/image.png --top 3
    python examples/rebuild_from_export.py runs/<id>/export   # the model rebuilt with torch alone
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import struct
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence, cast

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from veritrain.core import signing_keys, trusted_keys
from veritrain.core.errors import RunFailed, UserError
from veritrain.core.hashing import sha256_file
from veritrain.core.signing_keys import sealing_key
from veritrain.core.task_registry import serving_command
from veritrain.records.record import RECORD_FILE, SEAL_FILE, read_record
from veritrain.results import export_signing
from veritrain.results.model_card import model_card
from veritrain.tasks import split_rows
from veritrain.train import trajectory

if TYPE_CHECKING:
    import torch

    from veritrain.core.config import ModelConfig, RunConfig
    from veritrain.core.trusted_keys import TrustedKeys
    from veritrain.data.identity import DataVersion
    from veritrain.records.record import Record
    from veritrain.tasks import Task

log = logging.getLogger("veritrain")


class ParityFailed(RunFailed):
    """An export that does not give the trained model's answers; `parity` is what parity.json holds."""

    def __init__(self, message: str, parity: dict[str, Any]):
        super().__init__(message)
        self.parity = parity

MODEL_JSON_VERSION = 1  # only fields were added since 1: readers of version 1 read every later file
FILES = {"onnx": "model.onnx", "torchscript": "model.torchscript.pt", "torch_export": "model.pt2", "safetensors": "model.safetensors"}
# the format a file answers to in `--format`: a model TorchScript cannot script is written as torch.export instead
REQUESTED_AS = {"onnx": "onnx", "torchscript": "torchscript", "torch_export": "torchscript", "safetensors": "safetensors"}
# what ties an exported file to its origin: a file made with any of these different is removed, never kept
ORIGIN_FIELDS = ("checkpoint_sha256", "data_version", "source_run")
CARD_FILE = "README.md"  # the Hugging Face model card (veritrain.results.model_card)
SIGNATURE_FILE = "model.sig"  # the OpenSSF model signature of the folder (veritrain.results.export_signing)


def run(cfg: RunConfig, data: DataVersion, task: Task, run_dir: Path, which: Optional[str] = None, formats: Optional[Sequence[str]] = None,
        out_dir: Optional[Path] = None, record: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    """Stage entry: export the checkpoint `which` (see `evaluate.checkpoint_path`) in `formats` (default `export.formats`)
    and check parity of every format in export/. Formats not asked for stay when model.json shows they were made from
    the same checkpoint, data version and run, and their files still match its hashes; any other model file there is
    removed and named in one log line. Returns model.json's content plus `kept` (the formats kept as they were) and
    `removed` (format, file and reason per removed file). Raises RunFailed when the model's outputs are not finite
    (before export/ is touched) and when parity fails (files are kept). With `out_dir` (an amend of a finished run
    stages its new export/ beside the run) the files are written there, the kept ones linked or copied in, and the
    run's export/ is only read. Once parity passed, `record` (the run's record as it is now) gives the model card
    README.md, and the folder is signed (OpenSSF model signing, model.sig) with the signing key when there is one;
    without `record` (a smoke test's export) there is neither."""
    import torch

    from veritrain.core.config import config_hash
    from veritrain.results.evaluate import checkpoint_path, load_model

    # TorchScript and the TorchScript-based ONNX exporter warn that they are deprecated on every call;
    # they are what works with onnxruntime without extra packages, so keep the console clean
    warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.(onnx|jit)")
    warnings.filterwarnings("ignore", message=r".*(TorchScript|torch\.jit).*", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message=r"Converting a tensor to a Python boolean")  # the ONNX tracer on a model's Python checks (a GPT's context)
    formats = list(formats or cfg.export.formats)
    path = checkpoint_path(cfg, run_dir, which)
    model, state = load_model(cfg, data, task, path, torch.device("cpu"))
    model = model.float().eval()
    reference = reference_outputs(cfg, data, task, model)  # refuses NaN/inf outputs before export/ is touched
    existing = export_folder(run_dir, record) if record is not None else run_dir / "export"  # a run's, or its amendment's
    out = out_dir or existing
    out.mkdir(exist_ok=True)
    test_rows = split_rows(task, data, "test")
    example, _ = task.batch(data, test_rows[:2] if len(test_rows) else split_rows(task, data, "train")[:2],
                            torch.device("cpu"), False, torch.Generator())
    with torch.no_grad():
        example_logits = model(example)
    spec = task.export_spec(cfg, model, data, example)  # what the task says its export is; None: the defaults below
    example = spec.example
    description: dict[str, Any] = {
        "format_version": MODEL_JSON_VERSION,
        "source_run": run_dir.name,
        "data_version": data.version,
        "config_hash": config_hash(cfg),
        "task": cfg.task,
        "model": cfg.model.target or cfg.model.name,
        "architecture": spec.architecture or architecture(cfg.model, model, list(example.shape[1:]), int(example_logits.shape[1])),
        "checkpoint": path.relative_to(run_dir).as_posix() if path.is_relative_to(run_dir) else str(path),
        "checkpoint_sha256": sha256_file(path),
        "checkpoint_epoch": state["loop"]["epochs_done"],
        "checkpoint_state_sha256": trajectory.state_sha256(state),  # which trajectory entry it is (record.json names it)
        "classes": data.classes,
        "input": spec.input or {"name": "input", "shape": [None, *example.shape[1:]], "dtype": "float32", "batch": "dynamic"},
        "output": spec.output or {"name": "logits", "shape": [None, *example_logits.shape[1:]], "dtype": "float32"},
        # how the source's raw values became the uint8 images `preprocessing` starts from
        "source_mapping": spec.source_mapping or source_mapping(data),
        # how raw inputs become the model's input; only the task knows (images: decode, resize, normalize)
        "preprocessing": spec.preprocessing if spec.preprocessing is not None else {"normalization": data.info["normalization"]},
    }
    metadata = file_metadata(description, data)
    previous = previous_description(existing)
    kept, removed = _keep_or_remove(existing, previous, description, {REQUESTED_AS[name] for name in formats}, out)
    for stale in ("model.json", "parity.json", CARD_FILE, SIGNATURE_FILE):  # rewritten below; until then nothing describes files that may change
        (out / stale).unlink(missing_ok=True)
    written: dict[str, str] = {}
    if "onnx" in formats:
        torch.onnx.export(
            model, (example,), str(out / FILES["onnx"]), input_names=["input"], output_names=["logits"],
            dynamic_axes=spec.dynamic_axes or {"input": {0: "batch"}, "logits": {0: "batch"}}, opset_version=cfg.export.opset, dynamo=False,
        )
        set_onnx_metadata(out / FILES["onnx"], metadata)
        written["onnx"] = FILES["onnx"]
    if "torchscript" in formats:
        try:
            torch.jit.script(model).save(str(out / FILES["torchscript"]))
            written["torchscript"] = FILES["torchscript"]
        except Exception as err:  # models using Python features TorchScript lacks
            log.warning("export: TorchScript cannot script this model (%s); writing torch.export %s instead",
                        str(err).splitlines()[0], FILES["torch_export"])
            batch = torch.export.Dim("batch", min=1)
            program = torch.export.export(model, (example,), dynamic_shapes=({0: batch},))
            torch.export.save(program, str(out / FILES["torch_export"]))
            written["torch_export"] = FILES["torch_export"]
    if "safetensors" in formats:
        write_safetensors(out / FILES["safetensors"], model.state_dict(), metadata)
        written["safetensors"] = FILES["safetensors"]

    for name, source in spec.companions.items():  # files the model is used with (a tokenizer), copied beside it
        shutil.copyfile(source, out / name)
    files = {name: file for name, file in FILES.items() if name in written or name in kept}  # FILES order: stable model.json
    kept_formats = [name for name in files if name not in written]
    description["files"] = {name: {"file": file, "sha256": sha256_file(out / file)} for name, file in files.items()}
    description["onnx_opset"] = cfg.export.opset if "onnx" in written else previous.get("onnx_opset") if "onnx" in kept else None
    description["torch"] = torch.__version__
    description["parity"] = check_parity(cfg, data, task, model, out, files, reference=reference)
    shipped = record is not None and description["parity"]["passed"]  # a run's export (a smoke test's has no card or signature)
    key = sealing_key() if shipped else None
    # the files beside the model files: the card, and the signature over every file of the folder but itself
    description["non_model_files"] = [name for name in (CARD_FILE, SIGNATURE_FILE) if shipped and (name != SIGNATURE_FILE or key is not None)]
    description["companions"] = sorted(spec.companions)
    (out / "model.json").write_text(json.dumps(description, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    parity = description["parity"]
    if shipped and record is not None:
        (out / CARD_FILE).write_text(model_card(record, description, key.public.fingerprint if key else None), encoding="utf-8")
        if key is not None:
            export_signing.sign(out, key.private_path)
    agreement = ", ".join(f"{k} {v['agreement']:.4f}" for k, v in parity["formats"].items()) or "-"
    log.info("export: %s in %s%s; parity %s (max |Δlogit| %s%s)", ", ".join(written), existing,
             f" (kept from the same checkpoint: {', '.join(kept_formats)})" if kept_formats else "",
             "passed" if parity["passed"] else "FAILED",
             ", ".join(f"{k} {v['max_abs_diff']:.2e}" for k, v in parity["formats"].items()) or "-",
             f", argmax agreement {agreement}" if parity.get("min_agreement") is not None else "")
    if not parity["passed"]:
        raise ParityFailed(f"export: parity check failed ({parity['reason']}); see {existing / 'parity.json'}", parity)
    return {**description, "kept": kept_formats, "removed": removed}


def previous_description(out: Path) -> dict[str, Any]:
    """The model.json already in `out`, or {} when there is none (or it does not read as a JSON object)."""
    try:
        previous = json.loads((out / "model.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return previous if isinstance(previous, dict) else {}


def _keep_or_remove(out: Path, previous: dict[str, Any], description: dict[str, Any], requested: set[str],
                    staged: Optional[Path] = None) -> tuple[dict[str, str], list[dict[str, str]]]:
    """Decide for each model file already in `out`: the requested formats are deleted (written again next); a
    format not asked for is kept when the previous model.json lists it with the same origin (ORIGIN_FIELDS) and
    the file still has the hash listed there, else removed with the reason, logged in one line. Returns the kept
    formats (format → file) and the removed files. With `staged` another folder than `out`, nothing in `out` is
    deleted (the amend that stages the new export/ there removes what it does not hold) and the kept files are
    put in `staged`."""
    listed: dict[str, Any] = previous["files"] if isinstance(previous.get("files"), dict) else {}
    other_origin = [key for key in ORIGIN_FIELDS if previous.get(key) != description[key]]
    kept: dict[str, str] = {}
    removed: list[dict[str, str]] = []
    for name, file in FILES.items():
        path = out / file
        if not path.exists():
            continue
        if REQUESTED_AS[name] in requested:
            if staged in (None, out):
                path.unlink()  # replaced by this export
            continue
        entry = listed.get(name)
        if not isinstance(entry, dict) or entry.get("file") != file:
            reason = "not listed in the previous model.json, so its origin is unknown"
        elif other_origin == ["source_run"]:
            reason = f"made in run {previous.get('source_run')}, not {description['source_run']}"
        elif "checkpoint_sha256" in other_origin:
            reason = (f"made from another checkpoint ({previous.get('checkpoint')}, sha256 {str(previous.get('checkpoint_sha256'))[:12]}), "
                      f"not {description['checkpoint']} (sha256 {description['checkpoint_sha256'][:12]})")
        elif other_origin:
            reason = f"made with data version {str(previous.get('data_version'))[:12]}, not {description['data_version'][:12]}"
        elif sha256_file(path) != entry.get("sha256"):
            reason = "changed since it was exported (its SHA-256 is not the one in model.json)"
        else:
            kept[name] = file
            if staged not in (None, out):
                _link_or_copy(path, staged / file)
            continue
        if staged in (None, out):
            path.unlink()
        removed.append({"format": name, "file": file, "reason": reason})
    if removed:
        reasons: dict[str, list[str]] = {}
        for item in removed:
            reasons.setdefault(item["reason"], []).append(item["file"])
        log.warning("export: removed %s; export them again with %s", "; ".join(f"{', '.join(files)}: {reason}" for reason, files in reasons.items()),
                    " ".join(f"--format {REQUESTED_AS[item['format']]}" for item in removed))
    return kept, removed


def _link_or_copy(source: Path, target: Path) -> None:
    """A second name for a kept file (its bytes are only read from here on), or a copy where links are refused."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def architecture(model_cfg: ModelConfig, model: torch.nn.Module, input_shape: list[int], num_outputs: int) -> dict[str, Any]:
    """What builds the model again: for a built-in one every argument of `models.build` and its layers as plain
    operations with their state_dict keys; for a user model the factory, its kwargs (as recorded: as given,
    `${env:NAME}` references stay references) and its arguments."""
    from veritrain import models

    built = {"module": f"{type(model).__module__}.{type(model).__qualname__}", "input_shape": input_shape, "num_outputs": num_outputs,
             "parameters": int(sum(p.numel() for p in model.parameters()))}
    if model_cfg.target:
        # as recorded: `${env:NAME}` references kept (the model's reader resolves them)
        return {"name": None, "target": model_cfg.target, "kwargs": json.loads(json.dumps(model_cfg.kwargs)), **built,
                "rebuild": "call target(input_shape=input_shape, num_outputs=num_outputs, **kwargs) and load model.safetensors into it",
                "layers": None}
    layers = models.describe(model)
    section = model_cfg.model_dump(mode="json", exclude={"target", "kwargs"})  # the built-in model's name and keys: name, widths, hidden, dropout
    return {**section, **built,
            "rebuild": "veritrain.models.build(name, input_shape, num_outputs, widths, hidden, dropout), then load model.safetensors; "
            "without veritrain: the operations in `layers`, in order (examples/rebuild_from_export.py)",
            **(layers or {"layers": None})}


def source_mapping(data: DataVersion) -> dict[str, Any]:
    """How the data source's raw values became the uint8 H×W×C images of the data version (what `preprocessing`
    starts from), read from what the version recorded of its source and decoder."""
    recorded = data.info.get("preprocessing") or {}
    source = recorded.get("source") or {}
    target = recorded.get("target") or {}
    if len(data.info["input_shape"]) != 3:  # not images: the task's own arrays, as the version stores them
        return {"source": source.get("source"), "result": f"array of shape {list(data.info['input_shape'])} per sample, as the data version stores it",
                "recorded": source}
    h, w, c = data.info["input_shape"]
    result = {"source": source.get("source"), "result": f"uint8 array H×W×C = {h}×{w}×{c} ({'grey' if c == 1 else 'RGB'}), 0..255"}
    if source.get("source") == "digits" and source.get("pixel_scale") == "round(v * 255 / 16)":
        levels = np.arange(17, dtype=np.float64)
        return {**result, "raw": "scikit-learn load_digits pixel values: counts of set pixels in 4×4 cells, integers 0..16 (8×8 images)",
                "mapping": "numpy.rint(v * 255 / 16) as uint8 (round half to even: 8 → 128); one grey channel",
                # the same expression as the source: entry v is the uint8 value of raw value v
                "table": np.rint(levels * (255.0 / 16.0)).astype(np.uint8).tolist(), "recorded": source}
    if source.get("source") == "cifar10":
        return {**result, "raw": "CIFAR-10 python batches: each row of `data` is 3072 uint8 values, the 1024 red, then 1024 green, "
                "then 1024 blue values of a 32×32 image in row-major order",
                "mapping": "the bytes as they are (no scaling); each row reshaped to 3×32×32 and transposed to 32×32×3 (HWC, RGB)",
                "recorded": source}
    if "convert" in target:  # image files (imagefolder, csv, labelmap): decoded and checked by the data stage
        mode = "L" if c == 1 else "RGB"
        pillow = " ".join(filter(None, ["Pillow", (data.info.get("decoders") or {}).get("pillow")]))
        size = f"{w}×{h} (W×H)"
        shape = (f"a file not in mode {mode} is converted with Image.convert('{mode}') and one not {size} resized with "
                 "Image.BILINEAR (data.convert: true)" if target.get("convert") else
                 f"a file is used as it is when in mode {mode} and {size}, else quarantined as bad_shape (data.convert: false)")
        return {**result, "raw": "image files (any format Pillow decodes)",
                "mapping": f"decoded with {pillow} (Image.open, then load); {shape}; "
                f"EXIF orientation {target.get('exif_orientation', 'not applied')}; numpy.asarray as uint8 H×W×C",
                "recorded": {**source, **target}}
    return {**result, "raw": "as the data source recorded it", "mapping": "see `recorded`", "recorded": {**source, **target}}


def file_metadata(description: dict[str, Any], data: DataVersion) -> dict[str, str]:
    """What the ONNX `metadata_props` and the safetensors `__metadata__` carry (text → text; lists as JSON)."""
    prep = description["preprocessing"]
    normalization = data.info.get("normalization") or {}
    shape = description["input"]["shape"]
    entries = {
        "classes": json.dumps(description["classes"], ensure_ascii=False),
        "mean": json.dumps(prep.get("mean", normalization.get("mean"))),
        "std": json.dumps(prep.get("std", normalization.get("std"))),
        "input_layout": prep.get("layout") or ("NCHW" if len(shape) == 4 else None),
        "tokenizer_sha256": (prep.get("tokenizer") or {}).get("sha256"),
        "input_shape": json.dumps(shape),  # null: any batch size
        "source_run": description["source_run"],
        "data_version": description["data_version"],
        "config_hash": description["config_hash"],
        "checkpoint_sha256": description["checkpoint_sha256"],
        "model_json_format_version": str(description["format_version"]),
    }
    return {key: value for key, value in sorted(entries.items()) if value is not None}


def set_onnx_metadata(path: Path, metadata: dict[str, str]) -> None:
    """Replace the ONNX model's metadata_props with `metadata`, in key order (the same model gives the same bytes)."""
    import onnx

    proto = onnx.load(str(path))
    del proto.metadata_props[:]
    for key, value in sorted(metadata.items()):
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(proto, str(path))


SAFETENSORS_DTYPES = {"float32": "F32", "float64": "F64", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
                      "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL"}


def write_safetensors(path: Path, tensors: dict[str, Any], metadata: dict[str, str]) -> None:
    """A safetensors file whose bytes depend only on `tensors` and `metadata`: its header is written here, keys
    sorted, because the library orders `__metadata__` by a hash seeded per process, so the same model would get
    another file hash on every export. The layout is the format's own: 8-byte little-endian header length, the
    JSON header (padded with spaces to 8 bytes), the tensors' bytes back to back (little-endian, as torch stores
    them on every platform it runs on)."""
    import torch

    header: dict[str, Any] = {"__metadata__": dict(sorted(metadata.items()))}
    chunks: list[bytes] = []
    offset = 0
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        raw = tensor.reshape(-1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": SAFETENSORS_DTYPES[str(tensor.dtype).removeprefix("torch.")], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in chunks:
            f.write(raw)


def reference_outputs(cfg: RunConfig, data: DataVersion, task: Task, model: torch.nn.Module) -> tuple[str, torch.Tensor, torch.Tensor]:
    """(split, inputs, outputs) of the trained model on the parity samples: up to `export.parity_samples` of the
    test split (val when test is empty). RunFailed when any output is NaN or infinite: comparing NaNs certifies nothing."""
    import torch

    split = "test" if len(split_rows(task, data, "test")) else "val"
    inputs, _ = task.batch(data, split_rows(task, data, split)[: cfg.export.parity_samples], torch.device("cpu"), False, torch.Generator())
    model.eval()
    with torch.no_grad():
        outputs = model(inputs).float()
    bad = int((~torch.isfinite(outputs.reshape(len(outputs), -1))).any(dim=1).sum())
    if bad:
        raise RunFailed(f"export: the model gives non-finite outputs (NaN or inf) for {bad} of {len(outputs)} {split} samples; "
                        "its weights or statistics hold NaN/inf (training diverged): export an earlier checkpoint with "
                        "--checkpoint, or train again with a lower optim.lr")
    return split, inputs, outputs


def check_parity(cfg: RunConfig, data: DataVersion, task: Task, model: torch.nn.Module, out: Path, files: dict[str, str],
                 reference: Optional[tuple[str, torch.Tensor, torch.Tensor]] = None, write: bool = True) -> dict[str, Any]:
    """Trained model vs each export in `files` (format → file name in `out`) on real test samples; writes
    export/parity.json (unless `write` is False: `veritrain audit` checks a sealed export again). safetensors is
    checked by loading it into a copy of the model. `reference`: what `reference_outputs` returned, when the caller has it."""

    import torch

    split, inputs, reference_logits = reference or reference_outputs(cfg, data, task, model)
    # the task's parity rule: whether the largest output must agree too (scores of classes or tokens)
    agreement = task.export_spec(cfg, model, data, inputs[:2]).agreement
    outputs: dict[str, np.ndarray] = {}
    if "onnx" in files:
        outputs["onnx"] = onnx_logits(out / files["onnx"], inputs.numpy())
    if "torchscript" in files:
        with warnings.catch_warnings():  # torch marks TorchScript deprecated; checking an export the config asked for is still right
            warnings.filterwarnings("ignore", message=r"`torch\.jit\.load` is deprecated", category=DeprecationWarning)
            scripted = torch.jit.load(str(out / files["torchscript"]))
        with torch.no_grad():
            outputs["torchscript"] = scripted(inputs).float().numpy()
    if "torch_export" in files:
        program = torch.export.load(str(out / files["torch_export"]))
        with torch.no_grad():
            outputs["torch_export"] = program.module()(inputs).float().numpy()
    if "safetensors" in files:
        from safetensors.torch import load_file

        loaded = copy.deepcopy(model)
        loaded.load_state_dict(load_file(str(out / files["safetensors"])), strict=True)
        with torch.no_grad():
            outputs["safetensors"] = loaded.eval()(inputs).float().numpy()
    ref = reference_logits.numpy()
    results = {}
    for name, logits in outputs.items():
        if logits.shape != ref.shape:
            results[name] = {"max_abs_diff": float("inf"), "agreement": 0.0, "shape": list(logits.shape)}
            continue
        results[name] = {
            "max_abs_diff": float(np.abs(logits.astype(np.float64) - ref.astype(np.float64)).max()),
            # the predicted class (a language model: token) of every sample (position) agrees
            "agreement": float((logits.reshape(-1, logits.shape[-1]).argmax(1) == ref.reshape(-1, ref.shape[-1]).argmax(1)).mean()),
        }
    # float32 rounding grows with the values: a model whose logits reach 1e5 cannot agree to 1e-4 in any other runtime
    scale = float(np.abs(ref).max()) if ref.size else 0.0
    tolerance = cfg.export.parity_atol + cfg.export.parity_rtol * scale
    failures = [f"{n}: max |Δlogit| {r['max_abs_diff']:.3g} > {tolerance:.3g}" for n, r in results.items() if not r["max_abs_diff"] <= tolerance]
    failures += [f"{n}: argmax agreement {r['agreement']:.4f} < {cfg.export.parity_min_agreement:g}" for n, r in results.items()
                 if agreement and r["agreement"] < cfg.export.parity_min_agreement]
    parity = {
        "samples": int(len(ref)),
        "split": split,
        "atol": cfg.export.parity_atol,
        "rtol": cfg.export.parity_rtol,
        "tolerance": tolerance,  # atol + rtol × the largest |logit| of the trained model
        "min_agreement": cfg.export.parity_min_agreement if agreement else None,  # None: the task's rule asks for no agreement
        "formats": results,
        "passed": not failures,
        "reason": "; ".join(failures) or None,
        "files_sha256": {name: sha256_file(out / file) for name, file in files.items()},
    }
    if write:
        (out / "parity.json").write_text(json.dumps(parity, indent=2) + "\n", encoding="utf-8")
    return parity


def onnx_logits(model: Path | bytes, inputs: np.ndarray) -> np.ndarray:
    """The ONNX model's first output for `inputs`; `model` is its file, or its bytes as read and hashed by the caller
    (what runs is then exactly what was checked, whatever the file holds by now)."""
    return onnx_runner(model)(inputs)


def onnx_runner(model: Path | bytes) -> Callable[[np.ndarray], np.ndarray]:
    """A function giving the ONNX model's first output for its inputs, from one onnxruntime session (`onnx_logits`)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4  # fatal only: an error is raised with its message, and is not also logged on stderr
    session = onnxruntime.InferenceSession(model if isinstance(model, bytes) else str(model), options, providers=["CPUExecutionProvider"])
    run_options = onnxruntime.RunOptions()
    run_options.log_severity_level = 4

    def run(inputs: np.ndarray) -> np.ndarray:
        # typed as any output kind (sparse, sequence, map); the model's one output is a dense tensor, an ndarray
        fed = inputs.astype(np.int64) if inputs.dtype.kind in "iu" else inputs.astype(np.float32)  # token ids, or pixels
        return cast(np.ndarray, session.run(None, {session.get_inputs()[0].name: fed}, run_options)[0])

    return run


# ---------------------------------------------------------------- export folders


class NotRegularFile(OSError):
    """A path that is a FIFO, a device, a socket or a folder where a file is read: opening a FIFO would wait for
    a writer forever, a device may never end."""


def refuse_non_regular(path: Path) -> None:
    """Raise NotRegularFile unless `path` is a regular file (links followed), checked with stat, before any open;
    a missing path raises FileNotFoundError."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        kind = ("a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
                else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a file")
        raise NotRegularFile(f"not a regular file ({kind})")


def find_export(ref_dir: Path) -> Path:
    """An export folder: the folder itself when it holds model.json, else `<run>/export`."""
    for candidate in (ref_dir, ref_dir / "export"):
        if (candidate / "model.json").exists():
            return candidate
    raise UserError(f"{ref_dir}: no exported model (model.json) here or in its export/; run `veritrain export` first")


# ---------------------------------------------------------------- which files of an export may be loaded

PLAIN_NAME = re.compile(r"[A-Za-z0-9_.-]+")  # a file of the export folder itself, never a path


@dataclass(frozen=True)
class ExportFiles:
    """An export folder that predict and generate load a model from, and the SHA-256 each file they may load must have,
    decided before anything is loaded: for a run by its sealed record (`export_files_of_run`), for a folder on its own
    by its model.json once its signature is checked (`export_files_of_folder`). `read` hashes the very bytes it
    returns, so what is loaded is what was decided, whatever the disk holds by then."""

    folder: Path
    description: dict[str, Any]  # model.json as read; its bytes hash to sha256["model.json"]
    sha256: Mapping[str, str]  # file name in the folder → the SHA-256 its bytes must have
    run_dir: Optional[Path] = None  # the run whose record decided the hashes; None: the folder's own model.json did
    signer: Optional[str] = None  # the line that says who signed the folder; None when not asked (a run, no --public-key)
    signer_known: bool = False  # a key known here signed it; else `signer` is a warning
    origin: Optional[str] = None  # a run's export that an amendment wrote: which, and who signed it (said on stderr)

    @property
    def model_files(self) -> dict[str, Path]:
        """format → model file, as model.json names them (a run's: the record's export files, checked equal)."""
        files = self.description.get("files")
        return {name: self.folder / entry["file"] for name, entry in (files.items() if isinstance(files, dict) else ())
                if isinstance(entry, dict) and entry.get("file") in self.sha256}

    def read(self, name: str, what: str = "file") -> bytes:
        """The bytes of the folder's file `name`, read once and hashed here: RunFailed unless they hash to the SHA-256
        decided for it (a cache, or a hash taken before, would let a file swapped since then be loaded unchecked).
        `what` (model, tokenizer) names the file in the message."""
        path = self.folder / name
        source = "model.json records" if self.run_dir is None else "the run's record lists"
        fix = ("restore the export, or export the run again" if self.run_dir is None else
               f"export the run again with `veritrain export {self.run_dir.name}` (`veritrain verify {self.run_dir.name}` names what changed)")
        expected = self.sha256.get(name)
        if expected is None:
            binder = "model.json" if self.run_dir is None else "the run's record"
            raise RunFailed(f"{path}: {binder} gives no SHA-256 for it, so it is not loaded; {fix}")
        try:
            refuse_non_regular(path)
            data = path.read_bytes()
        except NotRegularFile as err:
            raise RunFailed(f"{path}: {err}; {fix}") from None
        except FileNotFoundError:
            raise RunFailed(f"{path}: missing; {source} it as the {what} (sha256 {expected[:12]}); {fix}") from None
        except OSError as err:
            raise RunFailed(f"{path}: cannot read it ({err.strerror}); {fix}") from None
        actual = hashlib.sha256(data).hexdigest()
        if actual != expected:
            raise RunFailed(f"{path}: the {what} hashes to {actual[:12]}, but {source} {expected[:12]}; {fix}")
        return data


def open_export(path: Path, public_key: Optional[bytes] = None) -> ExportFiles:
    """The export `path` names, with the files it may load decided: a run folder, or a run's export/ folder, is bound by
    its sealed record (`export_files_of_run`); any other folder holding model.json (or an export/ holding one) is an
    export on its own, judged by its signature (`export_files_of_folder`). `public_key` (PEM): the key that must have
    signed the folder's model.sig, a run's export included."""
    run_dir = _run_of(path)
    if run_dir is None:
        return export_files_of_folder(find_export(path), public_key)
    record = _sealed_record(run_dir)
    if not record.path("export/model.json").exists():
        raise UserError(f"{run_dir}: no exported model (export/model.json); run `veritrain export {run_dir.name}` first")
    opened = export_files_of_run(run_dir, record)
    link = record.source("export")
    origin = None
    if link is not None:
        who = f"signed by key {link.signer[:16]}… (`veritrain verify {run_dir.name}` checks it)" if link.signer else "unsigned"
        origin = f"{run_dir.name}: the export comes from amendment {link.index:04d} ({link.by} at {link.at}, {who}), not from the run's own seal"
    if public_key is None:
        return dataclasses.replace(opened, origin=origin)  # the record binds every file; `veritrain verify` checks the signature
    line, known = _signer(opened.folder, opened.sha256["model.json"], public_key)
    return ExportFiles(opened.folder, opened.description, opened.sha256, run_dir, line, known, origin)


def _run_of(path: Path) -> Optional[Path]:
    """The run folder `path` is, or whose export/ it is; None for a folder outside any run."""
    resolved = path.resolve()
    if (resolved / "record.json").is_file():
        return resolved
    if resolved.name == "export" and (resolved / "model.json").exists() and (resolved.parent / "record.json").is_file():
        return resolved.parent
    return None


def _sealed_record(run_dir: Path) -> Record:
    """The run's record, read once record.json is found to hash to its seal: the record decides what may be loaded."""

    try:
        refuse_non_regular(run_dir / RECORD_FILE)
        seal = (run_dir / SEAL_FILE).read_text(encoding="ascii").strip()
        actual = sha256_file(run_dir / RECORD_FILE)
    except (OSError, UnicodeDecodeError) as err:
        raise RunFailed(f"{run_dir}: cannot read the run's record and its seal ({getattr(err, 'strerror', None) or err}); "
                        f"`veritrain verify {run_dir.name}` checks the whole run") from None
    if actual != seal:
        raise RunFailed(f"{run_dir / RECORD_FILE}: does not hash to the run's seal ({SEAL_FILE}); `veritrain verify {run_dir.name}` names what changed")
    return read_record(run_dir)


def export_files_of_run(run_dir: Path, record: Mapping[str, Any]) -> ExportFiles:
    """The export of a run as its record binds it: the one check of every command that loads a run's exported model.
    model.json must be the file the record lists (its SHA-256 in `artifacts`) and name exactly the record's export
    files (`export.files`: each format, file and SHA-256, the files the parity check certified), each listed with that
    SHA-256 in `artifacts`; a tokenizer it names must be listed there too and be the one the run trained with. So a
    second model added to export/ and named in model.json is refused even when the record was sealed again over both:
    the record's export section still names the certified file. RunFailed names the file that differs and the fix. The
    folder is the run's export/, or the one of the amendment that wrote it (every export writes the whole folder)."""
    folder = export_folder(run_dir, record)
    fix = f"export the run again with `veritrain export {run_dir.name}`"
    exported = (record.get("export") or {}).get("files")
    artifacts = record.get("artifacts") or {}
    if not isinstance(exported, Mapping) or not exported:
        raise RunFailed(f"{run_dir / 'record.json'}: the record names no exported model files; {fix}")
    data = _model_json_bytes(folder)
    actual = hashlib.sha256(data).hexdigest()
    listed = _listed_sha256(artifacts, "model.json")
    if actual != listed:
        raise RunFailed(f"{folder / 'model.json'}: hashes to {actual[:12]}, but the run's record lists {str(listed)[:12]}; "
                        f"restore it (`veritrain verify {run_dir.name}` names what changed) or {fix}")
    description = _parsed_model_json(folder / "model.json", data)
    files, preprocessing = description.get("files"), description.get("preprocessing")
    named: dict[str, Any] = files if isinstance(files, dict) else {}
    hashes = {"model.json": actual}
    for fmt in sorted(set(named) | set(exported)):
        hashes.update(_bound_model_file(run_dir, folder, fmt, named.get(fmt), exported.get(fmt), artifacts, fix))
    tokenizer = preprocessing.get("tokenizer") if isinstance(preprocessing, dict) else None
    if tokenizer is not None:
        hashes.update(_bound_tokenizer(folder, tokenizer, record, artifacts, fix))
    return ExportFiles(folder, description, hashes, run_dir)


def export_folder(run_dir: Path, record: Mapping[str, Any]) -> Path:
    """Where the run's export/ lies: in the run folder, or in the folder of the amendment that wrote it."""
    locate = getattr(record, "path", None)
    return locate("export/model.json").parent if locate is not None else run_dir / "export"


def _bound_model_file(run_dir: Path, folder: Path, fmt: str, named: Any, exported: Any, artifacts: Mapping[str, Any],
                      fix: str) -> dict[str, str]:
    """{file: SHA-256} of the one model file of format `fmt` in the export `folder`, when model.json (`named`), the
    record's export section (`exported`) and its artifacts agree on it; else RunFailed saying which file differs."""
    ours = (named.get("file"), named.get("sha256")) if isinstance(named, dict) else (None, None)
    theirs = (exported.get("file"), exported.get("sha256")) if isinstance(exported, Mapping) else (None, None)
    shown = folder / ours[0] if isinstance(ours[0], str) and PLAIN_NAME.fullmatch(ours[0]) else folder / "model.json"
    if theirs[0] is None:
        raise RunFailed(f"{shown}: model.json names it as the {fmt} model, but the run's record exports no {fmt} file; {fix}")
    if not (isinstance(theirs[0], str) and PLAIN_NAME.fullmatch(theirs[0]) and isinstance(theirs[1], str)):
        raise RunFailed(f"{run_dir / 'record.json'}: export.files.{fmt} is not a file of export/ and its SHA-256; {fix}")
    if ours[0] is None:
        raise RunFailed(f"{folder / 'model.json'}: names no {fmt} file, but the run's record exports {theirs[0]}; {fix}")
    if ours != theirs:
        raise RunFailed(f"{shown}: model.json names it as the {fmt} model (sha256 {str(ours[1])[:12]}), but the run's record exports "
                        f"{theirs[0]} (sha256 {theirs[1][:12]}), the file its parity check certified; {fix}")
    listed = _listed_sha256(artifacts, theirs[0])
    if listed != theirs[1]:
        raise RunFailed(f"{folder / theirs[0]}: the run's record exports it with sha256 {theirs[1][:12]}, but its file list "
                        f"{'has ' + listed[:12] if listed else 'does not list it'}; {fix}")
    return {theirs[0]: theirs[1]}


def _bound_tokenizer(folder: Path, tokenizer: Any, record: Mapping[str, Any], artifacts: Mapping[str, Any], fix: str) -> dict[str, str]:
    """{file: SHA-256} of the tokenizer model.json names, when the record lists that file with that SHA-256 and the run
    trained with it (the data version's tokenizer); else RunFailed."""
    name, digest = (tokenizer.get("file"), tokenizer.get("sha256")) if isinstance(tokenizer, dict) else (None, None)
    if not (isinstance(name, str) and PLAIN_NAME.fullmatch(name) and isinstance(digest, str)):
        raise RunFailed(f"{folder / 'model.json'}: preprocessing.tokenizer is not a file of export/ and its SHA-256; {fix}")
    trained = ((record.get("data") or {}).get("tokenizer") or {}).get("sha256")
    if trained is not None and digest != trained:
        raise RunFailed(f"{folder / name}: model.json names it as the tokenizer (sha256 {digest[:12]}), but the run trained with "
                        f"tokenizer {str(trained)[:12]}; {fix}")
    listed = _listed_sha256(artifacts, name)
    if listed != digest:
        raise RunFailed(f"{folder / name}: model.json names it as the tokenizer (sha256 {digest[:12]}), but the run's record "
                        f"{'lists ' + listed[:12] if listed else 'does not list it'}; {fix}")
    return {name: digest}


def _listed_sha256(artifacts: Mapping[str, Any], name: str) -> Optional[str]:
    """The SHA-256 the record's `artifacts` lists for export/`name`, or None."""
    entry = artifacts.get(f"export/{name}")
    digest = entry.get("sha256") if isinstance(entry, Mapping) else None
    return digest if isinstance(digest, str) else None


def export_files_of_folder(folder: Path, public_key: Optional[bytes] = None) -> ExportFiles:
    """An export folder on its own (copied, downloaded, outside any run), where only the folder says what it holds:
    every file its model.json names must be a file of the folder, the hashes model.json gives decide what may be
    loaded, and model.sig says who made it (`_signer`: the line to show, or RunFailed when the signature does not
    verify or the files are not as signed)."""
    data = _model_json_bytes(folder)
    description = _parsed_model_json(folder / "model.json", data)
    hashes = {"model.json": hashlib.sha256(data).hexdigest(), **_named_files(folder, description)}
    line, known = _signer(folder, hashes["model.json"], public_key)
    return ExportFiles(folder, description, hashes, None, line, known)


def _model_json_bytes(folder: Path) -> bytes:
    """model.json's bytes, read once (the same bytes are hashed and parsed); refused unless a regular file."""
    path = folder / "model.json"
    try:
        refuse_non_regular(path)
        return path.read_bytes()
    except NotRegularFile as err:
        raise RunFailed(f"{path}: {err}; an export's model.json is a plain file, re-export the run") from None
    except FileNotFoundError:
        raise UserError(f"{folder}: no exported model (model.json) here; run `veritrain export` first") from None
    except OSError as err:
        raise RunFailed(f"{path}: cannot read it ({err.strerror})") from None


def _parsed_model_json(path: Path, data: bytes) -> dict[str, Any]:
    """model.json's bytes as a JSON object; RunFailed in one line for anything else (an export may come from anywhere)."""
    try:
        description = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as err:  # JSON or UTF-8, or nested past Python's limit
        raise RunFailed(f"{path}: not an export's description ({str(err).splitlines()[0] if str(err) else type(err).__name__}); "
                        "re-export the run") from None
    if not isinstance(description, dict):
        raise RunFailed(f"{path}: not an export's description (a JSON {type(description).__name__}, not an object); re-export the run")
    return description


def _named_files(folder: Path, description: Mapping[str, Any]) -> dict[str, str]:
    """{file: SHA-256} of each file model.json gives a hash for; every file it names (model files, tokenizer, companions,
    card, signature) must be a regular file of the folder, so model.json never points outside it or at nothing.
    Entries of another shape are left to the reader of model.json, which says what is wrong with them."""
    path = folder / "model.json"
    named: list[tuple[str, Any, Any]] = []  # (where in model.json, file name, SHA-256 or None)
    files = description.get("files")
    for fmt, entry in (files.items() if isinstance(files, dict) else ()):
        if isinstance(entry, dict):
            named.append((f"files.{fmt}.file", entry.get("file"), entry.get("sha256")))
    preprocessing = description.get("preprocessing")
    tokenizer = preprocessing.get("tokenizer") if isinstance(preprocessing, dict) else None
    if isinstance(tokenizer, dict):
        named.append(("preprocessing.tokenizer.file", tokenizer.get("file"), tokenizer.get("sha256")))
    for key in ("companions", "non_model_files"):
        listed = description.get(key)
        named += [(f"{key}.{i}", name, None) for i, name in enumerate(listed if isinstance(listed, list) else [])]
    hashes: dict[str, str] = {}
    for where, name, digest in named:
        if not isinstance(name, str):
            continue
        if not PLAIN_NAME.fullmatch(name) or name in (".", ".."):
            raise RunFailed(f"{path}: {where}: {name[:120]!r} is not a file of this folder; an export names only its own files, re-export the run")
        try:
            refuse_non_regular(folder / name)
        except NotRegularFile as err:
            raise RunFailed(f"{folder / name}: {err}; model.json names it ({where}), re-export the run") from None
        except OSError:
            raise RunFailed(f"{folder / name}: missing; model.json names it ({where}): restore it, or export the run again") from None
        if isinstance(digest, str):
            if hashes.setdefault(name, digest) != digest:
                raise RunFailed(f"{path}: gives {name} two different SHA-256s; re-export the run")
    return hashes


def _signer(folder: Path, model_json_sha256: str, given: Optional[bytes]) -> tuple[str, bool]:
    """(the line that says who signed `folder`, whether a key known here did). The keys tried: `given` (--public-key)
    alone, else the PEM entries of the trusted-keys file and the local key pair; only the key the signature names is
    tried. No model.sig, or a key not known here whose statement still matches every file, is a warning: the folder
    is used. A signature that does not verify with the key it names, files not as signed, or (with `given`) no
    signature by that key, is RunFailed."""

    signature = folder / SIGNATURE_FILE
    again = "get the export again from its maker"
    if not (signature.exists() or signature.is_symlink()):
        if given is not None:
            raise RunFailed(f"{folder}: unsigned (no {SIGNATURE_FILE}), but --public-key asks for a signature by that key; {again}")
        return (f"{folder}: unsigned: no {SIGNATURE_FILE} says who made this export or that its files are as made; "
                "give its RUN to have them checked against the run's record, or ask its maker for a signed export"), False
    _refuse_special_files(folder)
    signed = _signed_files(folder)
    trusted = trusted_keys.load()
    keys = [("the key given with --public-key", given)] if given is not None else _known_keys(trusted)
    try:
        claimed = _claimed_key(signature)
        for name, pem in keys:
            if claimed is not None and _key_hint(pem) != claimed:
                continue
            problem = _verify_signature(folder, pem)
            if problem is None:
                _same_model_json(folder, signed, model_json_sha256)
                fingerprint = signing_keys.public_key_fingerprint(pem)
                listed = trusted.named(fingerprint)
                return f"{folder}: signed by {listed.name if listed else name}, key {fingerprint[:16]}; its files are as signed", True
            if claimed is not None or given is not None:
                raise RunFailed(f"{problem}; {again}")
    except UserError as err:  # model-signing is not installed here
        if given is not None:
            raise
        return f"{folder}: signed, but the signature is not checked here: {err}", False
    if given is not None:
        raise RunFailed(f"{signature}: signed with another key than the one given with --public-key; {again}")
    differences = _differences(signed, folder)
    if differences:
        raise RunFailed(f"{signature}: the folder is not as signed: {differences}; {again}")
    _same_model_json(folder, signed, model_json_sha256)
    return (f"{folder}: signed by a key not known here: its files are as signed, but nothing here says whose key it is; "
            f"give it with --public-key FILE or list it in {trusted_keys.default_path()}"), False


def _known_keys(trusted: TrustedKeys) -> list[tuple[str, bytes]]:
    """(name, public key PEM) of the keys known here: the PEM entries of the trusted-keys file, then the local key
    pair's public key when it is not one of them."""

    keys = [(key.name, key.pem) for key in trusted.keys if key.pem is not None]
    try:
        local = signing_keys.public_path(signing_keys.key_path()).read_bytes()
        fingerprint = signing_keys.public_key_fingerprint(local)
        listed = {signing_keys.public_key_fingerprint(pem) for _, pem in keys}
    except (OSError, ValueError, TypeError, UserError):
        return keys
    return keys if fingerprint in listed else [*keys, ("the local key pair", local)]


def _signed_files(folder: Path) -> dict[str, str]:
    """file → SHA-256 as model.sig states them (read, not yet verified); RunFailed for a malformed signature."""

    try:
        return export_signing.signed_files(folder)
    except ValueError as err:
        raise RunFailed(f"{err}; get the export again from its maker") from None


def _same_model_json(folder: Path, signed: Mapping[str, str], model_json_sha256: str) -> None:
    """The model.json read before the folder was checked is the one it signs: it did not change in between."""
    if signed.get("model.json") != model_json_sha256:
        raise RunFailed(f"{folder / 'model.json'}: changed while the export was checked (not the model.json {SIGNATURE_FILE} signs); "
                        "run the command again")


def _verify_signature(folder: Path, pem: bytes) -> Optional[str]:
    return export_signing.verify(folder, pem)


def _claimed_key(signature: Path) -> Optional[str]:
    """The key hint a model.sig carries (model-signing writes the SHA-256 of the signer's public key PEM), or None."""
    try:
        hint = json.loads(signature.read_text(encoding="utf-8"))["verificationMaterial"]["publicKey"]["hint"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return hint if isinstance(hint, str) and hint else None


def _key_hint(pem: bytes) -> Optional[str]:
    """The hint model-signing would write for this public key: the SHA-256 of its PEM as the cryptography package
    writes it (so a PEM with other line breaks gives the same hint)."""
    try:
        from cryptography.hazmat.primitives import serialization

        key = serialization.load_pem_public_key(pem)
    except (ImportError, ValueError, TypeError):
        return None
    return hashlib.sha256(key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)).hexdigest()


def _refuse_special_files(folder: Path) -> None:
    """Every entry of the folder a regular file or a folder, checked before a signature check reads them all (a FIFO
    would make it wait forever)."""
    for path in sorted(folder.rglob("*")):
        if path.is_dir() and not path.is_symlink():
            continue
        try:
            refuse_non_regular(path)
        except NotRegularFile as err:
            raise RunFailed(f"{path}: {err}; an export folder holds plain files only") from None
        except OSError:
            raise RunFailed(f"{path}: a link to nothing; an export folder holds plain files only") from None


def _differences(signed: Mapping[str, str], folder: Path) -> str:
    """The files changed, added and missing since model.sig listed them, in one phrase ("" when none)."""
    now = {p.relative_to(folder).as_posix(): sha256_file(p) for p in sorted(folder.rglob("*"))
           if p.is_file() and p.relative_to(folder).as_posix() != SIGNATURE_FILE}
    parts = [f"{what} {', '.join(names)}" for what, names in (
        ("changed", sorted(n for n in signed.keys() & now.keys() if signed[n] != now[n])),
        ("added", sorted(now.keys() - signed.keys())),
        ("missing", sorted(signed.keys() - now.keys()))) if names]
    return "; ".join(parts)

# ---------------------------------------------------------------- predict


def preprocess(path: Path, description: dict[str, Any], unlike: Optional[list[str]] = None) -> np.ndarray:
    """Decode one image file and apply the recorded preprocessing; returns C×H×W float32. `unlike` gets one line when
    the file is not like the training data (another mode or size): it is converted and resized, and its prediction
    is a guess the model was never trained to make."""
    from PIL import Image, ImageFile

    ImageFile.LOAD_TRUNCATED_IMAGES = False
    _, c, h, w = description["input"]["shape"]
    prep = description["preprocessing"]
    if "mean" not in prep:
        raise UserError("predict: this export is not of an image model; predict reads image files")
    refuse_non_regular(path)
    with Image.open(path) as img:
        img.load()
        mode = "L" if c == 1 else "RGB"
        if unlike is not None and (img.mode != mode or (img.height, img.width) != (h, w)):
            unlike.append(f"{path}: a {img.width}×{img.height} {img.mode} image; the model was trained on {w}×{h} {mode} images "
                          "(the data gate converts or quarantines such a file as bad_shape): its prediction is a guess")
        image = img.convert(mode)
    if (image.height, image.width) != (h, w):
        image = image.resize((w, h), Image.Resampling.BILINEAR)
    array = np.asarray(image, dtype=np.float32).reshape(h, w, c) / 255.0
    array = (array - np.asarray(prep["mean"], dtype=np.float32)) / np.asarray(prep["std"], dtype=np.float32)
    return array.transpose(2, 0, 1).astype(np.float32)


def read_description(opened: ExportFiles) -> dict[str, Any]:
    """model.json of an export predict can use (as `open_export` read it), checked first: an export folder may come
    from anywhere, so a malformed one is one line (exit 1), and its ONNX file must be a file of this folder."""

    class _Loose(BaseModel):
        model_config = ConfigDict(extra="allow", strict=True)

    class OnnxFile(_Loose):
        file: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")  # a name in this folder, never a path
        sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    class Files(_Loose):
        onnx: Optional[OnnxFile] = None

    class Input(_Loose):
        shape: list[Optional[int]] = Field(min_length=4, max_length=4)  # [batch (null: dynamic), C, H, W]

    class Description(_Loose):
        classes: list[str] = Field(min_length=1)
        input: Input
        preprocessing: dict[str, Any]
        files: Files

    path, description = opened.folder / "model.json", opened.description
    serves = serving_command(description.get("task"))
    if serves not in (None, "predict"):
        shown = opened.run_dir or opened.folder
        raise UserError(f"{shown}: an export of task {description.get('task')!r} is not for predict; the task's exports "
                        f"are used with `veritrain {serves} {shown}`")
    try:
        Description.model_validate(description)
    except (ValueError, RecursionError) as err:  # the shape (ValidationError is a ValueError)
        detail = err.errors(include_url=False)[0] if isinstance(err, ValidationError) else None
        where = f"{'.'.join(map(str, detail['loc']))}: {detail['msg']}" if detail else str(err).splitlines()[0]
        raise RunFailed(f"{path}: not an export's description ({where}); re-export the run") from None
    _, c, h, w = description["input"]["shape"]
    if c not in (1, 3) or h is None or w is None or not (0 < h <= 4096 and 0 < w <= 4096):
        raise RunFailed(f"{path}: input.shape: {[c, h, w]} is not an image model's input (1 or 3 channels, at most 4096 px a side)")
    prep = description["preprocessing"]
    for key in ("mean", "std") if "mean" in prep else ():
        values = prep.get(key)
        if not (isinstance(values, list) and len(values) == c and all(isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) for v in values)
                and (key == "mean" or all(v > 0 for v in values))):
            raise RunFailed(f"{path}: preprocessing.{key}: must be {c} finite number(s){' above 0' if key == 'std' else ''}; re-export the run")
    return description


def refuse_external_data(onnx_path: Path, data: Optional[bytes] = None) -> None:
    """An exported model is one self-contained file: tensors stored elsewhere would make onnxruntime
    open files the seal does not cover, so such a model is refused. `data`: the file's bytes, when read already."""
    import onnx

    try:
        model = onnx.load_model_from_string(data) if data is not None else onnx.load(str(onnx_path), load_external_data=False)
    except Exception as err:  # protobuf's decode errors have no common public base class
        raise RunFailed(f"{onnx_path}: not a readable ONNX model ({err.__class__.__name__}); re-export the run") from None
    def tensors(graph):  # initializers and tensor attributes, subgraphs (If, Loop, Scan) included
        yield from graph.initializer
        for node in graph.node:
            for attribute in node.attribute:
                yield from ([attribute.t] if attribute.HasField("t") else [])
                yield from attribute.tensors
                for subgraph in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                    yield from tensors(subgraph)

    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in tensors(model.graph)):
        raise RunFailed(f"{onnx_path}: refers to tensors in other files; predict runs only self-contained ONNX files, re-export the run")


PREDICT_CHUNK = 256  # files decoded and run at a time: memory stays the same however many files are given


def predict(export: Path | ExportFiles, files: Sequence[str], top: int = 1, workers: int = 0) -> list[dict[str, Any]]:
    """Class names and probabilities for each file with the exported ONNX model of `export` (a folder is opened with
    `open_export`: a run's export is bound by its record); a file that cannot be read or decoded gets an error and the
    others are still predicted. The ONNX bytes run are the bytes hashed against the SHA-256 decided for them. No code
    of the run is imported: the ONNX file runs in onnxruntime, so predict needs no --trust-code. Files are decoded
    PREDICT_CHUNK at a time, by `workers` worker processes ahead of the model (veritrain.data.loader) or here."""
    from veritrain.data.loader import Feeder  # torch's DataLoader: this module loads without torch

    opened = export if isinstance(export, ExportFiles) else open_export(export)
    description = read_description(opened)
    onnx_file = description["files"].get("onnx")
    if onnx_file is None:
        raise UserError(f"{opened.run_dir or opened.folder}: no ONNX model in this export; export with --format onnx")
    onnx_path = opened.folder / onnx_file["file"]
    model = opened.read(onnx_file["file"], "model")
    refuse_external_data(onnx_path, model)
    classes = description["classes"]
    results: list[dict[str, Any]] = []
    unlike: list[str] = []
    runner: Optional[Callable[[np.ndarray], np.ndarray]] = None  # the ONNX session, made for the first file decoded
    count = -(-len(files) // PREDICT_CHUNK)

    def decoded(index: int) -> Iterator[tuple[list[dict[str, Any]], list[np.ndarray], list[str]]]:
        yield _decoded(files[index * PREDICT_CHUNK : (index + 1) * PREDICT_CHUNK], description)

    with Feeder(decoded, count, workers) as feed:
        for index in range(count):
            for found, arrays, lines in feed.get(index):
                unlike.extend(lines)
                if arrays:
                    runner = runner or _onnx_runner(onnx_path, model)
                    logits = _predicted_logits(onnx_path, runner, np.stack(arrays), len(classes))
                    probabilities = np.exp(logits - logits.max(axis=1, keepdims=True))
                    probabilities /= probabilities.sum(axis=1, keepdims=True)
                    for entry, row in zip((e for e in found if e["ok"]), probabilities):
                        order = np.argsort(-row, kind="stable")[: max(1, top)]
                        entry["top"] = [{"label": classes[k], "prob": float(row[k])} for k in order]
                results.extend(found)
    for line in unlike:  # on stderr; predict still answers (exit 0)
        log.warning("predict: %s", line)
    return results


def _decoded(names: Sequence[str], description: dict[str, Any]) -> tuple[list[dict[str, Any]], list[np.ndarray], list[str]]:
    """Each file's entry (ok, or its error), the arrays of the ones decoded, in order, and the lines about files unlike
    the training data."""
    entries: list[dict[str, Any]] = []
    arrays: list[np.ndarray] = []
    unlike: list[str] = []
    for name in names:
        try:
            arrays.append(preprocess(Path(name), description, unlike))
            entries.append({"file": name, "ok": True, "top": [], "error": None})
        except FileNotFoundError:
            entries.append({"file": name, "ok": False, "top": [], "error": "no such file"})
        except NotRegularFile as err:  # refused before opening: a FIFO would block predict
            entries.append({"file": name, "ok": False, "top": [], "error": f"{err}; give image files"})
        except Exception as err:  # unreadable or not an image: report and go on
            entries.append({"file": name, "ok": False, "top": [], "error": f"cannot decode as an image ({err.__class__.__name__}: {err})"})
    return entries, arrays, unlike


def _onnx_runner(onnx_path: Path, model: bytes) -> Callable[[np.ndarray], np.ndarray]:
    """`onnx_runner` of the checked bytes; an ONNX file onnxruntime cannot load is one line (exit 1)."""
    try:
        return onnx_runner(model)
    except MemoryError:
        raise RunFailed(f"{onnx_path}: onnxruntime ran out of memory loading it; re-export the run") from None
    except Exception as err:  # onnxruntime's errors share no public base
        raise RunFailed(f"{onnx_path}: onnxruntime cannot run it ({_short_error(err)}); re-export the run") from None


def _predicted_logits(onnx_path: Path, runner: Callable[[np.ndarray], np.ndarray], inputs: np.ndarray, num_classes: int) -> np.ndarray:
    """The model's outputs for `inputs` as float64 (N, classes); a model onnxruntime cannot run (an operator it does not
    know, an allocation it cannot make) or whose output is not one row of class scores per input is one line (exit 1):
    an export folder may come from anywhere."""
    try:
        logits = runner(inputs)
    except MemoryError:
        raise RunFailed(f"{onnx_path}: onnxruntime ran out of memory running it; predict fewer files at once, or re-export the run") from None
    except Exception as err:  # onnxruntime's errors (Fail, InvalidGraph, NotImplemented, RuntimeException) share no public base
        raise RunFailed(f"{onnx_path}: onnxruntime cannot run it ({_short_error(err)}); re-export the run") from None
    shape = getattr(logits, "shape", None)
    if not isinstance(logits, np.ndarray) or shape != (len(inputs), num_classes):
        raise RunFailed(f"{onnx_path}: its output has shape {list(shape) if shape is not None else type(logits).__name__}, not "
                        f"[{len(inputs)}, {num_classes}] (one score per class of model.json for each file); re-export the run")
    return logits.astype(np.float64)


def _short_error(err: Exception) -> str:
    detail = " ".join(str(err).split()) or err.__class__.__name__
    return f"{detail[:120]} … {detail[-120:]}" if len(detail) > 240 else detail  # the start names the node or the load, the end the reason
