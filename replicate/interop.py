"""Other libraries' arrays (JAX, PyTorch, CuPy, anything with ``__dlpack__`` or ``__array__``)
as NumPy arrays: what ``rnp.asarray``, ``rnp.from_dlpack``, ``rp.function`` and a ``Replicator``'s
batches accept.

>>> import numpy as np
>>> from_foreign(memoryview(b"ab")).tolist()
[97, 98]
"""

from __future__ import annotations

import sys

import numpy as np

from .errors import ReplicateError

DEVICE_KINDS = ("cupy", "jax")  # the device arrays that ``rp.function`` returns when given them


def is_foreign(x) -> bool:
    """An array of another library (not NumPy's, not a number)."""
    return not isinstance(x, (np.ndarray, np.generic)) \
        and not type(x).__module__.startswith("replicate") \
        and (hasattr(x, "__dlpack__") or hasattr(x, "__array__"))


def from_foreign(x) -> np.ndarray:
    """Another library's array as a NumPy array: through DLPack (zero-copy) where it lives in
    host memory, else ``__array__`` (a copy; CuPy's ``.get()``)."""
    name = type(x).__module__.split(".")[0] + "." + type(x).__name__
    try:
        if hasattr(x, "__dlpack__"):
            device = x.__dlpack_device__()[0] if hasattr(x, "__dlpack_device__") else 1
            if device in (1, 3):  # kDLCPU, kDLCUDAHost
                try:
                    return np.from_dlpack(x)
                except (RuntimeError, TypeError, ValueError):  # a dtype DLPack lacks (bfloat16)
                    if not hasattr(x, "__array__"):
                        raise
            if hasattr(x, "get"):  # a CuPy array: copied from the device
                return x.get()
        return np.asarray(x)
    except Exception as e:  # noqa: BLE001 - each library says why in its own words
        raise ReplicateError(f"cannot make an array from {name}: {type(e).__name__}: {e}") \
            from None


def _array_type(kind):
    """CuPy's or JAX's array type, where the user's program imported the library (never
    imported here: a value of it cannot exist otherwise)."""
    module = sys.modules.get(kind)
    return getattr(module, "ndarray" if kind == "cupy" else "Array", None)


def device_kind(leaves) -> str | None:
    """``"cupy"`` or ``"jax"``: the library of the first of ``leaves`` that is one of its arrays
    (a call given device arrays returns them), or None."""
    for x in leaves:
        for kind in DEVICE_KINDS:
            cls = _array_type(kind)
            if cls is not None and isinstance(x, cls):
                return kind
    return None


def as_kind(x, kind: str, to_host=np.asarray):
    """``x`` (a NumPy array, or a CuPy/JAX array) as an array of ``kind``: through DLPack without
    a copy where both live on one GPU, else through the host (``to_host``: how a device array
    is copied down)."""
    cls = _array_type(kind)
    if cls is not None and isinstance(x, cls):
        return x
    module = sys.modules["cupy" if kind == "cupy" else "jax.numpy"]
    if hasattr(x, "__dlpack__") and not isinstance(x, np.ndarray):
        try:  # GPU to GPU (a JAX array for CuPy, a CuPy array for JAX): no copy
            return module.from_dlpack(x)
        except Exception:  # noqa: BLE001 - not on one device (a CPU JAX array): via the host
            pass
    return module.asarray(np.asarray(to_host(x)))


__all__ = ["as_kind", "device_kind", "from_foreign", "is_foreign"]
