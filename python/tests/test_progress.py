"""The job's progress and curves from Python: Session.job_progress() answers
the scheduler's job-level progress (in [0, 1], never going back, 1 once
every shard is done), report_metric() refuses bad names and values with the
package's errors, end_step(examples=, loss=) feeds the loss and examples/s
curves, and batches(progress=...) shows the job's progress (a plain line
every 10 s to a log, '\\r' in place on a terminal, tqdm when installed, or
a callable) without ever letting a failed poll stop training."""

from __future__ import annotations

import io
import math
import re
import sys
import textwrap
import time
import types
from typing import List

import numpy as np
import pytest

import ps
import ps.progress
from ps import _native

from conftest import timeout_scale

JOB = """
name: "py-progress"
cluster {{ num_servers: 1 num_workers: 1 num_slots: 16
          heartbeat_interval_ms: 100 heartbeat_timeout_ms: 5000 }}
consistency {{ mode: ASYNC }}
tables {{ id: 0 name: "dense" dense {{ size: 4 }}
         optimizer {{ sgd {{ learning_rate: 0.1 }} }} }}
training {{ batch_size: 8 epochs: {epochs} }}
"""

BATCHES = 30  # per epoch of the one shard


def job(write_config, epochs: int = 2) -> str:
    return write_config(JOB.format(epochs=epochs))


@pytest.fixture
def cluster_and_config(write_config, cluster_factory):
    config = job(write_config)
    return cluster_factory(config), config


@pytest.fixture
def session(cluster_and_config):
    cluster, config = cluster_and_config
    s = ps.Session(config, cluster.scheduler)
    yield s
    s.close()


def batches_of(shard: int, epoch: int) -> List[int]:
    """A Sized batch source: its length is the shard's size."""
    return list(range(BATCHES))


def wait_for(predicate, what: str, timeout: float = 10.0):
    """Polls job_progress-like `predicate` until it answers a true value."""
    deadline = time.monotonic() + timeout * timeout_scale()
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"{what}: still {last!r} after {timeout} s")


# ---- report_metric and end_step(examples=, loss=)

def test_report_metric_refuses_bad_names_and_values(session):
    session.report_metric("val/auc-1.0_x", 0.5)
    session.report_metric("val/auc-1.0_x", np.float32(0.75))  # a newer value of the same name
    session.report_metric("n" * 64, 1)
    bad_names = ["", "n" * 65, "has space", "caf\u00e9", "a\0b", "semi;colon", "quote\""]
    for name in bad_names:
        with pytest.raises(ps.InvalidArgument) as e:
            session.report_metric(name, 1.0)
        assert isinstance(e.value, ValueError)
    with pytest.raises(ps.InvalidArgument, match="name must be a str"):
        session.report_metric(b"bytes", 1.0)  # type: ignore[arg-type]
    for value in (math.nan, math.inf, -math.inf):
        with pytest.raises(ps.InvalidArgument, match="not finite"):
            session.report_metric("loss", value)
    with pytest.raises(ps.InvalidArgument, match="not a number"):
        session.report_metric("loss", "high")  # type: ignore[arg-type]
    # 32 distinct names per worker (two are taken above), then RESOURCE_EXHAUSTED;
    # a known name still takes new values.
    for i in range(30):
        session.report_metric(f"m{i}", i)
    with pytest.raises(ps.ResourceExhausted, match="32"):
        session.report_metric("one_too_many", 1.0)
    session.report_metric("m3", 3.5)


def test_end_step_takes_examples_and_loss(session):
    dense = session.table("dense")
    dense.push(np.ones(4)).result()
    session.end_step(examples=8, loss=0.69).result()
    session.end_step(examples=np.int64(8), loss=np.float32(0.5)).result()
    session.end_step(loss=0.4).result()                  # weighs as one example
    session.end_step(examples=8).result()                # no loss
    session.end_step(examples=8, loss=math.nan).result()  # left out of the loss curve
    session.end_step().result()                          # as before: nothing reported
    assert session.clock == 6
    # Refused before the step ends: the clock stays.
    with pytest.raises(ps.InvalidArgument, match="negative"):
        session.end_step(examples=-1)
    with pytest.raises(ps.InvalidArgument, match="int"):
        session.end_step(examples=1.5)  # type: ignore[arg-type]
    with pytest.raises(ps.InvalidArgument, match="loss must be a number"):
        session.end_step(examples=1, loss="low")  # type: ignore[arg-type]
    assert session.clock == 6
    # The examples reach the scheduler with the heartbeats (5 steps of 8).
    wait_for(lambda: session.job_progress().examples == 32, "examples reported")


