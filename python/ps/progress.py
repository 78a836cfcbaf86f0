"""The job's progress as the scheduler computes it, and how a training loop
shows it (Session.batches(progress=...)).

The numbers are the job's, not this process's: the scheduler sums every
shard's position (proto JobProgress), so every worker shows the same
progress, and a replacement continues where the job stands.
"""

from __future__ import annotations

import atexit
import dataclasses
import sys
import threading
import time
import weakref
from typing import Any, Callable, Optional, TextIO, Union

from . import _native
from .errors import PsError


@dataclasses.dataclass(frozen=True)
class JobProgress:
    """Where the whole job stands (Session.job_progress()).

    Attributes:
      progress: steps trained over steps to train, summed over the shards,
        in [0, 1]; it does not go back while the scheduler runs. 0 from a
        scheduler that does not compute progress.
      eta_s: seconds left at the job's recent pace; None while unknown (no
        pace measured yet, or nothing trains).
      steps_done, steps_total: steps (batches) trained and to train, over
        every shard; steps_total is an estimate until total_known.
      total_known: every shard's size is known to the scheduler (reported
        by its worker: Session.batches does it for a Sized batches_of result
        or batches_per_epoch).
      steps_per_second, examples_per_second: the job's pace over the recent
        window (examples as the workers report them: end_step(examples=)).
      examples: examples trained, as the workers reported them.
      elapsed_s: seconds since the job started running.
    """

    progress: float
    eta_s: Optional[float]
    steps_done: int
    steps_total: int
    total_known: bool
    steps_per_second: float
    examples_per_second: float
    examples: int
    elapsed_s: float

    @staticmethod
    def _from_native(p: "_native.JobProgress") -> "JobProgress":
        return JobProgress(progress=float(p.progress),
                           eta_s=float(p.eta_s) if p.has_eta else None,
                           steps_done=int(p.steps_done), steps_total=int(p.steps_total),
                           total_known=bool(p.total_known),
                           steps_per_second=float(p.steps_per_second),
                           examples_per_second=float(p.examples_per_second),
                           examples=int(p.examples), elapsed_s=float(p.elapsed_s))


def format_seconds(seconds: Optional[float]) -> str:
    """A duration for a progress line: "?" when unknown, "31s", "5m02s",
    "3h05m"."""
    if seconds is None:
        return "?"
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def describe(p: JobProgress) -> str:
    """One plain line: "progress 42.0% eta 31s 12.5 steps/s"."""
    return (f"progress {100 * p.progress:.1f}% eta {format_seconds(p.eta_s)} "
            f"{p.steps_per_second:.1f} steps/s")


#: What Session.batches accepts as `progress`.
ProgressArg = Union[bool, Callable[[JobProgress], Any]]


class _Poller:
    """Asks `poll` for the job's progress on a thread of its own, at most
    once per `interval` seconds, so that the training loop never waits for
    the scheduler (a status call waits up to its RPC timeout while the
    scheduler is away). A failed poll is skipped: the last values stay."""

    def __init__(self, poll: Callable[[], JobProgress], interval: float) -> None:
        self._poll = poll
        self._interval = interval
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._latest: Optional[JobProgress] = None
        self._fresh = False
        self._thread = threading.Thread(target=self._run, name="ps-job-progress", daemon=True)
        _running.add(self)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                p = self._poll()
            except PsError:
                p = None  # the scheduler away or restarting, or the session closing
            if p is not None:
                with self._lock:
                    self._latest, self._fresh = p, True
            self._stop.wait(self._interval)

    def take(self) -> Optional[JobProgress]:
        """The newest values not taken yet (None: nothing new)."""
        with self._lock:
            if not self._fresh:
                return None
            self._fresh = False
            return self._latest

    def stop(self) -> None:
        """Stops polling; returns once no poll is in flight."""
        self._stop.set()
        _running.discard(self)
        if self._thread is not threading.current_thread():
            self._thread.join()


# Pollers still running, stopped at exit while threads still run normally: a
# poll finishing once the interpreter is finalizing would never return to
# Python, and a session closed then would wait for it.
_running: "weakref.WeakSet[_Poller]" = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for poller in list(_running):
        poller.stop()


