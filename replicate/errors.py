"""The library's own exception types, and a helper that finds the user's source line."""

from __future__ import annotations

import os
import sys

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_PACKAGE_PREFIX = (_PACKAGE_DIR + os.sep,)


class ReplicateError(Exception):
    """Base class of every error raised on purpose by replicate."""


class TracerConversionError(ReplicateError, TypeError):
    """A traced (symbolic) value was used where Python needs a concrete one."""


class NumpyConversionError(TracerConversionError):
    """A NumPy function (``np.tanh``, ``np.mean``, ...) was called on a library value, or a traced
    value or Variable was converted to a NumPy array inside a traced step. NumPy functions neither
    record gradients (eager mode) nor trace (graph mode), so the result would silently be wrong:
    the message names the ``rnp`` function to use instead."""


class ShapeError(ReplicateError, ValueError):
    """Operands have shapes an op cannot accept (axes, broadcasting, reshapes, contractions,
    indices); a dtype an op cannot accept is a ``DTypeError``."""


class DTypeError(ReplicateError, TypeError):
    """Operands have dtypes an op cannot accept: a bool negated or subtracted, an integer where a
    float is needed (or integers to negative powers), operands of
    different dtypes, a non-bool condition or logical operand, non-integer index arrays, a cast to
    a dtype that is not bool, integer or float."""


class CopyError(ReplicateError, ValueError):
    """``copy=False`` where the value cannot be had without a copy (a list, another dtype): a
    ``ValueError``, as NumPy's."""


class NegativePowerError(DTypeError, ValueError):
    """An integer raised to a negative integer power, found when the exponent is known (eager
    mode, constants): a ``DTypeError``, and a ``ValueError`` as NumPy's error is (and as the
    compiled step raises when the exponent is known only at run time), so ``except ValueError``
    catches it in every mode."""


class IndexOutOfRangeError(ShapeError, IndexError):
    """An index array holds an index outside its axis: found when the indices are known (eager
    mode, constants); in a compiled step NumPy's ``IndexError`` names the op and the line."""


class CollectiveMismatchError(ReplicateError):
    """Replicas (or processes) disagree about a collective."""


class PlacementError(ReplicateError, ValueError):
    """Model parallelism: a logical device that does not exist, or a Variable on two devices."""


class ConfigMismatchError(ReplicateError):
    """The processes of a job constructed their ``Replicator`` differently (mode, backend,
    replicas per rank, outputs, options, checks, timeout, or the model's Variables)."""


class ReplicaContextError(ReplicateError, ValueError):
    """A collective runs where its replicas cannot be laid out: outside a ``Replicator`` (an
    ``rp.function`` or eager code) collectives need one replica per process."""


class MissingRuleError(ReplicateError, NotImplementedError):
    """A primitive lacks an entry in one of the rule tables."""


class InputError(ReplicateError, ValueError):
    """A batch from ``input_fn`` or an output of ``step_fn`` is not a nest of numeric arrays, or
    the batches change structure between steps."""


class NonFiniteError(ReplicateError, FloatingPointError):
    """A step produced NaN or Inf (``Replicator(check_finite=True)``)."""


class DivergenceError(ReplicateError):
    """Replicas (or ranks) would hold, or hold, different values of a variable that must be one
    value everywhere (an update from gradients that were never all-reduced)."""


class ActorError(ReplicateError):
    """An actor of an ``ActorLearner`` failed (its ``actor_fn`` raised: the message names the
    actor, its process and thread, and holds its traceback), every actor has stopped, or an
    actor's trajectories cannot be batched."""


class CheckpointError(ReplicateError):
    """A checkpoint is missing, unreadable, corrupt or does not fit the state."""


class HabitError(ReplicateError, AttributeError, TypeError):
    """Another library's habit on a library object (``loss.backward()``, ``opt.zero_grad()``,
    ``x.to(device)``): the message names the user's line and replicate's way. An
    ``AttributeError`` (``hasattr`` stays False) and a ``TypeError`` (``opt.step()``)."""


def class_name(error: BaseException) -> str:
    """``module.QualName`` of an error's class: what ranks exchange to re-raise it elsewhere."""
    return f"{type(error).__module__}.{type(error).__qualname__}"


def error_of_class(name: str, message: str) -> ReplicateError:
    """A ``ReplicateError`` of the subclass ``class_name`` gave (another rank's error re-raised
    here with its type); a plain ``ReplicateError`` naming the class when no ``ReplicateError``
    subclass of that name is loaded or it cannot be made from a message.

    >>> type(error_of_class("replicate.errors.CollectiveMismatchError", "m")).__name__
    'CollectiveMismatchError'
    >>> str(error_of_class("elsewhere.OtherError", "m"))
    'OtherError: m'
    """
    classes, todo = {}, [ReplicateError]
    while todo:
        cls = todo.pop()
        classes[f"{cls.__module__}.{cls.__qualname__}"] = cls
        todo.extend(cls.__subclasses__())
    cls = classes.get(name)
    if cls is not None:
        try:
            return cls(message)
        except Exception:  # noqa: BLE001 - a subclass with another constructor
            pass
    return ReplicateError(f"{name.rpartition('.')[2]}: {message}")


def user_frame(skip_library: bool = True, skip_numpy: bool = False):
    """Return (filename, lineno) of the innermost frame outside this package (and, with
    ``skip_numpy``, outside NumPy: where NumPy called back into the library)."""
    frame = sys._getframe(1)
    skip = _PACKAGE_PREFIX if skip_library else ()
    numpy = sys.modules.get("numpy") if skip_numpy else None
    if numpy is not None:
        skip += (os.path.join(os.path.dirname(os.path.abspath(numpy.__file__)), ""),)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(skip) and "importlib" not in path:
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


def add_note(error: BaseException, text: str) -> None:
    """Add a line to an exception's report, keeping its type and message (``add_note`` where
    Python has it: the traceback prints it under the message)."""
    if hasattr(error, "add_note"):
        error.add_note(text)
    elif error.args and isinstance(error.args[0], str):
        error.args = (f"{error.args[0]}\n{text}",) + error.args[1:]
    else:
        error.args = error.args + (text,)


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
    """``tb`` without the frames inside this package, nor those of ``runpy`` (through which
    ``python -m replicate`` runs a script): the user's frames tell where; ours are noise.
    ``REPLICATE_DEBUG=traceback`` keeps every frame."""
    import types

    if "traceback" in os.environ.get("REPLICATE_DEBUG", ""):
        return tb
    frames = []
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        path = os.path.abspath(name)
        if not (path.startswith(_PACKAGE_DIR + os.sep) or name.endswith("runpy.py")
                or name == "<frozen runpy>"):
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
