"""Progress of long work: a tqdm bar on a terminal, a log line every ``every_s`` seconds otherwise.

Library code reports through :class:`Progress` and never prints: with stderr attached to a
terminal the bar goes there (tqdm), and in a batch job, a sweep worker or a test the logger gets
one line now and then (nothing at all for work shorter than ``every_s``). ``update`` is cheap
enough for a per-request loop: the clock is read once every ``check_every`` updates.
"""

from __future__ import annotations

import logging
import sys
import time
from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tqdm import tqdm

log = logging.getLogger(__name__)


class Progress:
    """Count ``total`` steps of ``what`` (see the module docstring); use as a context manager."""

    def __init__(
        self, total: int, what: str, every_s: float = 10.0, check_every: int = 256
    ) -> None:
        self.total, self.what, self.every_s = total, what, every_s
        self.done = 0
        self._check_every = check_every
        self._start = self._last = time.perf_counter()
        self._bar: tqdm | None = None
        if sys.stderr.isatty():  # tqdm is imported only to draw a bar (0.03 s)
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=what, leave=False, mininterval=0.5)

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.done % self._check_every >= n:  # not on a multiple: no clock read
            return
        if self._bar is not None:
            self._bar.update(self.done - self._bar.n)
            return
        now = time.perf_counter()
        if now - self._last >= self.every_s:
            self._last = now
            rate = self.done / (now - self._start)
            log.info("%s: %d/%d (%.3g/s)", self.what, self.done, self.total, rate)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()
