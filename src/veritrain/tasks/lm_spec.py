"""What the language model (veritrain.tasks.lm) declares about its numbers, torch-free: read by shared code through
`veritrain.core.task_registry.task_spec("lm")`."""

from __future__ import annotations

from veritrain.core.task_spec import BaselineRule, MetricSpec, TaskSpec

SPEC = TaskSpec("lm", metrics=(
    MetricSpec("bits_per_byte", "min", (0.0, None), epoch_key="val_bits_per_byte", headline=True),
    MetricSpec("perplexity", "min", (1.0, None)),
    MetricSpec("loss", "min", (0.0, None), epoch_key="val_loss"),  # nats per token; the LM's criterion has no smoothing
), baseline=BaselineRule("bits_per_byte", "bigram"))
