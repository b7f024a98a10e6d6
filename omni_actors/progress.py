"""Progress of slow preparation: a bar on a terminal, plain `progress` log lines otherwise.

    bar = progress.start("model.prepare", total=4, pipeline="assistant")   # reports 0/4
    for part in parts:
        build(part)
        bar.advance(part=part)              # or bar.update(done, part=...)

Used where start-up waits: first-run model preparation (`omni-run prepare`, the
assistant's data), `omni-run make-tiny`, weights loading (stage workers becoming
Ready, in the supervisor) and CUDA graph capture (hf_ar_graphs.py).

The bar is drawn only in the main process, when its stderr is a terminal and logs
are console lines (`--log-format console`). It is drawn as a whole line per step
rather than redrawn in place, because workers share that terminal and their log
lines would land in the middle of a line being redrawn. Anywhere else (a log file,
JSON logs, a worker process) each step is one `logs.get` event named by the caller,
with `done` and `total` keys. Either way at most LINES_PER_TOTAL lines, besides the
first and the last.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from omni_actors import logs

BAR_WIDTH = 28
"""Characters of the drawn bar."""
LINES_PER_TOTAL = 10
"""A line at most every tenth of the total (a thousand weights would otherwise be a thousand lines)."""

_main = False


def main_process() -> None:
    """Mark this process as the one that owns the terminal (omni-run's main process)."""
    global _main
    _main = True


def drawing() -> bool:
    """Would a Progress draw a bar here (main process, console logs, stderr a terminal)?"""
    return _main and not logs.json_logs() and sys.stderr.isatty()


class Progress:
    """done of total steps of one slow thing; draws a bar or logs `event` lines (see the module doc)."""

    def __init__(self, event: str, total: int, logger: str = "omni_actors.progress", **keys: Any) -> None:
        self.event = event
        self.total = max(0, int(total))
        self.keys = keys
        self.done = 0
        self.bar = drawing()
        self.log = logs.get(logger)
        self.t0 = time.monotonic()
        self._reported = -1  # the tenth (of LINES_PER_TOTAL) last reported

    def advance(self, steps: int = 1, **item: Any) -> None:
        self.update(self.done + steps, **item)

    def update(self, done: int, **item: Any) -> None:
        self.done = min(max(0, int(done)), self.total) if self.total else int(done)
        tenth = self.done * LINES_PER_TOTAL // self.total if self.total else LINES_PER_TOTAL
        if tenth == self._reported:  # (the last step is the only one in the last tenth)
            return
        self._reported = tenth
        if self.bar:
            self._draw(self.done / self.total if self.total else 1.0, item)
        else:
            self.log.info(self.event, done=self.done, total=self.total, **self.keys, **item)

    def _draw(self, frac: float, item: dict[str, Any]) -> None:
        filled = int(BAR_WIDTH * frac)
        what = " ".join(f"{v}" for v in (*self.keys.values(), *item.values()))
        print(f"  {self.event:<18} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {self.done}/{self.total}  "
              f"{time.monotonic() - self.t0:5.1f} s  {what}", file=sys.stderr, flush=True)


def start(event: str, total: int, **keys: Any) -> Progress:
    """A Progress that has reported its start (0 of total)."""
    bar = Progress(event, total, **keys)
    bar.update(0)
    return bar