class _Lines:
    """A plain progress line on `stream`: rewritten in place with '\\r' on a
    terminal; elsewhere (a log file) one line at most every `every` seconds,
    and a last one at the end."""

    def __init__(self, stream: TextIO, tty: bool, every: float = 10.0) -> None:
        self._stream = stream
        self._tty = tty
        self._every = every
        self._printed: Optional[float] = None  # monotonic time of the last line
        self._width = 0

    def _write(self, text: str) -> None:
        try:
            self._stream.write(text)
            self._stream.flush()
        except (OSError, ValueError):
            pass  # a closed or broken stream must not stop training

    def update(self, p: JobProgress) -> None:
        line = describe(p)
        if self._tty:
            self._write("\r" + line.ljust(self._width))
            self._width = max(self._width, len(line))
            self._printed = time.monotonic()
            return
        now = time.monotonic()
        if self._printed is None or now - self._printed >= self._every:
            self._write(line + "\n")
            self._printed = now

    def close(self, last: Optional[JobProgress]) -> None:
        if self._tty:
            if last is not None:
                self.update(last)
            if self._printed is not None:
                self._write("\n")
        elif last is not None:
            self._write(describe(last) + "\n")


class _Bar:
    """A tqdm bar of the job's percentage, its ETA and pace as the postfix."""

    def __init__(self, tqdm_class: Any, stream: TextIO) -> None:
        self._bar = tqdm_class(total=100, desc="job", file=stream, dynamic_ncols=True,
                               bar_format="{l_bar}{bar}| [{elapsed}{postfix}]")

    def update(self, p: JobProgress) -> None:
        self._bar.n = round(100 * p.progress, 1)
        self._bar.set_postfix({"eta": format_seconds(p.eta_s),
                               "steps/s": f"{p.steps_per_second:.1f}"}, refresh=False)
        self._bar.refresh()

    def close(self, last: Optional[JobProgress]) -> None:
        if last is not None:
            self.update(last)
        self._bar.close()


class _Callback:
    """progress=<callable>: called with each new JobProgress (once each: a
    loop left early, or a callback that raised, is not called again)."""

    def __init__(self, fn: Callable[[JobProgress], Any]) -> None:
        self._fn = fn
        self._given: Optional[JobProgress] = None

    def update(self, p: JobProgress) -> None:
        self._given = p
        self._fn(p)

    def close(self, last: Optional[JobProgress]) -> None:
        if last is not None and last is not self._given:
            self.update(last)


def _tqdm_for(stream: TextIO) -> Any:
    """tqdm's bar class when it is installed and `stream` shows a bar (a
    terminal, or a Jupyter kernel's output); None otherwise."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    notebook = "ipykernel" in sys.modules
    if not (tty or notebook):
        return None
    try:
        if notebook:
            from tqdm.auto import tqdm
        else:
            from tqdm import tqdm
    except ImportError:
        return None
    return tqdm


class Monitor:
    """The job's progress shown while a loop runs: polls in the background
    (at most once per `interval` seconds) and shows new values when tick()
    is called between batches, then the last ones at close()."""

    def __init__(self, progress: ProgressArg, poll: Callable[[], JobProgress],
                 stream: Optional[TextIO] = None, interval: float = 1.0) -> None:
        self._poll = poll
        self._last: Optional[JobProgress] = None
        if callable(progress):
            self._shown: Any = _Callback(progress)
        else:
            stream = stream if stream is not None else sys.stderr
            tqdm = _tqdm_for(stream)
            if tqdm is not None:
                self._shown = _Bar(tqdm, stream)
            else:
                try:
                    tty = stream.isatty()
                except (AttributeError, ValueError):
                    tty = False
                self._shown = _Lines(stream, tty)
        self._poller: Optional[_Poller] = _Poller(poll, interval)
        self._closed = False

    def tick(self) -> None:
        """Shows the newest values if there are new ones (no waiting)."""
        if self._poller is None:
            return
        p = self._poller.take()
        if p is not None:
            self._last = p
            self._shown.update(p)

    def stop(self) -> None:
        """Stops the background polls (close() does it too)."""
        if self._poller is not None:
            self._poller.stop()
            self._poller = None

    def close(self, final_poll: bool) -> None:
        """Stops polling and shows the last values: with `final_poll`, asks
        the scheduler once more (the loop ended: where the job stands now)."""
        if self._closed:
            return
        self._closed = True
        if self._poller is not None:
            self._last = self._poller.take() or self._last
        self.stop()
        if final_poll:
            try:
                self._last = self._poll()
            except PsError:
                pass
        self._shown.close(self._last)
