"""Work spread over worker processes, results in the order given: the image checks and decodes, and the text gate's
first look at each document. Batches are made as the workers take them, at most IN_FLIGHT_PER_WORKER a worker ahead,
so memory holds those batches, never every item.

Workers are spawned (a clean interpreter, safe even when the parent has torch and its thread pools loaded), with
one BLAS thread each: the workers already use every core, and oversubscribed BLAS threads (numpy's matmul in the
perceptual hash) made 2 workers slower than 1."""

from __future__ import annotations

import collections
import itertools
import os
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any, Callable, Iterable

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
IN_FLIGHT_PER_WORKER = 4  # batches handed to each worker process ahead of the one being read back


def in_parallel(func: Callable[..., Iterable[Any]], items: Iterable[Any], workers: int, *args: Any, size: int = 64) -> Iterable[Any]:
    """`func(batch, *args)` over batches of `size` items, each result of each batch in order; in this process when
    `workers` ≤ 1."""
    iterator = iter(items)
    batches = iter(lambda: list(itertools.islice(iterator, size)), [])
    if workers <= 1:
        for batch in batches:
            yield from func(batch, *args)
        return
    saved = {k: os.environ.get(k) for k in THREAD_VARIABLES}
    os.environ.update({k: "1" for k in THREAD_VARIABLES})
    try:
        with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
            pending: collections.deque[Any] = collections.deque()
            for batch in batches:
                pending.append(pool.submit(func, batch, *args))
                if len(pending) >= workers * IN_FLIGHT_PER_WORKER:
                    yield from pending.popleft().result()
            while pending:
                yield from pending.popleft().result()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
