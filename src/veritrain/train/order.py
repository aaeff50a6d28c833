"""The data order of `run.batches`: a pure function of (seed, epoch, batch), so that a run resumed in the middle of
an epoch, or a replay that starts at a checkpoint, draws exactly the rows the uninterrupted run drew, with no
loader state to save.

Epoch e (1-based) permutes the n row indices with a generator seeded from (seed, e) alone
(`epoch_generator`, stream 0, as veritrain's earlier loop ordered its batches); batch b of it is rows
[b·batch_size, (b+1)·batch_size) of that permutation. `drop_last` drops an epoch's last, shorter batch.
A *position* is the number of batches trained so far (the global step count): batch `step` of the run is
batch `step mod per_epoch` of epoch `step div per_epoch + 1`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Optional

import numpy as np
import torch

from veritrain.core.errors import UserError


def epoch_generator(seed: int, epoch: int, stream: int, rank: int = 0) -> torch.Generator:
    """A generator for one epoch and purpose (0: data order, 1: augmentation), independent of how
    many random numbers earlier epochs drew — so an epoch can be replayed from its number alone.
    Ranks after the first draw their own augmentation (`rank`); rank 0 draws what one process draws."""
    entropy = [seed % 2**63, epoch, stream] + ([rank] if rank else [])
    state = np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(state))


@dataclass(frozen=True)
class Order:
    """What `run.batches(n, batch_size, epochs, drop_last)` was asked for, and the seed it draws with; `steps`, when
    the run stops before its last epoch's end (`train.max_steps`): the batches it trains in all, over `epochs`."""

    n: int
    batch_size: int
    epochs: int
    drop_last: bool
    seed: int
    steps: Optional[int] = None

    def __post_init__(self) -> None:
        for name in ("n", "batch_size", "epochs"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise UserError(f"run.batches: {name}={value!r}; give a positive whole number")
        if self.drop_last and self.n < self.batch_size:
            raise UserError(f"run.batches: n={self.n} rows make no full batch of {self.batch_size} with drop_last=True")
        if self.steps is not None and not (type(self.steps) is int and 0 < self.steps <= self.per_epoch * self.epochs):
            raise UserError(f"run.batches: steps={self.steps!r}; give a whole number from 1 to the {self.per_epoch * self.epochs} batches of the epochs")

    @classmethod
    def of_steps(cls, n: int, batch_size: int, steps: int, drop_last: bool, seed: int) -> Order:
        """`steps` batches, over the epochs they take."""
        whole = cls(n, batch_size, 1, drop_last, seed)
        return cls(n, batch_size, -(-steps // whole.per_epoch), drop_last, seed, steps)

    @property
    def per_epoch(self) -> int:
        return self.n // self.batch_size if self.drop_last else -(-self.n // self.batch_size)

    @property
    def total(self) -> int:
        return self.steps if self.steps is not None else self.per_epoch * self.epochs

    def as_dict(self) -> dict[str, Any]:
        """What a checkpoint saves of the order: `steps` only when set, so an order of whole epochs is saved (and hashed
        into the state) as it was before the field existed."""
        return {k: v for k, v in asdict(self).items() if k != "steps" or v is not None}

    def difference(self, other: dict[str, Any]) -> str:
        """How `other` (a saved order) differs, as `name saved → now` items; "" when it is the same."""
        mine = self.as_dict()
        return ", ".join(f"{k} {other.get(k)!r} → {v!r}" for k, v in mine.items() if other.get(k) != v)

    def permutation(self, epoch: int) -> np.ndarray:
        return torch.randperm(self.n, generator=epoch_generator(self.seed, epoch, 0)).numpy().astype(np.int64)

    def rows(self, step: int, permutation: np.ndarray | None = None) -> np.ndarray:
        """The row indices of batch `step` (0-based, counted over the whole run)."""
        epoch, batch = divmod(step, self.per_epoch)
        order = permutation if permutation is not None else self.permutation(epoch + 1)
        return order[batch * self.batch_size:(batch + 1) * self.batch_size]

    def epoch_of(self, position: int) -> tuple[int, int]:
        """(epoch in progress, 1-based; batches of it done) at `position` batches trained."""
        epoch, batch = divmod(position, self.per_epoch)
        return epoch + 1, batch


class StepRows:
    """`Order.rows` of one step after another, the epoch's permutation drawn once per epoch: what a worker building the
    batches ahead (veritrain.data.loader) asks for, step by step."""

    def __init__(self, order: Order) -> None:
        self.order = order
        self._epoch, self._permutation = -1, np.empty(0, dtype=np.int64)

    def __call__(self, step: int) -> np.ndarray:
        epoch = step // self.order.per_epoch
        if epoch != self._epoch:
            self._epoch, self._permutation = epoch, self.order.permutation(epoch + 1)
        return self.order.rows(step, self._permutation)
