"""The library's own exception types, and a helper that finds the user's source line."""

from __future__ import annotations

import os
import sys

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


class ReplicateError(Exception):
    """Base class of every error raised on purpose by replicate."""


class TracerConversionError(ReplicateError, TypeError):
    """A traced (symbolic) value was used where Python needs a concrete one."""


class ShapeError(ReplicateError, ValueError):
    """Operands have shapes or dtypes an op cannot accept."""


class CollectiveMismatchError(ReplicateError):
    """Replicas (or processes) disagree about a collective."""


class MissingRuleError(ReplicateError, NotImplementedError):
    """A primitive lacks an entry in one of the rule tables."""


class InputError(ReplicateError, ValueError):
    """A batch from ``input_fn`` or an output of ``step_fn`` is not a nest of numeric arrays, or
    the batches change structure between steps."""


class NonFiniteError(ReplicateError, FloatingPointError):
    """A step produced NaN or Inf (``Replicator(check_finite=True)``)."""


class CheckpointError(ReplicateError):
    """A checkpoint is missing, unreadable, corrupt or does not fit the state."""


def user_frame(skip_library: bool = True):
    """Return (filename, lineno, source) of the innermost frame outside this package."""
    frame = sys._getframe(1)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        inside = path.startswith(_PACKAGE_DIR + os.sep)
        if not (skip_library and inside) and "importlib" not in path:
            return path, frame.f_lineno
        frame = frame.f_back
    return "<unknown>", 0


def source_line(location) -> str:
    """Render a (filename, lineno) location as 'file:line: code'."""
    import linecache

    path, lineno = location
    code = linecache.getline(path, lineno).strip()
    short = os.path.relpath(path) if not path.startswith("<") else path
    return f"{short}:{lineno}" + (f": {code}" if code else "")


def function_location(fn) -> str:
    """Where a user function is defined, as 'name (file:line)'."""
    fn = getattr(fn, "__wrapped__", fn)
    code = getattr(fn, "__code__", None)
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    if code is None:
        return name
    return f"{name} ({source_line((code.co_filename, code.co_firstlineno))})"


def innermost_user_line(tb) -> str | None:
    """The innermost frame of a traceback outside this package, as 'file:line: code'."""
    found = None
    while tb is not None:
        path = os.path.abspath(tb.tb_frame.f_code.co_filename)
        if not path.startswith(_PACKAGE_DIR + os.sep):
            found = (path, tb.tb_lineno)
        tb = tb.tb_next
    return source_line(found) if found else None


def user_traceback(tb):
    """``tb`` without the frames inside this package (the user's frames tell where; ours are
    noise). ``REPLICATE_DEBUG=traceback`` keeps every frame."""
    import types

    if "traceback" in os.environ.get("REPLICATE_DEBUG", ""):
        return tb
    frames = []
    while tb is not None:
        path = os.path.abspath(tb.tb_frame.f_code.co_filename)
        if not path.startswith(_PACKAGE_DIR + os.sep):
            frames.append(tb)
        tb = tb.tb_next
    out = None
    for t in reversed(frames):
        out = types.TracebackType(out, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return out


def at_user_line(error: ReplicateError) -> ReplicateError:
    """Make sure the message of ``error`` names the user's source line (the innermost frame of
    its traceback outside this package) and drop the library's frames from its traceback."""
    where = innermost_user_line(error.__traceback__)
    message = str(error)
    if where and where.split(":")[0] + ":" not in message and error.args:
        error.args = (f"{message}\n  at {where}",) + error.args[1:]
    return error.with_traceback(user_traceback(error.__traceback__))
