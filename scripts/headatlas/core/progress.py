"""Progress of long loops: done / total, rate, ETA.

One helper for every step that can run longer than a minute. A log line (``headatlas.progress``
logger, so it reaches the rule's log file) at most every ``every`` seconds (30 by default) and at
the end; when stderr is a terminal, also a one-line bar redrawn in place. Wrap a loop::

    for batch in progress(batches, total=n_tokens, what="extract minilm", unit="tokens",
                          weight=lambda b: lengths[b].sum()):
        ...

or keep one :class:`Progress` across several loops (``p.iter(...)``, ``p.update(n)``, ``p.close()``).
The clock is injectable, so tests run on a fake one.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
LOG = logging.getLogger("headatlas.progress")
BAR_EVERY = 0.25  # seconds between redraws of the terminal bar


def duration(seconds: float) -> str:
    """``75`` -> ``1m15s``; ``3725`` -> ``1h02m``; ``9`` -> ``9s``."""
    s = int(round(max(seconds, 0.0)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Progress:
    """Counts work done towards ``total`` units and reports it (see the module docstring)."""

    def __init__(
        self,
        total: float | None,
        what: str,
        unit: str = "items",
        every: float = 30.0,
        log: logging.Logger | None = None,
        clock: Callable[[], float] = time.monotonic,
        stream=None,
        bar: bool | None = None,
    ):
        self.total = None if total is None else float(total)
        self.what, self.unit, self.every = what, unit, float(every)
        self.log = log or LOG
        self.clock = clock
        self.stream = stream if stream is not None else sys.stderr
        if bar is None:
            try:
                bar = bool(self.stream.isatty())
            except (AttributeError, ValueError):
                bar = False
        self.bar = bar
        self.done = 0.0
        self.t0 = self.last_log = self.last_bar = clock()
        self.closed = False

    def line(self) -> str:
        """``what: done / total unit (pct), rate unit/s, elapsed, ETA``."""
        dt = self.clock() - self.t0
        rate = self.done / dt if dt > 0 else 0.0
        parts = [f"{self.what}: {self.done:,.0f}"]
        if self.total:
            parts[0] += f" / {self.total:,.0f} {self.unit} ({self.done / self.total:.0%})"
        else:
            parts[0] += f" {self.unit}"
        parts.append(f"{rate:,.1f} {self.unit}/s" if rate < 10 else f"{rate:,.0f} {self.unit}/s")
        parts.append(f"elapsed {duration(dt)}")
        if self.total and 0 < rate and self.done < self.total:
            parts.append(f"ETA {duration((self.total - self.done) / rate)}")
        return ", ".join(parts)

    def _draw(self, end: str = "") -> None:
        width = 24
        frac = min(self.done / self.total, 1.0) if self.total else 0.0
        filled = int(frac * width)
        self.stream.write(f"\r\033[K[{'#' * filled}{'.' * (width - filled)}] {self.line()}{end}")
        self.stream.flush()

    def _emit(self) -> None:
        if self.bar:
            self.stream.write("\r\033[K")  # the log line replaces the bar; the next update redraws it
        self.log.info("%s", self.line())

    def update(self, n: float = 1) -> None:
        """Add ``n`` units done; report if ``every`` seconds passed since the last report, and
        the final line once ``total`` is reached."""
        self.done += float(n)
        now = self.clock()
        if now - self.last_log >= self.every:
            self.last_log = now
            self._emit()
        if self.bar and now - self.last_bar >= BAR_EVERY:
            self.last_bar = now
            self._draw()
        if self.total is not None and self.done >= self.total:
            self.close()

    def iter(self, items: Iterable[T], weight: Callable[[T], float] | None = None) -> Iterator[T]:
        """Yield ``items``, counting each as ``weight(item)`` units (1 without ``weight``) once the
        loop body is done with it."""
        for item in items:
            yield item
            self.update(1 if weight is None else weight(item))

    def close(self) -> None:
        """Log the final line (once)."""
        if self.closed:
            return
        self.closed = True
        if self.bar:
            self._draw(end="\n")
        self.log.info("%s (done)", self.line())

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress(
    items: Iterable[T],
    what: str,
    total: float | None = None,
    unit: str = "items",
    weight: Callable[[T], float] | None = None,
    **kwargs,
) -> Iterator[T]:
    """Wrap one loop: yield ``items`` while a :class:`Progress` reports them; ``total`` defaults
    to ``len(items)`` when it has one. The final line is logged when the loop ends."""
    if total is None and hasattr(items, "__len__") and weight is None:
        total = len(items)
    p = Progress(total, what, unit, **kwargs)
    try:
        yield from p.iter(items, weight)
    finally:
        if p.done >= (p.total or 0):
            p.close()