def test_an_observer_reads_progress_but_reports_nothing(cluster_and_config, session):
    cluster, config = cluster_and_config
    with ps.observe(config, cluster.scheduler) as o:
        p = o.job_progress()
        assert 0.0 <= p.progress <= 1.0
        with pytest.raises(ps.FailedPrecondition, match="observer"):
            o.report_metric("val_auc", 0.5)
        with pytest.raises(ps.FailedPrecondition, match="observer"):
            o.end_step(examples=1, loss=0.5)


def test_batches_refuses_a_bad_batches_per_epoch(session):
    with pytest.raises(ps.InvalidArgument, match="negative"):
        session.batches(batches_of, batches_per_epoch=-1)
    with pytest.raises(ps.InvalidArgument, match="int"):
        session.batches(batches_of, batches_per_epoch=2.5)  # type: ignore[arg-type]


# ---- job_progress and batches(progress=...)

def test_job_progress_stays_in_range_never_goes_back_and_ends_at_one(session):
    polls: List[ps.JobProgress] = []
    steps = 0
    for _ in session.batches(batches_of, epochs=2):
        session.end_step(examples=8, loss=0.5)
        steps += 1
        time.sleep(0.02)
        if steps % 10 == 1:
            polls.append(session.job_progress())
    assert steps == 2 * BATCHES
    final = wait_for(lambda: (lambda p: p if p.progress >= 0.999 else None)(
        session.job_progress()), "progress after every shard is done")
    polls.append(final)
    for p in polls:
        assert 0.0 <= p.progress <= 1.0, p
        assert p.eta_s is None or p.eta_s >= 0, p
        assert p.steps_per_second >= 0 and p.examples_per_second >= 0 and p.elapsed_s >= 0
    values = [p.progress for p in polls]
    assert values == sorted(values), values
    # The shard's size came from len(batches_of(...)): the total is known.
    assert final.total_known, final
    assert final.steps_total == 2 * BATCHES, final
    assert final.steps_done == final.steps_total, final


def test_batches_shows_the_jobs_progress_to_a_callable(session):
    seen: List[ps.JobProgress] = []
    for _ in session.batches(batches_of, epochs=2, progress=seen.append):
        time.sleep(0.03)  # ~2 s: a poll a second
        session.end_step(examples=8)
    assert len(seen) >= 2, seen
    assert all(isinstance(p, ps.JobProgress) for p in seen)
    values = [p.progress for p in seen]
    assert values == sorted(values), values
    # The last call is made when the loop ends, with the job's final state.
    assert seen[-1].progress >= 0.999, seen[-1]


PROGRESS_SCRIPT = textwrap.dedent("""
    import sys, time
    import ps
    s = ps.Session(sys.argv[1], sys.argv[2])
    n = 0
    for b in s.batches(lambda shard, epoch: list(range(30)), epochs=2, progress=True):
        time.sleep(0.05)
        s.end_step(examples=8, loss=0.5)
        n += 1
    print("trained", n, flush=True)
    s.close()
""")

_LINE = re.compile(r"^progress (\d+\.\d)% eta (\S+) (\d+\.\d) steps/s$")


def test_batches_progress_prints_lines_to_a_log_ending_at_100(
        cluster_and_config, tmp_path):
    cluster, config = cluster_and_config
    script = tmp_path / "progress.py"
    script.write_text(PROGRESS_SCRIPT)
    p = cluster.python_worker("w0", str(script), [config, cluster.scheduler])
    assert p.wait(timeout=60 * timeout_scale()) == 0, cluster.log("w0")
    assert "trained 60" in cluster.output("w0")
    log = cluster.log("w0")  # stderr, a file: not a terminal
    assert "\r" not in log, log
    lines = [m.groups() for m in map(_LINE.match, log.splitlines()) if m]
    # The first values (at most one line every 10 s) and the last one.
    assert 1 <= len(lines) <= 3, log
    percents = [float(pct) for pct, _, _ in lines]
    assert percents == sorted(percents), log
    assert percents[-1] >= 99.9, log


EXIT_SCRIPT = textwrap.dedent("""
    import sys, time
    import ps
    s = ps.Session(sys.argv[1], sys.argv[2])
    loop = s.batches(lambda shard, epoch: list(range(30)), progress=True)
    next(loop)
    s.end_step()
    time.sleep(1.5)  # polls go on in the background
    print("exiting", flush=True)
    # No close(), the loop suspended: the polls stop at exit, then the session closes.
""")


def test_a_script_that_exits_inside_the_loop_exits_promptly(cluster_and_config, tmp_path):
    cluster, config = cluster_and_config
    script = tmp_path / "exit.py"
    script.write_text(EXIT_SCRIPT)
    p = cluster.python_worker("w0", str(script), [config, cluster.scheduler])
    assert p.wait(timeout=30 * timeout_scale()) == 0, cluster.log("w0")
    assert "exiting" in cluster.output("w0")


# ---- the display itself (no scheduler needed)

