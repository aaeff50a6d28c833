"""What the language model (veritrain.tasks.lm) declares about its numbers, torch-free: read by shared code through
`veritrain.core.task_registry.task_spec("lm")`."""

from __future__ import annotations

from veritrain.core.task_spec import BaselineRule, CardText, MetricSpec, TaskSpec

SPEC = TaskSpec("lm", metrics=(
    MetricSpec("bits_per_byte", "min", (0.0, None), epoch_key="val_bits_per_byte", headline=True),
    MetricSpec("perplexity", "min", (1.0, None), label="perplexity (per token)"),
    # nats per token; the LM's criterion has no smoothing, so the validation loss after every epoch is the same number
    MetricSpec("loss", "min", (0.0, None), epoch_key="val_loss", label="loss (nats per token)"),
), baseline=BaselineRule("bits_per_byte", "bigram"),
    fields=("tokens",), models=("gpt",), user_models=False,
    model_settings=(("gpt", ("model.layers", "model.width", "model.heads", "model.context", "model.dropout", "model.tied_embeddings")),), settings=("eval.generation",), serves_with="generate", bad_cases="bad_cases.json",
    card=CardText("A language model", "given token ids, it gives at each position the logits of the next token",
                  "text-generation", "Text Generation"))
