"""The C ABI and the session's bookkeeping over it: a lifecycle operation
never outlives its session, the job config's gradient policy holds in
Python as in C++, and a step's failure is raised even when later steps
succeed."""

from __future__ import annotations

import ctypes
import time

import numpy as np
import pytest

import ps
from ps import _native

from conftest import timeout_scale

JOB = """
name: "py-abi"
cluster {{ num_servers: 1 num_workers: {workers} num_slots: 16
          heartbeat_interval_ms: 100 heartbeat_timeout_ms: 5000 }}
consistency {{ mode: ASYNC }}
{data_plane}
tables {{ id: 0 name: "emb" sparse {{ dim: 2 }}
         optimizer {{ sgd {{ learning_rate: 1 }} }} }}
tables {{ id: 1 name: "dense" dense {{ size: 4 }}
         optimizer {{ sgd {{ learning_rate: 1 }} }} }}
"""

CLIP = "data_plane { gradients { nonfinite: CLIP clip_value: 3 } }"


def job(write_config, workers=1, data_plane=""):
    return write_config(JOB.format(workers=workers, data_plane=data_plane))


def test_freeing_a_session_mid_barrier_ends_the_barrier_first(write_config, cluster_factory):
    # Two workers, one joins: its barrier waits for the other. Freeing the
    # session meanwhile must stop the barrier and wait for it, not free the
    # session under the barrier's thread (ASan reports a use after free).
    config = job(write_config, workers=2)
    cluster = cluster_factory(config)
    s = ps.Session(config, cluster.scheduler, stop_check=0.2)
    lib = _native.lib()
    h = ctypes.c_void_p()
    assert lib.ps_session_barrier(s._ptr, b"never", 600.0, ctypes.byref(h)) == 0
    time.sleep(0.5)  # the barrier is in its wait rounds
    assert lib.ps_future_wait(h, 0.0) == _native.PENDING
    ptr, s._ptr, s._closed = s._ptr, None, True
    t = time.monotonic()
    lib.ps_session_free(ptr)
    assert time.monotonic() - t < 10 * timeout_scale()
    # The barrier ended (stopped) before the session went away.
    code = lib.ps_future_wait(h, 0.0)
    assert code == ps.Cancelled.code, (code, _native.last_error())
    lib.ps_future_free(h)


def test_clip_policy_sends_nonfinite_gradients_for_the_servers_to_clip(
        write_config, cluster_factory):
    config = job(write_config, data_plane=CLIP)
    cluster = cluster_factory(config)
    with ps.Session(config, cluster.scheduler) as s:
        emb, dense = s.table("emb"), s.table("dense")
        keys = np.array([7], dtype=np.uint64)
        before = emb.pull(keys).result()
        emb.push(keys, np.array([[np.nan, np.inf]], np.float32)).result()
        # NaN becomes 0, +Inf becomes clip_value (sgd, learning rate 1).
        np.testing.assert_array_equal(emb.pull(keys).result(), before - [[0, 3]])
        d0 = dense.pull().result()
        dense.push(np.array([-np.inf, 1, np.nan, 0], np.float32)).result()
        np.testing.assert_array_equal(dense.pull().result(), d0 - [-3, 1, 0, 0])
        # Assigned values are never clipped: still refused.
        with pytest.raises(ps.InvalidArgument, match="non-finite value"):
            dense.assign(np.array([np.nan, 0, 0, 0], np.float32))


def test_reject_policy_refuses_nonfinite_gradients_before_sending(
        write_config, cluster_factory):
    config = job(write_config)
    cluster = cluster_factory(config)
    with ps.Session(config, cluster.scheduler) as s:
        with pytest.raises(ps.InvalidArgument, match="non-finite gradient"):
            s.table("emb").push([7], np.array([[np.nan, 0]], np.float32))


class _LateFailure:
    """A step's future that is still pending when the next step ends and
    fails afterwards (as a step whose acknowledgement times out does)."""

    def __init__(self) -> None:
        self.polls = 0

    def done(self) -> bool:
        self.polls += 1
        return self.polls > 1

    def result(self, timeout=None):
        if self.polls <= 1:
            self.polls += 1
        raise ps.Timeout("step 1: no acknowledgement within 10 s")


def test_a_step_that_fails_after_the_next_one_ends_is_raised(write_config, cluster_factory):
    config = job(write_config)
    cluster = cluster_factory(config)
    with ps.Session(config, cluster.scheduler) as s:
        s.end_step()
        late = _LateFailure()
        s._last_end = late  # step 1, still pending
        s._pending_ends = [late]
        s.end_step()  # step 2: step 1 is not done yet
        with pytest.raises(ps.Timeout, match="step 1"):
            s.end_step()  # step 3: step 1 has failed meanwhile


def test_settling_raises_a_failed_step_that_was_not_the_last(write_config, cluster_factory):
    config = job(write_config)
    cluster = cluster_factory(config)
    with ps.Session(config, cluster.scheduler) as s:
        late = _LateFailure()
        s._last_end = late  # step 1, still pending
        s._pending_ends = [late]
        s.end_step()  # step 2: step 1 is not done yet
        with pytest.raises(ps.Timeout, match="step 1"):
            s.finish()
