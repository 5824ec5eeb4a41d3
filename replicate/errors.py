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
