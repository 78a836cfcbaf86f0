"""Typed exceptions carrying the servers' and the scheduler's messages.

Every error from the native library arrives as a PsError subclass chosen by
its status code and the reason the library gives with it (Dropped,
SchedulerUnreachable, JobFinished, JobFailed: told apart as data, never by the
message's words).
The message is the C++ side's text, which names the table, key or element
at fault ("non-finite gradient at element 3 ...") and, for waits under
BSP/SSP, the ranks waited for. Each subclass also derives from
the closest built-in exception, so `except ValueError` or `except
TimeoutError` catches what one would expect.
"""

from __future__ import annotations

from . import _native


class PsError(Exception):
    """Base class. `code` is the Abseil status code (int), `message` the text."""

    code = 2  # UNKNOWN

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class Cancelled(PsError):
    code = 1


class InvalidArgument(PsError, ValueError):
    code = 3


class Timeout(PsError, TimeoutError):
    code = 4


class NotFound(PsError, LookupError):
    code = 5


class AlreadyExists(PsError):
    code = 6


class PermissionDenied(PsError, PermissionError):
    code = 7


class ResourceExhausted(PsError, MemoryError):
    code = 8


class FailedPrecondition(PsError, RuntimeError):
    code = 9


class Aborted(PsError):
    code = 10


class OutOfRange(PsError, IndexError):
    code = 11


class Unimplemented(PsError, NotImplementedError):
    code = 12


class Internal(PsError, RuntimeError):
    code = 13


class Unavailable(PsError, ConnectionError):
    code = 14


class DataLoss(PsError):
    code = 15


class Unauthenticated(PsError, PermissionError):
    code = 16


class ForkError(FailedPrecondition):
    """A session was used in a process forked after it started."""


class Dropped(Aborted):
    """The scheduler dropped this worker (declared it dead after a pause or a
    network partition): every wait and request of the session ends with it,
    and nothing it sends counts any more. Stop training and close(); to keep
    helping, start a new session (it joins as a new worker and takes over
    the remaining work)."""


class JobFinished(FailedPrecondition):
    """The job has finished (every worker finished training): a session
    started now has nothing to join. The message names the job."""


class JobFailed(FailedPrecondition):
    """The job cannot continue (the scheduler made it FAILED, e.g. slots lost
    every copy with no checkpoint to restore them): every wait and request
    of the session ends with it at once; the message gives the scheduler's
    reason. Stop and close(); trainer processes exit 5 for it."""


class SchedulerUnreachable(Unavailable):
    """The scheduler stayed unreachable for longer than
    cluster.scheduler_unreachable_timeout_ms; the message names its address
    and how long. The session can do nothing more."""


_BY_CODE = {c.code: c for c in (
    Cancelled, InvalidArgument, Timeout, NotFound, AlreadyExists, PermissionDenied,
    ResourceExhausted, FailedPrecondition, Aborted, OutOfRange, Unimplemented,
    Internal, Unavailable, DataLoss, Unauthenticated)}

# The library's reasons (ps_c.h PS_REASON_*), carried beside the status code.
_BY_REASON = {_native.REASON_DROPPED: Dropped,
              _native.REASON_SCHEDULER_UNREACHABLE: SchedulerUnreachable,
              _native.REASON_JOB_FINISHED: JobFinished,
              _native.REASON_JOB_FAILED: JobFailed}


def from_code(code: int, message: str, reason: int = _native.REASON_NONE) -> PsError:
    """The exception for Abseil status `code` with `message`; `reason` (a
    PS_REASON_* of the library) picks Dropped, SchedulerUnreachable,
    JobFinished or JobFailed."""
    cls = _BY_REASON.get(reason) or _BY_CODE.get(code, PsError)
    return cls(message or f"status code {code}", code)


def last_failure(code: int) -> PsError:
    """The exception for `code`, the status of this thread's last call into
    the library (its message and reason as the library recorded them)."""
    return from_code(code, _native.last_error(), _native.last_error_reason())
