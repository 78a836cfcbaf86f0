"""The C ABI and the session's bookkeeping over it: a lifecycle operation
never outlives its session, the job config's gradient policy holds in
Python as in C++, a step's failure is raised even when later steps
succeed, and _native.py declares every function, struct and constant as
ps_c.h does."""

from __future__ import annotations

import ctypes
import pathlib
import re
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
    assert lib.ps_session_barrier(s._ptr, b"never", _native.NO_TIMEOUT, ctypes.byref(h)) == 0
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


# ---- the ctypes declarations against ps_c.h

HEADER = pathlib.Path(__file__).resolve().parent.parent / "native" / "ps_c.h"

_SCALARS = {"int32_t": ctypes.c_int32, "uint32_t": ctypes.c_uint32,
            "int64_t": ctypes.c_int64, "uint64_t": ctypes.c_uint64,
            "size_t": ctypes.c_size_t, "double": ctypes.c_double, "float": ctypes.c_float}
_HANDLES = {"ps_config", "ps_session", "ps_future", "ps_allreduce"}


def _header() -> str:
    text = HEADER.read_text()
    return re.sub(r"/\*.*?\*/", " ", text, flags=re.S)


def _structs() -> dict:
    """struct name -> its ctypes Structure in _native, by the typedef name."""
    return {"ps_position": _native.Position, "ps_job_info": _native.JobInfo,
            "ps_synthetic_info": _native.SyntheticInfo, "ps_table_info": _native.TableInfo,
            "ps_session_details": _native.SessionDetails, "ps_claim": _native.Claim,
            "ps_next_shard": _native.NextShard,
            "ps_table_stats": _native.TableStats, "ps_job_progress": _native.JobProgress,
            "ps_ring_info": _native.RingInfo}


def _allowed(decl: str) -> set:
    """The ctypes types that may stand for C type `decl` (e.g. 'const char*')."""
    t = decl.replace("const ", "").strip()
    stars = t.count("*")
    base = t.replace("*", "").strip()
    if stars == 0:
        if base == "void":
            return {None}
        if base in _SCALARS:
            return {_SCALARS[base]}
        return {_structs()[base]}
    if stars == 2:
        return {ctypes.POINTER(ctypes.c_void_p)}
    if base in _HANDLES:
        return {ctypes.c_void_p}
    if base == "char":
        # const char*: a string in; char*: a malloc'ed string out, freed by
        # the caller with ps_free_string (so it must stay a pointer).
        return {ctypes.c_char_p} if "const" in decl else {ctypes.c_void_p}
    if base in _SCALARS:
        return {ctypes.POINTER(_SCALARS[base]), ctypes.c_void_p}
    return {ctypes.POINTER(_structs()[base])}


def _declarations() -> dict:
    """name -> (result type, [argument types]) as the header declares them."""
    out = {}
    pattern = re.compile(r"([A-Za-z_][\w ]*?\**)\s*\b(ps_\w+)\s*\(([^)]*)\)\s*;")
    for ret, name, args in pattern.findall(_header()):
        params = [] if args.strip() in ("", "void") else [a.strip() for a in args.split(",")]
        types = [re.sub(r"\s*\b\w+$", "", p).replace(" *", "*").strip() for p in params]
        out[name] = (ret.strip().replace(" *", "*"), types)
    return out


def test_every_function_of_the_header_is_declared_as_the_header_says():
    declared = _declarations()
    assert len(declared) > 40, sorted(declared)
    assert set(declared) == set(_native.SIGNATURES), (
        set(declared) ^ set(_native.SIGNATURES))
    for name, (ret, args) in declared.items():
        py_ret, py_args = _native.SIGNATURES[name]
        assert py_ret in _allowed(ret), (name, ret, py_ret)
        assert len(py_args) == len(args), (name, args, py_args)
        for i, (c, py) in enumerate(zip(args, py_args)):
            assert py in _allowed(c), (name, i, c, py)


def test_every_struct_of_the_header_matches_its_ctypes_structure():
    body = _header()
    found = re.findall(r"typedef struct (\w+) \{(.*?)\} (\w+);", body, flags=re.S)
    assert {name for name, _, _ in found} == set(_structs()), found
    for name, fields, _ in found:
        want = []
        for line in fields.split(";"):
            line = line.strip()
            if not line:
                continue
            ctype, field = line.rsplit(" ", 1)
            want.append((field.lstrip("*"), ctype + "*" * field.count("*")))
        got = _structs()[name]._fields_
        assert [f for f, _ in got] == [f for f, _ in want], name
        for (field, py), (_, c) in zip(got, want):
            assert py in _allowed(c), (name, field, c, py)


def test_the_constants_match_the_header():
    defines = dict(re.findall(r"#define (PS_\w+) \(?(-?[\d.]+)\)?", _header()))
    assert float(defines.pop("PS_C_ABI_VERSION")) == _native.ABI_VERSION
    for name, value in defines.items():
        assert float(getattr(_native, name[3:])) == float(value), name


def test_each_reason_picks_its_exception_whatever_the_words():
    from ps import errors
    for reason, cls, code in ((_native.REASON_DROPPED, ps.Dropped, 10),
                              (_native.REASON_SCHEDULER_UNREACHABLE, ps.SchedulerUnreachable, 14),
                              (_native.REASON_JOB_FINISHED, ps.JobFinished, 9),
                              (_native.REASON_JOB_FAILED, ps.JobFailed, 9)):
        e = errors.from_code(code, "any words", reason)
        assert type(e) is cls and e.code == code and e.message == "any words"
    # The words alone pick only the code's class.
    e = errors.from_code(9, "the job has finished", _native.REASON_NONE)
    assert type(e) is ps.FailedPrecondition


def test_the_job_config_is_read_by_the_library_as_every_process_reads_it(write_config):
    # A commented-out field, and text a pattern would take for the block's
    # end: only a real textproto parser reads this as the C++ processes do.
    config = write_config(JOB.format(workers=3, data_plane=CLIP) + """
        data { synthetic_ctr {
            # num_train: 5   (was too small)
            num_train: 300 num_test: 50 num_numeric: 2 num_categorical: 3 } }
        training { batch_size: 16 epochs: 2 export_path: "x{y}" }
    """)
    data = ps.data.SyntheticCtr(config)
    assert (data.num_train, data.num_test, data.num_numeric, data.num_categorical) == (
        300, 50, 2, 3)
    batch = data.fill(1, 10, 5)
    assert batch.numeric.shape == (5, 2) and batch.keys.shape == (5, 3)
    job = ps.data.describe_config(config, num_workers=4)
    assert job["num_workers"] == 4 and job["mode"] == "ASYNC" and job["clips_nonfinite"]
    assert job["training"] == {"batch_size": 16, "epochs": 2, "shard_by_batch": False,
                               "max_steps": 0, "export_path": "x{y}"}
    assert [(t["name"], t["sparse"], t["dim"], t["size"], t["optimizer"])
            for t in job["tables"]] == [("emb", True, 2, 0, "sgd"),
                                        ("dense", False, 1, 4, "sgd")]
    assert job["tables"][0]["optimizer_config"]["sgd"]["learning_rate"] == 1
    with pytest.raises(ps.InvalidArgument):
        ps.data.describe_config(write_config("cluster { num_servers: 0 }", "bad.pbtxt"))
