"""The export stage: the trained model as ONNX, TorchScript (or torch.export `.pt2` where a model
cannot be scripted) and safetensors in `export/`, with `model.json` describing inputs, preprocessing,
classes and provenance — and a parity certificate: the exported forms must give the same answers as
the trained model on real test samples (`export/parity.json`), or the export fails.

    veritrain export latest
    veritrain predict latest some/image.png --top 3
"""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from veritrain.errors import RunFailed, UserError
from veritrain.hashing import sha256_file

log = logging.getLogger("veritrain")


class ParityFailed(RunFailed):
    """An export that does not give the trained model's answers; `parity` is what parity.json holds."""

    def __init__(self, message: str, parity: dict[str, Any]):
        super().__init__(message)
        self.parity = parity

MODEL_JSON_VERSION = 1
FILES = {"onnx": "model.onnx", "torchscript": "model.torchscript.pt", "torch_export": "model.pt2", "safetensors": "model.safetensors"}


def run(cfg: Any, data: Any, task: Any, run_dir: Path, which: Optional[str] = None, formats: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """Stage entry: export the checkpoint `which` (see `evaluate.checkpoint_path`) in `formats` (default `export.formats`) and check
    parity; returns model.json's content. Raises RunFailed when parity fails (files are kept)."""
    import warnings

    import torch

    from veritrain.evaluate import checkpoint_path, load_model

    # TorchScript and the TorchScript-based ONNX exporter warn that they are deprecated on every call;
    # they are what works with onnxruntime without extra packages, so keep the console clean
    warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.(onnx|jit)")
    warnings.filterwarnings("ignore", message=r".*(TorchScript|torch\.jit).*", category=DeprecationWarning)
    formats = list(formats or cfg.export.formats)
    path = checkpoint_path(cfg, run_dir, which)
    model, state = load_model(cfg, data, task, path, torch.device("cpu"))
    model = model.float().eval()
    out = run_dir / "export"
    out.mkdir(exist_ok=True)
    for stale in FILES.values():  # a re-export replaces everything
        (out / stale).unlink(missing_ok=True)
    example, _ = task.batch(data, data.splits["test"][:2] if len(data.splits["test"]) else data.splits["train"][:2],
                            torch.device("cpu"), False, torch.Generator())
    written: dict[str, str] = {}
    if "onnx" in formats:
        torch.onnx.export(
            model, (example,), str(out / FILES["onnx"]), input_names=["input"], output_names=["logits"],
            dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}}, opset_version=cfg.export.opset, dynamo=False,
        )
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
        from safetensors.torch import save_file

        save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, str(out / FILES["safetensors"]))
        written["safetensors"] = FILES["safetensors"]

    description = {
        "format_version": MODEL_JSON_VERSION,
        "source_run": run_dir.name,
        "data_version": data.version,
        "task": cfg.task,
        "model": cfg.model.target or cfg.model.name,
        "checkpoint": path.relative_to(run_dir).as_posix() if path.is_relative_to(run_dir) else str(path),
        "checkpoint_sha256": sha256_file(path),
        "checkpoint_epoch": state["loop"]["epochs_done"],
        "classes": data.classes,
        "input": {"name": "input", "shape": [None, *example.shape[1:]], "dtype": "float32", "batch": "dynamic"},
        "output": {"name": "logits", "shape": [None, *model(example).shape[1:]], "dtype": "float32"},
        # how raw inputs become the model's input; only the task knows (images: decode, resize, normalize)
        "preprocessing": task.export_preprocessing(data) if hasattr(task, "export_preprocessing") else {"normalization": data.info["normalization"]},
        "files": {name: {"file": file, "sha256": sha256_file(out / file)} for name, file in written.items()},
        "onnx_opset": cfg.export.opset if "onnx" in written else None,
        "torch": torch.__version__,
    }
    description["parity"] = check_parity(cfg, data, task, model, out, written)
    (out / "model.json").write_text(json.dumps(description, indent=2) + "\n", encoding="utf-8")
    parity = description["parity"]
    log.info("export: %s in %s; parity %s (max |Δlogit| %s, argmax agreement %s)", ", ".join(written), out,
             "passed" if parity["passed"] else "FAILED",
             ", ".join(f"{k} {v['max_abs_diff']:.2e}" for k, v in parity["formats"].items()) or "-",
             ", ".join(f"{k} {v['agreement']:.4f}" for k, v in parity["formats"].items()) or "-")
    if not parity["passed"]:
        raise ParityFailed(f"export: parity check failed ({parity['reason']}); see {out / 'parity.json'}", parity)
    return description


