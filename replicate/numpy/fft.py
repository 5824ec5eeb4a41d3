"""``rnp.fft``: the real-valued part of ``numpy.fft``. The library has no complex dtype (its
dtypes are bool, integers and floats), so the transforms — whose NumPy results (``fft``,
``rfft``, ``ifft``, ``fftn``, ``ihfft``, ...) or inputs (``irfft``, ``hfft``, ...) are complex —
cannot give NumPy's answer: each raises a ``DTypeError`` saying so, rather than returning
something else (a real part, stacked real and imaginary parts). What is real is here, exact:
``fftfreq`` and ``rfftfreq`` (NumPy's constants, known when traced, as ``arange``), and
``fftshift``/``ifftshift`` (``roll`` by half of each axis: a gather, its gradient the pieces').

>>> import replicate.numpy as rnp
>>> rnp.fft.fftfreq(5, d=0.1).tolist(), rnp.fft.fftshift(rnp.arange(5)).tolist()
([0.0, 2.0, 4.0, -4.0, -2.0], [3, 4, 0, 1, 2])
"""

from __future__ import annotations

import numbers

import numpy as np

from ..errors import DTypeError
from ..graph.core import concrete
from ._base import as_array, cast, check_device
from ._creation import _known, _static_int
from ._reorder import roll


def _frequencies(fn, name, n, d, dtype, device):
    check_device(device, name)
    n = _static_int(_known(n, f"{name}'s n"), f"{name}'s n")
    out = concrete(fn(n, _known(d, f"{name}'s d")))
    return out if dtype is None else cast(out, dtype)


def fftfreq(n, d=1.0, *, dtype=None, device=None):
    """The sample frequencies of an ``n``-point DFT with spacing ``d`` (``np.fft.fftfreq``):
    ``[0, 1, ..., n//2 - 1 (or (n-1)//2), -(n//2), ..., -1] / (n d)``, float64 (``dtype``: the
    Array API's keyword)."""
    return _frequencies(np.fft.fftfreq, "fftfreq", n, d, dtype, device)


def rfftfreq(n, d=1.0, *, dtype=None, device=None):
    """The non-negative sample frequencies of ``rfft`` (``np.fft.rfftfreq``):
    ``[0, 1, ..., n//2] / (n d)``, float64."""
    return _frequencies(np.fft.rfftfreq, "rfftfreq", n, d, dtype, device)


def _shift(x, axes, sign):
    x = as_array(x)
    if axes is None:
        axes = tuple(range(x.ndim))
    if isinstance(axes, numbers.Integral):
        return roll(x, sign * (x.shape[axes] // 2), axes)
    axes = tuple(axes)
    if not axes:
        return x
    return roll(x, tuple(sign * (x.shape[a] // 2) for a in axes), axes)


def fftshift(x, axes=None):
    """``x`` with the zero frequency moved to the middle (``np.fft.fftshift``): rolled by
    ``n // 2`` along each of ``axes`` (every axis when None)."""
    return _shift(x, axes, 1)


def ifftshift(x, axes=None):
    """``fftshift`` undone (``np.fft.ifftshift``): rolled by ``-(n // 2)`` along ``axes``."""
    return _shift(x, axes, -1)


def _complex(name):
    def transform(*args, **kwargs):
        raise DTypeError(f"rnp.fft.{name}: numpy.fft.{name} takes or returns complex numbers, "
                         "and the library has no complex dtype (bool, integers and floats "
                         "only), so it cannot give NumPy's result; run numpy.fft outside the "
                         "step")

    transform.__name__ = transform.__qualname__ = name
    transform.__doc__ = (f"Not available: ``numpy.fft.{name}``'s values are complex and the "
                         "library has no complex dtype (a ``DTypeError``).")
    return transform


_TRANSFORMS = ("fft", "ifft", "fft2", "ifft2", "fftn", "ifftn", "rfft", "irfft", "rfft2",
               "irfft2", "rfftn", "irfftn", "hfft", "ihfft")
globals().update({_name: _complex(_name) for _name in _TRANSFORMS})

__all__ = ["fftfreq", "fftshift", "ifftshift", "rfftfreq", *_TRANSFORMS]
