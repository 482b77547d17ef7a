"""A tiny progress bar with ETA on stderr (no dependency).

On a terminal it redraws one line in place; otherwise (a log file, CI) it prints a plain line
about every 10% so logs stay short. Used as a context manager, it also says the stage is still
working when nothing was printed for `heartbeat` seconds: a piece of work can take longer than
that (a joint chunk of 8 conditions on a slow model), and a log that stays silent that long
looks like a hung run.
"""

from __future__ import annotations

import sys
import threading
import time


def _fmt_seconds(s: float) -> str:
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m:02d}:{sec:02d}"


SLOW_AFTER = 180.0  # seconds: a stage estimated to take longer says so after its first block
HEARTBEAT = 600.0  # seconds without a line before a running stage says it is still working


class Progress:
    """The estimated total time is printed once the first block is timed, if it exceeds
    SLOW_AFTER seconds, so every long stage says how long it will take before its first 10%;
    slow_hint: printed with it (e.g. how to make a long screen faster); plan: how the
    work runs ("2 workers x 1 BLAS thread"), printed with that estimate; parallel: blocks
    computed at once (workers), so the first block's time is that of `parallel` blocks (the
    progress line's ETA follows that estimate until `parallel` blocks have been reported);
    heartbeat: seconds of silence after which, inside `with`, a line says the stage is still
    working (0: never); unit: what is counted, printed after the counts ("evaluations").

    total_work: when the counted units differ in cost (a panel whose first items are short), the
    stage's total cost in any unit (e.g. characters of text x conditions), each `update` then
    saying what its piece cost (`work`): the estimate and the ETA follow the share of the
    work done, not of the units counted."""

    def __init__(
        self,
        label: str,
        total: int,
        stream=None,
        enabled: bool = True,
        width: int = 24,
        slow_hint: str | None = None,
        plan: str = "",
        parallel: int = 1,
        heartbeat: float = HEARTBEAT,
        unit: str = "",
        total_work: float | None = None,
    ):
        self.label = label
        self.total = max(int(total), 0)
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled and self.total > 0
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.width = width
        self.done = 0
        self.total_work = float(total_work) if total_work else None
        self.work_done = 0.0
        self.start = time.monotonic()
        self.next_decile = 1
        self.updates = 0  # pieces of work reported so far
        self.first_estimate: float | None = None  # seconds for the stage, from its first piece
        self.slow_hint = slow_hint
        self.plan = plan
        self.parallel = max(1, int(parallel))
        self.heartbeat = float(heartbeat)
        self.unit = f" {unit}" if unit else ""
        self._lock = threading.Lock()  # the heartbeat thread writes too
        self._writes = 0  # lines written so far (the heartbeat watches it change)
        self._stopped = threading.Event()
        self._beat_thread: threading.Thread | None = None

    def __enter__(self) -> Progress:
        if self.enabled and self.heartbeat > 0:
            self._beat_thread = threading.Thread(target=self._beat, daemon=True)
            self._beat_thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stopped.set()
        if self._beat_thread is not None:
            self._beat_thread.join()

    def _beat(self) -> None:
        seen, quiet_since = self._writes, time.monotonic()
        while not self._stopped.wait(self.heartbeat / 4):
            now = time.monotonic()
            if self._writes != seen:
                seen, quiet_since = self._writes, now
            elif now - quiet_since >= self.heartbeat:
                # a terminal redraws the bar (its elapsed time moves); a log gets a line
                self._write("\r" + self.line() if self.tty else self.still_working_line() + "\n")
                seen, quiet_since = self._writes, now

    def still_working_line(self) -> str:
        elapsed = _fmt_seconds(time.monotonic() - self.start)
        return (
            f"{self.label:<10} still working: {self.done} of {self.total}{self.unit} finished "
            f"after {elapsed} (the count moves when a piece of work ends)"
        )

    def _write(self, text: str) -> None:
        with self._lock:
            self.stream.write(text)
            self.stream.flush()
            self._writes += 1

    def _work_fraction(self) -> float:
        """The share of the stage's work done: of total_work when given, else of the count."""
        if self.total_work:
            return min(1.0, self.work_done / self.total_work)
        return self.done / self.total if self.total else 1.0

    def line(self) -> str:
        frac = self.done / self.total if self.total else 1.0
        elapsed = time.monotonic() - self.start
        share = self._work_fraction()
        if self.first_estimate is not None and self.updates < self.parallel:
            # the first wave: its other pieces ran beside the first and are nearly done too,
            # so the time left is the first piece's estimate for the stage less what has passed
            eta = max(self.first_estimate - elapsed, 0.0)
        elif self.done and share > 0:
            eta = elapsed / share * (1 - share)
        else:
            eta = float("nan")
        filled = int(frac * self.width)
        bar = "#" * filled + "-" * (self.width - filled)
        eta_s = _fmt_seconds(eta) if eta == eta else "--:--"
        return (
            f"{self.label:<10} [{bar}] {self.done}/{self.total}{self.unit} {100 * frac:5.1f}%  "
            f"{_fmt_seconds(elapsed)} elapsed, ETA {eta_s}"
        )

    def update(self, n: int = 1, work: float | None = None) -> None:
        """n more units counted; `work`: what they cost, in the unit of total_work."""
        if work is None and self.total_work is not None:
            raise ValueError("Progress.update: give `work` when the bar has total_work")
        first = self.done == 0
        self.done = min(self.total, self.done + n)
        self.work_done += n if work is None else work
        self.updates += 1
        if not self.enabled:
            return
        share = self._work_fraction()
        if first and self.done < self.total and share > 0:  # (a piece of no work says nothing)
            elapsed = time.monotonic() - self.start
            # at least the first piece's own time: a piece holding more than 1/parallel of the
            # work (a confirm stage of 800 + 300 evaluations) bounds the stage from below
            estimate = max(elapsed, elapsed / share / min(self.parallel, self.total))
            self.first_estimate = estimate
            if estimate > SLOW_AFTER:
                plan = f" with {self.plan}" if self.plan else ""
                hint = f"; {self.slow_hint}" if self.slow_hint else ""
                held = ""
                if self.total_work:
                    held = f", {100 * share:.1f}% of the stage's text"
                self._write(
                    f"{self.label:<10} about {_fmt_seconds(estimate)} in all{plan} at the pace of "
                    f"its first {self.done} of {self.total}{self.unit} ({_fmt_seconds(elapsed)}"
                    f"{held}){hint}\n"
                )
        if self.tty:
            self._write("\r" + self.line() + ("\n" if self.done == self.total else ""))
        else:
            decile = self.done * 10 // self.total
            if decile >= self.next_decile:
                self.next_decile = decile + 1
                self._write(self.line() + "\n")
