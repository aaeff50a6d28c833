"""The stages on a finished run (`eval`, `baseline`, `export`, `predict`, `generate`) and the `smoke` test of a config."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import click

from veritrain.cli import render
from veritrain.cli.options import config_argument, json_option, set_option, trust_code_option, use_current_code_option, workdir_option
from veritrain.cli.render import emit_json
from veritrain.core import display
from veritrain.core.errors import RunFailed, UserError

if TYPE_CHECKING:
    from veritrain.results.export import ExportFiles


@click.command("eval")
@click.argument("ref", metavar="RUN", required=False)
@click.option("--checkpoint", "which", default=None, metavar="best|last|PATH", help="Checkpoint to evaluate (default: best, or last when the run kept no best.pt).")
@click.option("--split", type=click.Choice(["test", "val"]), default=None, help="Split to evaluate on (default: the run's eval.split).")
@click.option("--predictions", type=click.Path(dir_okay=False), default=None, help="Recompute every metric from a predictions.csv alone (no RUN).")
@click.option("--allow-data-drift", is_flag=True, help="Evaluate even when the data no longer matches the run's data version (recorded).")
@trust_code_option()
@use_current_code_option()
@workdir_option
@json_option
def eval_command(ref: Optional[str], which: Optional[str], split: Optional[str], predictions: Optional[str], allow_data_drift: bool,
                 trust_code: bool, use_current_code: bool, workdir: Optional[str], as_json: bool) -> int:
    """Evaluate a run's checkpoint on its fixed split; adds eval/<split>/ to the run in a sealed amendment.

    \b
    Examples:
      veritrain eval latest --checkpoint best --split test
      veritrain eval --predictions runs/<id>/eval/test/predictions.csv --json
    """
    from pathlib import Path

    from veritrain.results import evaluate

    if predictions:
        if ref:
            raise UserError("--predictions: give either RUN or --predictions FILE, not both")
        try:
            metrics = evaluate.from_predictions(Path(predictions))
        except FileNotFoundError:
            raise UserError(f"--predictions {predictions}: no such file") from None
        except ValueError as err:
            raise UserError(f"--predictions {predictions}: {err}") from None
    else:
        if not ref:
            raise UserError("veritrain eval: give a RUN (id, prefix, latest or folder) or --predictions FILE")
        from veritrain.orchestration import pipeline
        from veritrain.records.workspace import Workspace

        workspace = Workspace.open(workdir)
        done = pipeline.evaluate_run(workspace, ref, which, split, pipeline.python_argv(), allow_data_drift, trust_code, use_current_code)
        metrics = done.result
        render.eval_written(done, use_current_code)
    if as_json:
        emit_json(metrics)
    else:
        render.metrics_table(metrics)
    return 0


@click.command("baseline")
@click.argument("ref", metavar="RUN|CONFIG")
@set_option
@trust_code_option()
@workdir_option
@json_option
def baseline_command(ref: str, overrides: tuple[str, ...], trust_code: bool, workdir: Optional[str], as_json: bool) -> int:
    """Majority-class and logistic-regression baselines on the same splits as a run (or a config).

    \b
    Examples:
      veritrain baseline latest
      veritrain baseline configs/digits.yaml --json
    """
    from veritrain.orchestration import pipeline
    from veritrain.records.workspace import Workspace

    result = pipeline.baselines(Workspace.open(workdir), ref, overrides, trust_code)
    if as_json:
        emit_json(result)
    else:
        render.baselines(result)
    return 0


@click.command("export")
@click.argument("ref", metavar="RUN")
@click.option("--format", "formats", multiple=True, type=click.Choice(["onnx", "torchscript", "safetensors"]),
              help="Format to write (repeatable; default: the run's export.formats, all three).")
@click.option("--checkpoint", "which", default=None, metavar="best|last|PATH", help="Checkpoint to export (default: best, or last when the run kept no best.pt).")
@trust_code_option()
@use_current_code_option()
@workdir_option
@json_option
def export_command(ref: str, formats: tuple[str, ...], which: Optional[str], trust_code: bool, use_current_code: bool,
                   workdir: Optional[str], as_json: bool) -> int:
    """Export a run's model (ONNX, TorchScript, safetensors) with model.json and a parity check.

    Exits 1 when an exported model does not give the trained model's answers on real test samples.

    \b
    Example:
      veritrain export latest --format onnx
    """
    from veritrain.orchestration import pipeline
    from veritrain.records.workspace import Workspace

    workspace = Workspace.open(workdir)
    done = pipeline.export_run(workspace, ref, which, list(formats) or None, pipeline.python_argv(), trust_code, use_current_code)
    render.export_written(done, use_current_code)
    if as_json:
        emit_json(done.result)
    else:
        from veritrain.records.record import read_record
        from veritrain.results.export import export_folder

        render.exported(done.result, export_folder(done.run_dir, read_record(done.run_dir)))
    return 0


@click.command("predict")
@click.argument("ref", metavar="RUN|EXPORT_DIR")
@click.argument("files", nargs=-1, required=True, metavar="FILE...")
@click.option("--top", type=click.IntRange(min=1), default=1, show_default=True, help="How many classes to show per file.")
@click.option("--workers", type=click.IntRange(min=0, max=4096), default=0, show_default=True,
              help="Processes that decode the files ahead of the model (0: this one).")
@click.option("--public-key", "public_key", metavar="FILE",
              help="Require the export's model.sig to be signed by this public key (PEM): unsigned, or signed by another key, "
                   "fails (default: an export folder's signature is checked with the trusted keys and the local key pair).")
@workdir_option
@json_option
def predict_command(ref: str, files: tuple[str, ...], top: int, workers: int, public_key: Optional[str], workdir: Optional[str],
                    as_json: bool) -> int:
    """Classify image files with an exported model (ONNX) and its recorded preprocessing.

    A run's export is used only as its record binds it: model.json must name exactly the record's export files,
    and each file loaded must hash to the record's SHA-256 (exit 1 otherwise). An export folder on its own is
    judged by its signature (model.sig): a line on stderr names the signer, or warns that it is unsigned or
    signed by a key not known here; a signature that does not verify is exit 1. A file that cannot be read or
    decoded gets its own error; the others are still predicted (exit 1 if any failed). Files are decoded and run
    256 at a time, so memory stays the same however many are given.

    \b
    Examples:
      veritrain predict latest cat.png dog.jpg --top 3
      veritrain predict downloaded/export digit.png --public-key maker.pub.pem
    """
    from veritrain.results import export

    opened = _export_of(ref, public_key, workdir)
    results = export.predict(opened, files, top, workers)
    _say_signer(opened)
    if as_json:
        emit_json({"results": results})
    else:
        render.predictions(results)
    failed = [r["file"] for r in results if not r["ok"]]
    if failed:
        raise RunFailed(f"{len(failed)} of {len(results)} file(s) could not be predicted: {', '.join(failed[:3])}{', ...' if len(failed) > 3 else ''}")
    return 0


@click.command("generate")
@click.argument("ref", metavar="RUN|EXPORT_DIR")
@click.argument("prompt")
@click.option("--tokens", type=click.IntRange(min=0, max=100_000), default=64, show_default=True, help="Tokens to draw after the prompt.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the sampling generator: the same seed gives the same text.")
@click.option("--temperature", type=click.FloatRange(min=0.0), default=0.8, show_default=True,
              help="Logits are divided by this before sampling; 0 takes the most likely token.")
@click.option("--top-k", "top_k", type=click.IntRange(min=1), default=None, help="Sample among the k most likely tokens only.")
@click.option("--public-key", "public_key", metavar="FILE",
              help="Require the export's model.sig to be signed by this public key (PEM): unsigned, or signed by another key, "
                   "fails (default: an export folder's signature is checked with the trusted keys and the local key pair).")
@workdir_option
@json_option
def generate_command(ref: str, prompt: str, tokens: int, seed: int, temperature: float, top_k: Optional[int], public_key: Optional[str],
                     workdir: Optional[str], as_json: bool) -> int:
    """Continue PROMPT with a language model's export (ONNX and its tokenizer, each hashed as it is read).

    A run's export is used only as its record binds it (the record's export files, the tokenizer the run trained
    with); an export folder on its own by its model.json, once its signature is checked, as `predict` does.

    \b
    Example:
      veritrain generate latest "The import statement" --tokens 80 --seed 1
    """
    from veritrain.results import generate

    opened = _export_of(ref, public_key, workdir)
    result = generate.generate(opened, prompt, tokens, seed, temperature, top_k)
    _say_signer(opened)
    if as_json:
        emit_json(result)
    else:
        click.echo(display.terminal_safe(result["prompt"] + result["text"]))
    return 0


def _export_of(ref: str, public_key: Optional[str], workdir: Optional[str]) -> ExportFiles:
    """The export RUN|EXPORT_DIR names, its files decided (veritrain.results.export.open_export): a folder holding
    model.json or export/ is taken as it is (a run folder, or a run's export/, is still bound by its record), any
    other RUN is looked up in the workspace (`latest`: the newest run with an export)."""
    from pathlib import Path

    from veritrain.records.workspace import Workspace
    from veritrain.results import export

    pem = _public_key(public_key) if public_key else None
    candidate = Path(ref)
    base = candidate if candidate.is_dir() and ((candidate / "model.json").exists() or (candidate / "export").is_dir()) else Workspace.open(workdir).resolve_run(ref, "export")
    return export.open_export(base, pem)


def _public_key(path: str) -> bytes:
    """The PEM public key of --public-key; exit 2 when it cannot be read or is not one."""
    from veritrain.trust.policy import read_public_key

    return read_public_key(path)


def _say_signer(opened: ExportFiles) -> None:
    """The one line on who signed an export folder, said once its model has given its answers (so a failure stays
    one line): the signer on stderr, or a warning when it is unsigned or signed by a key not known here."""
    import logging

    log = logging.getLogger("veritrain")
    if opened.origin is not None:
        log.info("%s", opened.origin)
    if opened.signer is None:
        return
    if opened.signer_known:
        log.info("%s", opened.signer)
    else:
        log.warning("%s", opened.signer)


@click.command("smoke")
@config_argument
@set_option
@workdir_option
@json_option
def smoke_command(config: Optional[str], overrides: tuple[str, ...], workdir: Optional[str], as_json: bool) -> int:
    """A tiny slice of a config through every stage (prepare, 2 training steps, checkpoint save +
    load + resume, eval, export + parity) in seconds; recorded in .veritrain/smoke/.

    \b
    Example:
      veritrain smoke configs/digits.yaml
    """
    from veritrain.core.config import load_config
    from veritrain.orchestration import smoke
    from veritrain.records.workspace import Workspace

    result = smoke.run(load_config(config, overrides), Workspace.open(workdir))
    if as_json:
        emit_json(result)
    else:
        render.smoke(result)
    return 0