def progress_at(value: float, eta=None) -> ps.JobProgress:
    return ps.JobProgress(progress=value, eta_s=eta, steps_done=int(100 * value),
                          steps_total=100, total_known=True, steps_per_second=12.5,
                          examples_per_second=100.0, examples=0, elapsed_s=1.0)


class FakeStream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


class Polls:
    """A poll that answers rising values and fails every other time."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> ps.JobProgress:
        self.calls += 1
        if self.calls % 2 == 0:
            raise ps.Unavailable("the scheduler is away")
        return progress_at(min(1.0, self.calls / 10))


def run_monitor(stream, progress=True, ticks: int = 8, tick_s: float = 0.06) -> Polls:
    polls = Polls()
    m = ps.progress.Monitor(progress, polls, stream=stream, interval=0.02)
    try:
        for _ in range(ticks):
            time.sleep(tick_s)
            m.tick()  # a failed poll is skipped: no exception here
    finally:
        m.close(final_poll=True)
    return polls


def test_the_line_format():
    assert ps.progress.describe(progress_at(0.42, 31)) == "progress 42.0% eta 31s 12.5 steps/s"
    assert ps.progress.describe(progress_at(0, None)) == "progress 0.0% eta ? 12.5 steps/s"
    assert ps.progress.format_seconds(302) == "5m02s"
    assert ps.progress.format_seconds(3 * 3600 + 5 * 60) == "3h05m"


def test_a_log_gets_a_line_at_most_every_10_s_and_a_last_one():
    stream = FakeStream(tty=False)
    polls = run_monitor(stream)
    assert polls.calls >= 4  # failures included: polling went on
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2, lines  # the first values, then the final poll's
    assert all(_LINE.match(line) for line in lines), lines
    assert "\r" not in stream.getvalue()


def test_a_terminal_gets_one_line_rewritten_in_place():
    stream = FakeStream(tty=True)
    run_monitor(stream)
    text = stream.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n"), repr(text)
    shown = [part.strip() for part in text.split("\r") if part.strip()]
    assert len(shown) >= 2 and all(_LINE.match(s) for s in shown), shown


def test_a_failed_final_poll_keeps_the_last_values():
    calls = []

    def poll() -> ps.JobProgress:
        calls.append(1)
        if len(calls) > 1:
            raise ps.Timeout("no answer")
        return progress_at(0.5)

    stream = FakeStream(tty=False)
    m = ps.progress.Monitor(True, poll, stream=stream, interval=0.01)
    deadline = time.monotonic() + 5
    while not stream.getvalue() and time.monotonic() < deadline:
        time.sleep(0.02)
        m.tick()
    m.close(final_poll=True)
    assert stream.getvalue().splitlines() == ["progress 50.0% eta ? 12.5 steps/s"] * 2


def test_a_callable_gets_each_value_once():
    seen: List[ps.JobProgress] = []
    polls = Polls()
    m = ps.progress.Monitor(seen.append, polls, interval=0.01)
    deadline = time.monotonic() + 5
    while not seen and time.monotonic() < deadline:
        time.sleep(0.02)
        m.tick()
    m.close(final_poll=False)  # a loop left early: nothing new to give
    assert len(seen) == 1
    m = ps.progress.Monitor(seen.append, lambda: progress_at(1.0), interval=10)
    m.close(final_poll=True)  # a loop that ended: the job's final state
    assert [p.progress for p in seen[1:]] == [1.0]


def test_tqdm_draws_a_bar_of_100_with_eta_and_pace(monkeypatch):
    bars = []

    class FakeTqdm:
        def __init__(self, **kwargs) -> None:
            self.kwargs, self.n, self.postfix, self.refreshed, self.closed = kwargs, 0, {}, 0, False
            bars.append(self)

        def set_postfix(self, postfix, refresh=True) -> None:
            self.postfix = dict(postfix)

        def refresh(self) -> None:
            self.refreshed += 1

        def close(self) -> None:
            self.closed = True

    fake = types.ModuleType("tqdm")
    fake.tqdm = FakeTqdm  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tqdm", fake)
    run_monitor(FakeStream(tty=True))
    assert len(bars) == 1
    bar = bars[0]
    assert bar.kwargs["total"] == 100 and bar.closed and bar.refreshed >= 2
    assert 0 < bar.n <= 100
    assert set(bar.postfix) == {"eta", "steps/s"} and bar.postfix["steps/s"] == "12.5"
    # Not a terminal: plain lines even with tqdm installed (a log file).
    stream = FakeStream(tty=False)
    run_monitor(stream)
    assert len(bars) == 1 and stream.getvalue().startswith("progress ")


def test_the_abi_struct_has_every_field_of_job_progress():
    fields = {f for f, _ in _native.JobProgress._fields_} - {"has_eta"}
    assert fields == {f.name for f in ps.JobProgress.__dataclass_fields__.values()}
