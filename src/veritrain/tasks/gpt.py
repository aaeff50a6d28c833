"""A small decoder-only GPT in plain torch: token ids (batch, time) → next-token logits (batch, time, vocab).

Token and learned position embeddings, `layers` pre-LayerNorm blocks (causal self-attention through
`scaled_dot_product_attention`, then a 4× GELU MLP, each added to the residual stream), a final LayerNorm and a
linear head, tied to the token embedding by default. Around it: the AdamW parameter groups and seeded sampling (the
learning-rate schedule is the training loop's, the ONNX export the export stage's). Building a model with the same config
and seed gives bit-identical weights, and neither building nor sampling touches torch's global RNG.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn

from veritrain.core.errors import UserError

INIT_STD = 0.02  # standard deviation of every weight matrix and embedding at initialization


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int  # distinct token ids, 0 … vocab_size-1 (256 for raw bytes)
    context: int  # tokens the model sees at once: the length of the position table
    layers: int  # transformer blocks
    width: int  # size of the residual stream (channels per token)
    heads: int  # attention heads; each has width // heads channels
    dropout: float = 0.0  # probability, on the embeddings, the attention weights and each residual branch; 0 = none
    tied_embeddings: bool = True  # the LM head reuses the token embedding matrix (one tensor, not two)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "tied_embeddings":
                if not isinstance(value, bool):
                    raise UserError(f"gpt.tied_embeddings: expected true or false, got {value!r}")
            elif f.name == "dropout":
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                    raise UserError(f"gpt.dropout: expected a probability in [0, 1), got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UserError(f"gpt.{f.name}: expected a positive integer, got {value!r}")
        if self.width % self.heads:
            raise UserError(f"gpt.width: {self.width} is not a multiple of gpt.heads ({self.heads}); "
                            f"choose a width that heads divides")


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.heads = cfg.heads
        self.dropout = cfg.dropout
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width)  # queries, keys and values of all heads in one matrix
        self.proj = nn.Linear(cfg.width, cfg.width)  # back into the residual stream
        self.residual_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (batch, time, width)
        batch, time, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        # (batch, time, width) → (batch, heads, time, head size): each head attends on its own
        q, k, v = (t.view(batch, time, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        y = y.transpose(1, 2).reshape(batch, time, width)
        return self.residual_dropout(self.proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.width, 4 * cfg.width)
        self.proj = nn.Linear(4 * cfg.width, cfg.width)  # back into the residual stream
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x))))  # exact (erf) GELU: ONNX has it as one operator


class Block(nn.Module):
    """Pre-LayerNorm: each branch reads a normalized copy of the stream and adds its output to the unnormalized
    stream, so the residual path from the embeddings to the head stays an identity (stable without warmup tricks)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_attn = nn.LayerNorm(cfg.width)
        self.attn = CausalSelfAttention(cfg)
        self.ln_mlp = nn.LayerNorm(cfg.width)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_attn(x))
        return x + self.mlp(self.ln_mlp(x))


class GPT(nn.Module):
    """`GPT(cfg, seed)`: weights drawn by `init_weights(self, seed)`; torch's global RNG is left as it was."""

    def __init__(self, cfg: GPTConfig, seed: int = 0):
        super().__init__()
        self.cfg = cfg
        self.context: int = cfg.context  # read by forward: TorchScript cannot read the config dataclass
        # nn.Linear and nn.Embedding draw their default init from the global RNG; fork it so that building a model
        # leaves the caller's random stream where it was (init_weights then overwrites every parameter)
        with torch.random.fork_rng(devices=[]):
            self.token_embedding = nn.Embedding(cfg.vocab_size, cfg.width)
            self.position_embedding = nn.Embedding(cfg.context, cfg.width)
            self.dropout = nn.Dropout(cfg.dropout)
            self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
            self.ln_final = nn.LayerNorm(cfg.width)
            self.head = nn.Linear(cfg.width, cfg.vocab_size, bias=False)
        if cfg.tied_embeddings:
            self.head.weight = self.token_embedding.weight  # one Parameter: parameters() lists it once
        init_weights(self, seed)

    def optimizer_groups(self, weight_decay: float) -> list[dict[str, Any]]:
        """AdamW's parameter groups (`param_groups`): the training loop asks a model for them."""
        return param_groups(self, weight_decay)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """idx: (batch, time) int64 token ids, time ≤ context → logits (batch, time, vocab_size), float32."""
        time = idx.shape[1]
        if time > self.context:
            raise ValueError(f"{time} tokens is more than the model's context of {self.context}; crop the input")
        # slicing the table (not indexing it with arange) keeps the ONNX graph one Slice for any length
        x = self.token_embedding(idx) + self.position_embedding.weight[:time]
        x = self.dropout(x)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_final(x))


def init_weights(model: GPT, seed: int) -> None:
    """Every parameter from a generator seeded with `seed`, in `named_parameters()` order (a tied tensor once):
    weight matrices and embeddings normal(0, 0.02), the two projections that write into the residual stream in each
    block normal(0, 0.02 / sqrt(2·layers)) (the stream sums 2·layers branches; this keeps its variance at the top
    near that of the embeddings), biases 0, LayerNorm scale 1 and shift 0."""
    generator = torch.Generator().manual_seed(seed)
    residual_std = INIT_STD / math.sqrt(2 * model.cfg.layers)
    owner = _owning_modules(model)
    with torch.no_grad():
        for name, param in model.named_parameters():
            module = owner[id(param)]
            if isinstance(module, nn.LayerNorm) and name.endswith("weight"):
                nn.init.ones_(param)
            elif name.endswith("bias"):  # LayerNorm shifts too
                nn.init.zeros_(param)
            elif name.endswith("attn.proj.weight") or name.endswith("mlp.proj.weight"):
                nn.init.normal_(param, 0.0, residual_std, generator=generator)
            else:
                nn.init.normal_(param, 0.0, INIT_STD, generator=generator)


