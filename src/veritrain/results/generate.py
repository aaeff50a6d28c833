"""`veritrain generate RUN "prompt"`: text sampled from a language model's export (task lm), with the ONNX model and the
tokenizer beside it, nothing else: the prompt is encoded with export/tokenizer.json, the last `context` ids are fed
to model.onnx, and each next id is drawn from the last position's logits as the evaluation draws its samples
(veritrain.tasks.gpt.next_token: a torch.Generator seeded with `seed`, float64).

Both files are hashed as they are read and must have the SHA-256 decided for them (veritrain.results.export.open_export):
for a run, the record's export files and the tokenizer it trained with, whatever model.json says; for an export folder
on its own, what its model.json names, once its signature is checked. An export whose tokenizer is not the one the
model was trained with is refused with both hashes, never used.

    veritrain generate latest "The import statement" --tokens 80 --seed 1
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, cast

import numpy as np

from veritrain.core.errors import RunFailed, UserError
from veritrain.core.task_registry import serving_command
from veritrain.data.tokenizer import load_tokenizer
from veritrain.results.export import ExportFiles, open_export, refuse_external_data

MAX_TOKENS = 100_000  # the most ids one command draws


def read_lm_export(opened: ExportFiles) -> dict[str, Any]:
    """model.json of a language model's export (as `open_export` read it), with its ONNX model read and checked against
    the SHA-256 decided for it (a run's: the record's); the tokenizer is checked the same way before it is parsed."""
    path = opened.folder / "model.json"
    description = opened.description
    serves = serving_command(description.get("task"))
    if serves != "generate":
        use = f"; the task's exports are used with `veritrain {serves}`" if serves else ""
        raise UserError(f"{opened.run_dir or opened.folder}: the export is not a text generator's (task {description.get('task')!r}){use}")
    try:
        onnx_entry = description["files"]["onnx"]
        tokenizer_entry = description["preprocessing"]["tokenizer"]
        context = int(description["architecture"]["config"]["context"])
        names = (str(onnx_entry["file"]), str(tokenizer_entry["file"]))
    except (KeyError, TypeError, ValueError):
        raise RunFailed(f"{path}: files.onnx, preprocessing.tokenizer or architecture.config.context is missing; re-export the run") from None
    for name, what in zip(names, ("model", "tokenizer")):
        if "/" in name or name in ("", ".", ".."):
            raise RunFailed(f"{path}: the {what} file {name!r} is not a file of the export folder; re-export the run")
    model = opened.read(names[0], "model")
    opened.read(names[1], "tokenizer")  # hashed before it is parsed: a changed tokenizer is named as such
    refuse_external_data(opened.folder / names[0], model)
    return {**description, "_onnx": opened.folder / names[0], "_model": model, "_tokenizer": opened.folder / names[1],
            "_tokenizer_sha256": opened.sha256[names[1]], "_context": context}


def generate(export: Path | ExportFiles, prompt: str, tokens: int = 64, seed: int = 0, temperature: float = 0.8,
             top_k: Optional[int] = None) -> dict[str, Any]:
    """`tokens` ids drawn after `prompt` from `export` (a folder is opened with `open_export`: a run's export is bound
    by its record); returns the prompt, the text, the ids and what drew them."""
    import onnxruntime
    import torch

    from veritrain.tasks.gpt import next_token

    if not 0 <= tokens <= MAX_TOKENS:
        raise UserError(f"--tokens: expected 0 … {MAX_TOKENS}, got {tokens}")
    if not temperature >= 0.0:
        raise UserError(f"--temperature: expected ≥ 0 (0 = always the most likely token), got {temperature}")
    described = read_lm_export(export if isinstance(export, ExportFiles) else open_export(export))
    tokenizer = load_tokenizer(described["_tokenizer"])
    if tokenizer.sha256 != described["_tokenizer_sha256"]:  # the bytes parsed, not only those hashed before
        raise RunFailed(f"{described['_tokenizer']}: changed while it was read (sha256 {tokenizer.sha256[:12]}, not "
                        f"{described['_tokenizer_sha256'][:12]}); run the command again")
    ids = [int(i) for i in tokenizer.encode(prompt)]
    if not ids:
        raise UserError("PROMPT: empty; give some text to continue")
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4  # errors are raised with their message, not also logged on stderr
    session = onnxruntime.InferenceSession(described["_model"], options, providers=["CPUExecutionProvider"])
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
