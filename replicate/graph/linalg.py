"""The linear-algebra primitives' shape rules and reference rows (``primitives.py`` declares them,
``reference.py`` takes ``ROWS``, as it takes ``conv.py``'s; their gradients are ``linalg_vjp.py``).

Each works on a stack of matrices (the last two axes; the batch axes of several operands equal:
the wrappers in ``replicate/numpy/linalg.py`` broadcast them first) of one float dtype. A
factorisation with several results is one primitive per result, named by the attribute ``part``
(``qr``: "q", "r"; ``svd``: "u", "s", "vh"; ``eigh``: "w", "v"; ``slogdet``: "sign",
"logabsdet"): a node has one result, and the gradient of each is its own rule (the cotangents of
the parts add up). A row names ``xp.linalg`` only when it runs, so an array module without one
(a stand-in) can still build its table.

>>> import numpy as np
>>> ROWS["svd"](np)(np.diag([3.0, 4.0]), part="s", full_matrices=False).tolist()
[4.0, 3.0]
"""

from __future__ import annotations

from ..dtypes import is_float
from ..errors import DTypeError, ShapeError
from .aval import AVal


def _matrices(a, what, square=True):
    if len(a.shape) < 2:
        raise ShapeError(f"{what} needs a matrix (or a stack of them), got shape {a.shape}")
    if square and a.shape[-1] != a.shape[-2]:
        raise ShapeError(f"{what} needs square matrices, got shape {a.shape}")
    if not is_float(a.dtype):
        raise DTypeError(f"{what} needs floating-point matrices, got {a.dtype}")
    return tuple(a.shape[:-2]), a.shape[-2], a.shape[-1]


def solve_shape(a, b):
    batch, n, _ = _matrices(a, "solve")
    if b.shape[:-2] != batch or len(b.shape) != len(a.shape) or b.shape[-2] != n:
        raise ShapeError(f"solve: right-hand sides {b.shape} do not fit matrices {a.shape}")
    if b.dtype != a.dtype:
        raise DTypeError(f"solve: operand dtypes differ: {a.dtype} and {b.dtype}")
    return b


def cholesky_shape(a):
    _matrices(a, "cholesky")
    return a


def qr_shape(a, part):
    batch, m, n = _matrices(a, "qr", square=False)
    k = min(m, n)
    return AVal(batch + ((m, k) if part == "q" else (k, n)), a.dtype)


def svd_shape(a, part, full_matrices):
    batch, m, n = _matrices(a, "svd", square=False)
    k = min(m, n)
    shape = {"u": (m, m if full_matrices else k), "s": (k,),
             "vh": (n if full_matrices else k, n)}[part]
    return AVal(batch + shape, a.dtype)


def eigh_shape(a, part):
    batch, n, _ = _matrices(a, "eigh")
    return AVal(batch + ((n,) if part == "w" else (n, n)), a.dtype)


def det_shape(a, part=None):
    batch, _, _ = _matrices(a, "det")
    return AVal(batch, a.dtype)


PARTS = {"q": 0, "r": 1, "u": 0, "s": 1, "vh": 2, "w": 0, "v": 1, "sign": 0, "logabsdet": 1}

ROWS = {
    "solve": lambda xp: lambda a, b: xp.linalg.solve(a, b),
    "cholesky": lambda xp: lambda a: xp.linalg.cholesky(a),
    "qr": lambda xp: lambda a, part: xp.linalg.qr(a)[PARTS[part]],
    "svd": lambda xp: lambda a, part, full_matrices: xp.linalg.svd(
        a, full_matrices=full_matrices)[PARTS[part]],
    "eigh": lambda xp: lambda a, part: xp.linalg.eigh(a)[PARTS[part]],
    "det": lambda xp: lambda a: xp.linalg.det(a),
    "slogdet": lambda xp: lambda a, part: xp.linalg.slogdet(a)[PARTS[part]],
}

__all__ = ["PARTS", "ROWS", "cholesky_shape", "det_shape", "eigh_shape", "qr_shape",
           "solve_shape", "svd_shape"]
