"""SIGINT/SIGTERM handling: inside the training loop a signal is noted and acted on at the next step
boundary (so the step finishes cleanly); elsewhere, or on a second signal, it interrupts at once."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator, Optional

from veritrain.core.errors import Interrupted


class StopFlag:
    def __init__(self) -> None:
        self.signum: Optional[int] = None
        self.deferring = False

    def handle(self, signum: int, frame: object) -> None:
        if self.deferring and self.signum is None:
            self.signum = signum  # the loop checks `check()` after the current step
            return
        raise Interrupted(signum)

    def check(self) -> None:
        if self.signum is not None:
            raise Interrupted(self.signum)

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """Within this block a first signal waits for the next `check()`."""
        self.deferring = True
        try:
            yield
        finally:
            self.deferring = False


@contextmanager
def interruptible() -> Iterator[StopFlag]:
    flag = StopFlag()
    if threading.current_thread() is not threading.main_thread():  # signals only reach the main thread
        yield flag
        return
    previous = {s: signal.signal(s, flag.handle) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield flag
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
