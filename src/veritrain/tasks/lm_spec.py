"""What the language model (veritrain.tasks.lm) declares about its numbers, torch-free: read by shared code through
`veritrain.core.task_registry.task_spec("lm")`."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from veritrain.core.config import Limit, ModelConfig
from veritrain.core.task_spec import BaselineRule, CardText, MetricSpec, TaskSpec


class GptModelConfig(ModelConfig):
    """The `model` section of task lm: the decoder-only transformer of veritrain.tasks.gpt."""

    name: str = Field("gpt", description="`gpt`: a decoder-only transformer (veritrain.tasks.gpt)")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout probability on the embeddings, the attention weights and each residual branch")
    layers: Annotated[int, Limit(1024)] = Field(2, ge=1, description="transformer blocks")
    width: Annotated[int, Limit(65536)] = Field(128, ge=1, description="the embedding width (a multiple of model.heads)")
    heads: Annotated[int, Limit(1024)] = Field(4, ge=1, description="attention heads per block")
    context: Annotated[int, Limit(1 << 20)] = Field(128, ge=2, description="tokens per training window (and the most a prediction sees)")
    tied_embeddings: bool = Field(True, description="the output layer shares the token embedding's weights")

    @model_validator(mode="after")
    def _heads_divide_the_width(self) -> GptModelConfig:
        if self.width % self.heads:
            raise ValueError(f"model.width {self.width} is not a multiple of model.heads {self.heads}; choose a width the heads divide")
        return self


SPEC = TaskSpec("lm", metrics=(
    MetricSpec("bits_per_byte", "min", (0.0, None), epoch_key="val_bits_per_byte", headline=True),
    MetricSpec("perplexity", "min", (1.0, None), label="perplexity (per token)"),
    # nats per token; the LM's criterion has no smoothing, so the validation loss after every epoch is the same number
    MetricSpec("loss", "min", (0.0, None), epoch_key="val_loss", label="loss (nats per token)"),
), baseline=BaselineRule("bits_per_byte", "bigram"),
    fields=("tokens",), models=("gpt",), user_models=False, model_section=GptModelConfig,
    model_settings=(("gpt", ("model.layers", "model.width", "model.heads", "model.context", "model.dropout", "model.tied_embeddings")),), settings=("eval.generation",), serves_with="generate", bad_cases="bad_cases.json",
    card=CardText("A language model", "given token ids, it gives at each position the logits of the next token",
                  "text-generation", "Text Generation"))
