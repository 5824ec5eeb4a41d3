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

import numbers

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
    d = np.dtype(dtype)
    return d.kind == "f" or d == bfloat16


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
    d = np.dtype(dtype)
    return np.dtype(np.float32) if d in LOW_PRECISION else d


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


def _weak(k) -> bool:
    return isinstance(k, (bool, numbers.Number)) and not isinstance(k, np.generic) \
        and not isinstance(k, np.dtype)


__all__ = ["LOW_PRECISION", "as_dtype", "bfloat16", "compute_dtype", "finfo", "float16",
           "is_float", "is_low_precision", "is_supported", "result_type"]