def check_parity(cfg: Any, data: Any, task: Any, model: Any, out: Path, written: dict[str, str]) -> dict[str, Any]:
    """Trained model vs each executable export on real test samples; writes export/parity.json."""
    import torch

    split = "test" if len(data.splits["test"]) else "val"
    inputs, _ = task.batch(data, data.splits[split][: cfg.export.parity_samples], torch.device("cpu"), False, torch.Generator())
    model.eval()
    with torch.no_grad():
        reference = model(inputs).float()  # the very batch every export is run on
    outputs: dict[str, np.ndarray] = {}
    if "onnx" in written:
        outputs["onnx"] = onnx_logits(out / written["onnx"], inputs.numpy())
    if "torchscript" in written:
        with warnings.catch_warnings():  # torch marks TorchScript deprecated; checking an export the config asked for is still right
            warnings.filterwarnings("ignore", message=r"`torch\.jit\.load` is deprecated", category=DeprecationWarning)
            scripted = torch.jit.load(str(out / written["torchscript"]))
        with torch.no_grad():
            outputs["torchscript"] = scripted(inputs).float().numpy()
    if "torch_export" in written:
        program = torch.export.load(str(out / written["torch_export"]))
        with torch.no_grad():
            outputs["torch_export"] = program.module()(inputs).float().numpy()
    ref = reference.numpy()
    results = {}
    for name, logits in outputs.items():
        if logits.shape != ref.shape:
            results[name] = {"max_abs_diff": float("inf"), "agreement": 0.0, "shape": list(logits.shape)}
            continue
        results[name] = {
            "max_abs_diff": float(np.abs(logits.astype(np.float64) - ref.astype(np.float64)).max()),
            "agreement": float((logits.argmax(1) == ref.argmax(1)).mean()),
        }
    failures = [f"{n}: max |Δlogit| {r['max_abs_diff']:.3g} > {cfg.export.parity_atol:g}" for n, r in results.items() if not r["max_abs_diff"] <= cfg.export.parity_atol]
    failures += [f"{n}: argmax agreement {r['agreement']:.4f} < {cfg.export.parity_min_agreement:g}" for n, r in results.items() if r["agreement"] < cfg.export.parity_min_agreement]
    parity = {
        "samples": int(len(ref)),
        "split": split,
        "atol": cfg.export.parity_atol,
        "min_agreement": cfg.export.parity_min_agreement,
        "formats": results,
        "passed": not failures,
        "reason": "; ".join(failures) or None,
        "files_sha256": {name: sha256_file(out / file) for name, file in written.items()},
    }
    (out / "parity.json").write_text(json.dumps(parity, indent=2) + "\n", encoding="utf-8")
    return parity


def onnx_logits(path: Path, inputs: np.ndarray) -> np.ndarray:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # errors only: no warnings on stderr
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: inputs.astype(np.float32)})[0]


# ---------------------------------------------------------------- predict


def find_export(ref_dir: Path) -> Path:
    """An export folder: the folder itself when it holds model.json, else `<run>/export`."""
    for candidate in (ref_dir, ref_dir / "export"):
        if (candidate / "model.json").exists():
            return candidate
    raise UserError(f"{ref_dir}: no exported model (model.json) here or in its export/; run `veritrain export` first")


