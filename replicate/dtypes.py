"""The dtypes a ``replicate`` array may have, and how they combine.

bool, the integers, ``float16``, ``bfloat16`` (``ml_dtypes.bfloat16``, the type JAX and XLA
use), ``float32`` and ``float64``. NumPy has bfloat16 only through ``ml_dtypes``, which it treats
as an opaque two-byte type (``np.issubdtype(bf16, np.floating)`` is False, ``np.result_type``
rejects ``bf16 + f16``): ask this module instead.

Promotion follows NumPy for NumPy's types, and JAX for bfloat16: ``bf16`` with a Python float or
any integer stays ``bf16``; ``bf16`` with ``f16`` is ``f32``; ``bf16`` with ``f32``/``f64`` is the
wider type.

>>> import numpy as np
>>> result_type(bfloat16, 2.0), result_type(bfloat16, np.float16), result_type(np.float16, 1)
(dtype(bfloat16), dtype('float32'), dtype('float16'))
>>> is_float(bfloat16), is_low_precision(np.float32), finfo(bfloat16).eps
(True, False, 0.0078125)
"""

from __future__ import annotations

import contextlib
import numbers
import threading

import ml_dtypes
import numpy as np

bfloat16 = np.dtype(ml_dtypes.bfloat16)
float16 = np.dtype(np.float16)
LOW_PRECISION = (float16, bfloat16)  # computed in float32 where NumPy has no kernels
NAMES = "bool, integers, float16, bfloat16, float32 and float64"


def as_dtype(dtype) -> np.dtype:
    """``np.dtype`` that also knows ``"bfloat16"`` and ``ml_dtypes.bfloat16``."""
    if isinstance(dtype, str) and dtype in ("bfloat16", "bf16"):
        return bfloat16
    return np.dtype(dtype)


def is_float(dtype) -> bool:
    """Whether ``dtype`` is a floating-point type (bfloat16 included)."""
    try:
        return _IS_FLOAT[dtype]  # (a dtype object: asked for every value of an eager step)
    except (KeyError, TypeError):
        d = np.dtype(dtype)
        answer = d.kind == "f" or d == bfloat16
        if isinstance(dtype, np.dtype):
            _IS_FLOAT[dtype] = answer
        return answer


_IS_FLOAT: dict = {}


def is_low_precision(dtype) -> bool:
    """float16 or bfloat16."""
    return np.dtype(dtype) in LOW_PRECISION


def is_supported(dtype) -> bool:
    """bool, an integer or a float (bfloat16 included): what arrays and batches may hold."""
    d = np.dtype(dtype)
    return d.kind in "biuf" or d == bfloat16


def finfo(dtype):
    """``np.finfo`` for every float dtype (bfloat16 included)."""
    return ml_dtypes.finfo(np.dtype(dtype))


def compute_dtype(dtype) -> np.dtype:
    """What NumPy computes a value of ``dtype`` in: float32 for float16/bfloat16."""
    if not isinstance(dtype, np.dtype):
        dtype = np.dtype(dtype)
    return _F32 if dtype in LOW_PRECISION else dtype


_F32 = np.dtype(np.float32)


def result_type(*keys) -> np.dtype:
    """The common dtype of dtypes and weak Python scalars (NEP 50), bfloat16 included."""
    if not any(not _weak(k) and np.dtype(k) == bfloat16 for k in keys):
        return np.result_type(*keys)
    strong = [np.dtype(k) for k in keys if not _weak(k)]
    floats = [d for d in strong if d.kind == "f"]
    if not floats:  # bf16 with bools, integers and Python scalars: bf16
        return bfloat16
    widest = max(floats, key=lambda d: d.itemsize)
    return np.dtype(np.float32) if widest.itemsize < 4 else widest  # bf16 + f16 -> f32


class _Autocast(threading.local):
    dtype = None  # (off on a thread that never set it; a class attribute: see state._Hooks)


_amp = _Autocast()


def autocast_dtype():
    """The dtype ``autocast`` casts matrix-product inputs to here (None: off)."""
    return getattr(_amp, "dtype", None)


class autocast(contextlib.ContextDecorator):
    """Mixed precision for the code inside (``torch.autocast``'s contract), traced and eager.

    Inside, the float32 (and float16/bfloat16) inputs of ``matmul``, ``dot``, ``einsum`` and
    ``conv2d`` (so every ``Linear`` and ``Conv2d``) are cast to ``dtype`` (``"bfloat16"`` or
    ``"float16"``) — float64 ones are not, as PyTorch's autocast leaves doubles — and their
    products are of that dtype (a layer that adds a float32 bias to one returns float32: the
    sum promotes, where PyTorch's ``Linear`` casts the bias and returns bfloat16); sums, means,
    variances, ``logsumexp``, softmax/log-softmax, normalisation statistics and the losses of
    ``rp.nn`` take float16/bfloat16 operands in float32. Parameters keep their own dtype: the
    casts are ops, so gradients reach float32 parameters in float32. ``autocast(None)`` turns
    it off for a region inside. Thread-local; inside ``step_fn`` a traced step keeps what was
    on while it was traced, and a compiled call made inside or outside ``autocast`` is traced
    for that setting (either order).

    >>> import numpy as np, replicate as rp, replicate.numpy as rnp
    >>> with rp.autocast("bfloat16"):
    ...     y = rnp.ones((2, 3), np.float32) @ rnp.ones((3, 1), np.float32)
    ...     s = rnp.sum(y)
    >>> y.dtype, s.dtype
    (dtype(bfloat16), dtype('float32'))
    """

    def __init__(self, dtype):
        if dtype is not None:
            dtype = as_dtype(dtype)
            if not is_float(dtype):
                raise TypeError(f"autocast: {dtype} is not a float dtype")
        self.dtype = dtype
        self._previous = []

    def __enter__(self):
        self._previous.append(autocast_dtype())
        _amp.dtype = self.dtype
        return self

    def __exit__(self, *exc):
        _amp.dtype = self._previous.pop()
        return False


def _weak(k) -> bool:
    return isinstance(k, (bool, numbers.Number)) and not isinstance(k, np.generic) \
        and not isinstance(k, np.dtype)


__all__ = ["LOW_PRECISION", "as_dtype", "autocast", "autocast_dtype", "bfloat16", "compute_dtype",
           "finfo", "float16", "is_float", "is_low_precision", "is_supported", "result_type"]
