"""`veritrain generate RUN "prompt"`: text sampled from a language model's export (task lm), with the ONNX model and the
tokenizer beside it, nothing else: the prompt is encoded with export/tokenizer.json, the last `context` ids are fed
to model.onnx, and each next id is drawn from the last position's logits as the evaluation draws its samples
(veritrain.tasks.gpt.next_token: a torch.Generator seeded with `seed`, float64).

Both files are hashed first and must be those model.json names: an export whose tokenizer is not the one the model
was trained with is refused with both hashes, never used.

    veritrain generate latest "The import statement" --tokens 80 --seed 1
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, cast

import numpy as np

from veritrain.core.errors import RunFailed, UserError
from veritrain.core.hashing import sha256_file
from veritrain.results.export import NotRegularFile, refuse_external_data, refuse_non_regular

MAX_TOKENS = 100_000  # the most ids one command draws


def read_lm_export(export_dir: Path) -> dict[str, Any]:
    """model.json of a language model's export, with its ONNX file and tokenizer checked against the hashes it names."""
    path = export_dir / "model.json"
    try:
        refuse_non_regular(path)
        description = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise RunFailed(f"{path}: not readable as an export's description ({err}); re-export the run") from None
    if not isinstance(description, dict) or description.get("task") != "lm":
        raise UserError(f"{export_dir}: the export is not a language model's (task {description.get('task') if isinstance(description, dict) else None!r}); "
                        "`veritrain predict` classifies images with an image model's export")
    try:
        onnx_entry = description["files"]["onnx"]
        tokenizer_entry = description["preprocessing"]["tokenizer"]
        context = int(description["architecture"]["config"]["context"])
        names = (str(onnx_entry["file"]), str(tokenizer_entry["file"]))
        expected = (str(onnx_entry["sha256"]), str(tokenizer_entry["sha256"]))
    except (KeyError, TypeError, ValueError):
        raise RunFailed(f"{path}: files.onnx, preprocessing.tokenizer or architecture.config.context is missing; re-export the run") from None
    for name, digest, what in zip(names, expected, ("model", "tokenizer")):
        if "/" in name or name in ("", ".", ".."):
            raise RunFailed(f"{path}: the {what} file {name!r} is not a file of the export folder; re-export the run")
        file = export_dir / name
        try:
            refuse_non_regular(file)
            actual = sha256_file(file)
        except NotRegularFile as err:
            raise RunFailed(f"{file}: {err}; re-export the run") from None
        except OSError:
            raise RunFailed(f"{file}: missing; model.json names it as the {what} (sha256 {digest[:12]}); re-export the run") from None
        if actual != digest:
            raise RunFailed(f"{file}: the {what} hashes to {actual[:12]}, but model.json records {digest[:12]} (what the model was trained "
                            f"with); restore the export (`veritrain verify` names what changed) or export the run again")
    refuse_external_data(export_dir / names[0])
    return {**description, "_onnx": export_dir / names[0], "_tokenizer": export_dir / names[1], "_context": context}


def generate(export_dir: Path, prompt: str, tokens: int = 64, seed: int = 0, temperature: float = 0.8,
             top_k: Optional[int] = None) -> dict[str, Any]:
    """`tokens` ids drawn after `prompt` from the export in `export_dir`; returns the prompt, the text, the ids and what drew them."""
    import onnxruntime
    import torch

    from veritrain.data.tokenizer import load_tokenizer
    from veritrain.tasks.gpt import next_token

    if not 0 <= tokens <= MAX_TOKENS:
        raise UserError(f"--tokens: expected 0 … {MAX_TOKENS}, got {tokens}")
    if not temperature >= 0.0:
        raise UserError(f"--temperature: expected ≥ 0 (0 = always the most likely token), got {temperature}")
    described = read_lm_export(export_dir)
    tokenizer = load_tokenizer(described["_tokenizer"])
    ids = [int(i) for i in tokenizer.encode(prompt)]
    if not ids:
        raise UserError("PROMPT: empty; give some text to continue")
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4  # errors are raised with their message, not also logged on stderr
    session = onnxruntime.InferenceSession(str(described["_onnx"]), options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    generator = torch.Generator().manual_seed(seed)
    context = described["_context"]
    drawn: list[int] = []
    for _ in range(tokens):
        window = np.asarray([ids[-context:]], dtype=np.int64)
        logits = cast(np.ndarray, session.run(None, {name: window})[0])[0, -1]
        if not np.isfinite(logits).all():
            raise RunFailed(f"{described['_onnx']}: the model gives non-finite logits (NaN or inf) for this prompt")
        choice = next_token(torch.from_numpy(np.array(logits, dtype=np.float64)), temperature, top_k, generator)
        ids.append(choice)
        drawn.append(choice)
    return {"prompt": prompt, "text": tokenizer.decode(drawn), "token_ids": drawn, "prompt_tokens": len(ids) - len(drawn),
            "seed": seed, "temperature": temperature, "top_k": top_k, "source_run": described.get("source_run"),
            "tokenizer_sha256": described["preprocessing"]["tokenizer"]["sha256"],
            "onnx_sha256": described["files"]["onnx"]["sha256"]}
