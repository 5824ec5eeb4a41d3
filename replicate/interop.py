"""Other libraries' arrays (JAX, PyTorch, CuPy, anything with ``__dlpack__`` or ``__array__``)
as NumPy arrays: what ``rnp.asarray``, ``rnp.from_dlpack``, ``rp.function`` and a ``Replicator``'s
batches accept.

>>> import numpy as np
>>> from_foreign(memoryview(b"ab")).tolist()
[97, 98]
"""

from __future__ import annotations

import numpy as np

from .errors import ReplicateError


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


__all__ = ["from_foreign", "is_foreign"]
