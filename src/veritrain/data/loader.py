"""Work built ahead in worker processes, item by item: the batches of training's steps (`train.num_workers`), of an
evaluation, the files `predict` decodes. Each item is a pure function of its index: for training, what a step trains
on is a function of the step (its rows, `Order.rows`; its augmentation, the generator the engine gives that step), so
a worker builds exactly what the training process would have built, results do not depend on how many workers there
are, and a resumed run, a replay or a rollback asks for another step and gets it. With no workers the caller's
process builds each item itself, when it is asked for, as it always did.

    with Feeder(build, total_steps, workers=2) as feed:
        for step in range(start, total_steps):
            parts = feed.get(step)   # build(step)'s items, built (and prefetched) by the workers
"""

from __future__ import annotations

import multiprocessing
import signal
from typing import Any, Callable, Iterable, Iterator, Optional

import torch
from torch.utils.data import DataLoader, Dataset

PREFETCH = 2  # steps each worker builds ahead


class _Steps(Dataset):
    """Step k → what `build(k)` gives, as a list (a worker sends it whole)."""

    def __init__(self, build: Callable[[int], Iterable[Any]]) -> None:
        self.build = build

    def __getitem__(self, step: int) -> list[Any]:
        return list(self.build(step))


def _quiet(worker_id: int) -> None:
    """A worker leaves SIGINT and SIGTERM to the training process: a Ctrl-C reaches the whole process group, and a
    worker that died of it would fail the step the training process is waiting for, instead of letting it save at the
    step's end and stop. The training process stops its workers when it stops; if it is killed, they notice and exit."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _as_built(item: list[Any]) -> list[Any]:
    """What a worker sends, unchanged (torch's default would turn tuples and arrays into lists and tensors)."""
    return item


class Feeder:
    """The batches of every step from the one asked for on: `get(step)` gives `build(step)`'s batches. With workers they
    are built in `workers` processes, `PREFETCH` steps each ahead of the step training, pinned when `pin`; asked for
    another step than the next (a resume point, a rollback), the workers start again from it. The workers draw nothing
    from the training process's generators (theirs is a private one), so its dropout and initialisation stay the same
    for any number of workers."""

    def __init__(self, build: Callable[[int], Iterable[Any]], total: int, workers: int, pin: bool = False) -> None:
        self.build, self.total, self.workers, self.pin = build, total, workers, pin
        self._batches: Optional[Iterator[list[Any]]] = None
        self._next = -1

    def get(self, step: int) -> Iterable[Any]:
        if self.workers == 0:
            return self.build(step)
        if self._batches is None or step != self._next:
            self.close()
            self._batches = iter(self._loader(step))
        self._next = step + 1
        return next(self._batches)

    def _loader(self, start: int) -> DataLoader:
        # fork where the platform has it: the workers share the task's decoded arrays instead of receiving a copy
        context = multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() else None
        return DataLoader(_Steps(self.build), batch_size=None, sampler=range(start, self.total), num_workers=self.workers,
                          prefetch_factor=PREFETCH, pin_memory=self.pin, multiprocessing_context=context, collate_fn=_as_built,
                          worker_init_fn=_quiet,
                          generator=torch.Generator())  # the base seed it draws comes from here, not the global generator

    def close(self) -> None:
        """Stop the workers (their prefetched batches are dropped)."""
        self._batches = None  # the iterator's finaliser shuts its workers down
        self._next = -1

    def __enter__(self) -> Feeder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