def preprocess(path: Path, description: dict[str, Any]) -> np.ndarray:
    """Decode one image file and apply the recorded preprocessing; returns C×H×W float32."""
    from PIL import Image, ImageFile

    ImageFile.LOAD_TRUNCATED_IMAGES = False
    _, c, h, w = description["input"]["shape"]
    prep = description["preprocessing"]
    if "mean" not in prep:
        raise UserError("predict: this export is not of an image model; predict reads image files")
    with Image.open(path) as img:
        img.load()
        image = img.convert("L" if c == 1 else "RGB")
    if (image.height, image.width) != (h, w):
        image = image.resize((w, h), Image.BILINEAR)
    array = np.asarray(image, dtype=np.float32).reshape(h, w, c) / 255.0
    array = (array - np.asarray(prep["mean"], dtype=np.float32)) / np.asarray(prep["std"], dtype=np.float32)
    return array.transpose(2, 0, 1).astype(np.float32)


def read_description(export_dir: Path) -> dict[str, Any]:
    """model.json of an export predict can use, checked first: an export folder may come from anywhere,
    so a malformed one is one line (exit 1), and its ONNX file must be a file of this folder."""
    from pydantic import BaseModel, ConfigDict, Field, ValidationError

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

    path = export_dir / "model.json"
    try:
        description = json.loads(path.read_text(encoding="utf-8"))
        Description.model_validate(description)
    except OSError as err:
        raise RunFailed(f"{path}: cannot read it ({err.strerror})") from None
    except (ValueError, RecursionError) as err:  # JSON, UTF-8 or the shape (ValidationError is a ValueError)
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


def refuse_external_data(onnx_path: Path) -> None:
    """An exported model is one self-contained file: tensors stored elsewhere would make onnxruntime
    open files the seal does not cover, so such a model is refused."""
    import onnx

    try:
        model = onnx.load(str(onnx_path), load_external_data=False)
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


def predict(export_dir: Path, files: Sequence[str], top: int = 1) -> list[dict[str, Any]]:
    """Class names and probabilities for each file with the exported ONNX model; a file that cannot
    be read or decoded gets an error and the others are still predicted. No code of the run is
    imported: the ONNX file runs in onnxruntime, so predict needs no --trust-code."""
    description = read_description(export_dir)
    onnx_file = description["files"].get("onnx")
    if onnx_file is None:
        raise UserError(f"{export_dir}: no ONNX model in this export; export with --format onnx")
    if not (export_dir / onnx_file["file"]).is_file() or sha256_file(export_dir / onnx_file["file"]) != onnx_file["sha256"]:
        raise RunFailed(f"{export_dir / onnx_file['file']}: missing or does not match the hash in model.json; re-export the run")
    refuse_external_data(export_dir / onnx_file["file"])
    classes = description["classes"]
    results: list[dict[str, Any]] = []
    batch, positions = [], []
    for i, name in enumerate(files):
        try:
            batch.append(preprocess(Path(name), description))
            positions.append(i)
            results.append({"file": name, "ok": True, "top": [], "error": None})
        except FileNotFoundError:
            results.append({"file": name, "ok": False, "top": [], "error": "no such file"})
        except Exception as err:  # unreadable or not an image: report and go on
            results.append({"file": name, "ok": False, "top": [], "error": f"cannot decode as an image ({err.__class__.__name__}: {err})"})
    if batch:
        logits = onnx_logits(export_dir / onnx_file["file"], np.stack(batch)).astype(np.float64)
        probabilities = np.exp(logits - logits.max(axis=1, keepdims=True))
        probabilities /= probabilities.sum(axis=1, keepdims=True)
        for i, row in zip(positions, probabilities):
            order = np.argsort(-row, kind="stable")[: max(1, top)]
            results[i]["top"] = [{"label": classes[k], "prob": float(row[k])} for k in order]
    return results