def _owning_modules(model: nn.Module) -> dict[int, nn.Module]:
    """id(parameter) → the module it belongs to; a tensor shared by an Embedding and a Linear (tied embeddings)
    belongs to the Embedding, whichever comes first."""
    owner: dict[int, nn.Module] = {}
    for module in model.modules():
        for param in module.parameters(recurse=False):
            if id(param) not in owner or isinstance(module, nn.Embedding):
                owner[id(param)] = module
    return owner


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy in nats over every position of (batch, time, vocab) logits and (batch, time) targets."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def summed_nats(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """Total cross-entropy in nats over every position, each in float64 and summed exactly rounded (`math.fsum`), so
    the figure an evaluation reports does not depend on batch size or thread count (lm_metrics takes it from here)."""
    per_token = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(), targets.reshape(-1), reduction="none")
    return math.fsum(per_token.tolist())


def parameter_count(model: nn.Module) -> int:
    """Distinct parameters (a tied tensor counted once)."""
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------- optimization


def weight_decay_split(model: nn.Module) -> tuple[list[str], list[str]]:
    """(names that get weight decay, names that do not), each parameter once in `named_parameters()` order.

    The rule: decay the 2-D weight matrices of nn.Linear layers; no decay on biases, LayerNorm parameters and
    embeddings (token and position). A Linear weight that is an embedding (the LM head tied to the token embedding)
    is an embedding: no decay. Decaying a norm's scale or a bias pulls it toward 0, which only costs capacity."""
    owner = _owning_modules(model)
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        module = owner[id(param)]
        if isinstance(module, nn.Linear) and param.dim() == 2:
            decay.append(name)
        else:
            no_decay.append(name)
    return decay, no_decay


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """The two groups for `torch.optim.AdamW(param_groups(model, wd), lr=...)`, by `weight_decay_split`'s rule."""
    decay, no_decay = weight_decay_split(model)
    params = dict(model.named_parameters())
    return [
        {"params": [params[name] for name in decay], "weight_decay": weight_decay},
        {"params": [params[name] for name in no_decay], "weight_decay": 0.0},
    ]


def generate(model: GPT, prompt_ids: Union[Sequence[int], torch.Tensor], tokens: int, temperature: float, seed: int,
             top_k: Optional[int] = None) -> list[int]:
    """The `tokens` ids that follow `prompt_ids` (at least one id), one at a time from the model's last `context` ids.

    temperature 0 takes the most likely id (the lowest on a tie); otherwise the logits are divided by `temperature`,
    cut to the `top_k` largest when given, and one id is drawn by inverting the cumulative probabilities (float64) at
    a uniform number from a torch.Generator seeded with `seed`: the same seed gives the same ids on a CPU, and torch's
    global RNG is not used. The model runs in eval mode (no dropout) and is put back in the mode it was in."""
    ids = [int(i) for i in (prompt_ids.reshape(-1).tolist() if isinstance(prompt_ids, torch.Tensor) else prompt_ids)]
    vocab, context = model.cfg.vocab_size, model.cfg.context
    if not ids:
        raise UserError("prompt: empty; give at least one token to start from")
    if any(not 0 <= i < vocab for i in ids):
        raise UserError(f"prompt: token ids must be in 0 … {vocab - 1}, the model's vocabulary")
    if tokens < 0:
        raise UserError(f"tokens: expected a count ≥ 0, got {tokens}")
    if not temperature >= 0.0:  # also refuses NaN
        raise UserError(f"temperature: expected ≥ 0 (0 = always the most likely token), got {temperature}")
    if top_k is not None and top_k < 1:
        raise UserError(f"top_k: expected a positive number of candidate tokens, got {top_k}")
    generator = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    new: list[int] = []
    try:
        with torch.no_grad():
            for _ in range(tokens):
                window = torch.tensor([ids[-context:]], dtype=torch.long, device=device)
                choice = next_token(model(window)[0, -1], temperature, top_k, generator)
                ids.append(choice)
                new.append(choice)
    finally:
        model.train(was_training)
    return new


def next_token(logits: torch.Tensor, temperature: float, top_k: Optional[int], generator: torch.Generator) -> int:
    """The id drawn from one position's logits (vocab,) as `generate` draws it (float64 on the CPU): the most likely
    at temperature 0, else a sample of logits / temperature among the `top_k` most likely. `veritrain generate` draws
    from an export's ONNX logits with it."""
    logits = logits.double().cpu()
    if temperature == 0.0:
        return int(torch.argmax(logits))  # the first of equal maxima
    return _sample(logits / temperature, top_k, generator)


def _sample(logits: torch.Tensor, top_k: Optional[int], generator: torch.Generator) -> int:
    candidates = torch.arange(len(logits))
    if top_k is not None and top_k < len(logits):
        # stable sort: among equal logits the lower id ranks first, so the cut is the same on every machine
        order = torch.sort(logits, descending=True, stable=True).indices[:top_k]
        candidates, logits = order, logits[order]
    cumulative = torch.cumsum(torch.softmax(logits, dim=0), dim=0)
    u = torch.rand((), generator=generator, dtype=torch.float64) * cumulative[-1]
    position = min(int(torch.searchsorted(cumulative, u, right=True)), len(candidates) - 1)
    return int(candidates[position])
