"""``rnp.linalg``: NumPy's ``numpy.linalg`` (and the Array API's ``linalg`` extension) for stacks of
real matrices (the last two axes; batch axes broadcast), traced and eager, on every backend.

What there is, and its gradient (``replicate/graph/linalg_vjp.py`` has the formulas):

* primitives (``graph/linalg.py``: NumPy's LAPACK routines, ``jax.numpy.linalg`` on JAX, ``cupy.
  linalg`` on CuPy, float16 computed in float32): ``solve``, ``cholesky`` (lower, or ``upper=``),
  ``qr`` (``mode="reduced"`` or ``"r"``; gradient for rows >= columns), ``svd`` (gradient of
  ``U``/``Vh`` with ``full_matrices=False`` or square matrices; of ``S`` always), ``svdvals``,
  ``eigh``/``eigvalsh`` (the lower triangle read, as NumPy), ``det``, ``slogdet``;
* compositions of those and of ``rnp``'s ops (their gradients the pieces'): ``inv`` (``solve``
  against the identity), ``pinv`` (the SVD's), ``matrix_power`` (NumPy's products; ``inv`` for
  negative powers), ``matrix_rank``, ``norm`` (NumPy's ``ord``s, vector and matrix: None,
  ``"fro"``, ``"nuc"``, ±1, ±2, ±inf, 0 and any p for vectors), the Array API's ``vector_norm``
  and ``matrix_norm``, ``matmul``, ``matrix_transpose``, ``vecdot``, ``tensordot``, ``outer``,
  ``trace``, ``diagonal``, ``cross``.

Integers and bools are computed in float64 (NumPy's rule). Where NumPy raises ``LinAlgError``
(a singular matrix for ``solve``/``inv``, one not positive definite for ``cholesky``) the
NumPy backend and eager mode raise it too; JAX gives NaN or inf there, as ``jax.numpy`` does.
Gradients where the derivative does not exist (equal singular values, a singular matrix) are
what the formulas give: inf or NaN, as JAX's. The 2-norm's gradient at 0 is 0 (a subgradient,
as PyTorch's), not NaN. Not here: complex matrices, ``eig``/``eigvals`` (complex results),
``lstsq``, ``tensorsolve``, ``qr(mode="complete")``.

>>> import replicate.numpy as rnp
>>> a = rnp.asarray([[4.0, 2.0], [2.0, 3.0]])
>>> rnp.linalg.solve(a, rnp.asarray([2.0, 1.0])).tolist()
[0.5, 0.0]
>>> round(float(rnp.linalg.det(a)), 6), rnp.linalg.norm(rnp.asarray([3.0, 4.0])).tolist()
(8.0, 5.0)
"""

from __future__ import annotations

import operator
from collections import namedtuple

import numpy as np

from ..dtypes import finfo, is_float
from ..errors import DTypeError, ShapeError
from ..graph.core import bind
from . import _arrayapi, _base, _creation, _elementwise, _namespace, _reductions, _shape
from ._linalg import matmul
from ._namespace import tensordot

QRResult = namedtuple("QRResult", "Q R")
SVDResult = namedtuple("SVDResult", "U S Vh")
EighResult = namedtuple("EighResult", "eigenvalues eigenvectors")
SlogdetResult = namedtuple("SlogdetResult", "sign logabsdet")
matrix_transpose, vecdot = _arrayapi.matrix_transpose, _arrayapi.vecdot


def _float(x):
    x = _base.as_array(x)
    return x if is_float(x.dtype) else _base.cast(x, np.float64)


def _matrices(x, what, square=True):
    x = _float(x)
    if x.ndim < 2 or square and x.shape[-1] != x.shape[-2]:
        raise ShapeError(f"{what} needs {'square ' if square else ''}matrices (the last two "
                         f"axes), got shape {x.shape}")
    return x


def solve(a, b):
    """The ``x`` with ``a @ x == b`` (``np.linalg.solve``, NumPy 2's rule: ``b`` is a vector
    when it is 1-D, else a stack of matrices; the batch axes broadcast)."""
    a = _matrices(a, "solve")
    b = _float(b)
    a, b = _base.promote(a, b)
    vector = b.ndim == 1
    if vector:
        b = _shape.expand_dims(b, -1)
    if b.ndim < 2 or b.shape[-2] != a.shape[-1]:
        raise ShapeError(f"solve: right-hand side of shape {b.shape} does not fit matrices of "
                         f"shape {a.shape}")
    batch = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    a = _shape.broadcast_to(a, batch + a.shape[-2:])
    b = _shape.broadcast_to(b, batch + b.shape[-2:])
    x = bind("solve", a, b)
    return _shape.squeeze(x, -1) if vector else x


def inv(a):
    """The inverse of each matrix (``np.linalg.inv``): ``solve`` against the identity."""
    a = _matrices(a, "inv")
    return solve(a, _shape.broadcast_to(_creation.eye(a.shape[-1], dtype=a.dtype), a.shape))


def cholesky(a, upper=False):
    """The lower-triangular ``L`` with ``L @ L.T == a`` for a symmetric positive-definite ``a``
    (only its lower triangle is read, as NumPy); ``upper=True`` (the Array API's) gives
    ``L.T``. Gradient: the symmetric one."""
    out = bind("cholesky", _matrices(a, "cholesky"))
    return matrix_transpose(out) if upper else out


def qr(a, mode="reduced"):
    """``(Q, R)`` with orthonormal columns in ``Q`` and upper-triangular ``R`` (``np.linalg.qr``;
    ``mode="r"``: ``R`` alone)."""
    a = _matrices(a, "qr", square=False)
    if mode == "r":
        return bind("qr", a, part="r")
    if mode != "reduced":
        raise ShapeError(f"qr: mode {mode!r} is not supported (\"reduced\" and \"r\" are)")
    return QRResult(bind("qr", a, part="q"), bind("qr", a, part="r"))


def svd(a, full_matrices=True, compute_uv=True):
    """``(U, S, Vh)``, singular values descending (``np.linalg.svd``; ``compute_uv=False``:
    ``S`` alone)."""
    a = _matrices(a, "svd", square=False)
    full = bool(full_matrices)
    if not compute_uv:
        return svdvals(a)
    return SVDResult(*(bind("svd", a, part=p, full_matrices=full) for p in ("u", "s", "vh")))


def svdvals(x):
    """The singular values, descending (the Array API's ``svdvals``)."""
    return bind("svd", _matrices(x, "svdvals", square=False), part="s", full_matrices=False)


def eigh(a, UPLO="L"):  # noqa: N803 - NumPy's name
    """``(eigenvalues, eigenvectors)`` of a symmetric ``a``, ascending (``np.linalg.eigh``; the
    lower triangle is read)."""
    if UPLO != "L":
        raise ShapeError("eigh: only UPLO='L' (the lower triangle) is supported")
    a = _matrices(a, "eigh")
    return EighResult(bind("eigh", a, part="w"), bind("eigh", a, part="v"))


def eigvalsh(a, UPLO="L"):  # noqa: N803 - NumPy's name
    """The eigenvalues of a symmetric ``a``, ascending (``np.linalg.eigvalsh``)."""
    return eigh(a, UPLO).eigenvalues


def det(a):
    """The determinant of each matrix (``np.linalg.det``)."""
    return bind("det", _matrices(a, "det"))


def slogdet(a):
    """``(sign, logabsdet)``: the determinant's sign and the log of its magnitude, without
    overflow (``np.linalg.slogdet``)."""
    a = _matrices(a, "slogdet")
    return SlogdetResult(bind("slogdet", a, part="sign"), bind("slogdet", a, part="logabsdet"))


def _two_norm(x, axes, keepdims):
    """``sqrt(sum(x**2))`` whose gradient at 0 is 0 (a square root of a zero-safe operand)."""
    squares = _reductions.sum(x * x, axis=axes, keepdims=keepdims)
    zero = _elementwise.equal(squares, 0)
    return _elementwise.where(zero, 0.0, _elementwise.sqrt(_elementwise.where(zero, 1.0,
                                                                               squares)))


def vector_norm(x, axis=None, keepdims=False, ord=2):  # noqa: A002 - the standard's name
    """The Array API's ``vector_norm``: the ``ord``-norm over ``axis`` (an int, a tuple, or
    None: every axis), as NumPy's vector norms."""
    x = _float(x)
    axes = _base.norm_axes(axis, x.ndim)
    if ord in (None, 2):
        return _two_norm(x, axes, keepdims)
    a = _elementwise.abs(x)
    if ord == np.inf:
        return _reductions.max(a, axis=axes, keepdims=keepdims)
    if ord == -np.inf:
        return _reductions.min(a, axis=axes, keepdims=keepdims)
    if ord == 0:
        return _base.cast(_reductions.sum(_elementwise.not_equal(x, 0), axis=axes,
                                          keepdims=keepdims), x.dtype)
    if ord == 1:
        return _reductions.sum(a, axis=axes, keepdims=keepdims)
    return _elementwise.power(_reductions.sum(_elementwise.power(a, ord), axis=axes,
                                              keepdims=keepdims), 1.0 / ord)


def matrix_norm(x, keepdims=False, ord="fro"):  # noqa: A002 - the standard's name
    """The Array API's ``matrix_norm`` over the last two axes: ``"fro"``, ``"nuc"`` (the sum of
    the singular values), 1/-1 (largest/smallest column sum of magnitudes), inf/-inf (rows),
    2/-2 (largest/smallest singular value)."""
    x = _matrices(x, "matrix_norm", square=False)
    if ord in (None, "fro"):
        out = _two_norm(x, (x.ndim - 2, x.ndim - 1), False)
    elif ord in ("nuc", 2, -2):
        s = svdvals(x)
        out = {"nuc": _reductions.sum, 2: _reductions.max, -2: _reductions.min}[ord](s, axis=-1)
    elif ord in (1, -1, np.inf, -np.inf):
        sums = _reductions.sum(_elementwise.abs(x), axis=-2 if ord in (1, -1) else -1)
        out = (_reductions.max if ord > 0 else _reductions.min)(sums, axis=-1)
    else:
        raise ShapeError(f"matrix_norm: ord {ord!r} is not a matrix norm")
    return _shape.expand_dims(out, (-2, -1)) if keepdims else out


def norm(x, ord=None, axis=None, keepdims=False):  # noqa: A002 - NumPy's name
    """``np.linalg.norm``: with ``axis`` None, the 2-norm of the flattened ``x`` (``ord`` None)
    or ``x``'s vector (1-D) or matrix (2-D) norm; an int ``axis`` a vector norm along it, a pair
    a matrix norm over those axes."""
    x = _float(x)
    if axis is None:
        if ord is None:
            return _two_norm(x, tuple(range(x.ndim)), keepdims)
        if x.ndim not in (1, 2):
            raise ShapeError(f"norm: ord={ord!r} needs a 1-D or 2-D array, got {x.ndim}-D")
        axis = tuple(range(x.ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    if len(axes) == 1:
        return vector_norm(x, axes[0], keepdims, 2 if ord is None else ord)
    if len(axes) != 2:
        raise ShapeError(f"norm: axis is an int or a pair, got {axis!r}")
    a, b = (_base.norm_axes(ax, x.ndim)[0] for ax in axes)
    if a == b:
        raise ShapeError(f"norm: the two axes of a matrix norm are one: {axis!r}")
    moved = _shape.transpose(x, [i for i in range(x.ndim) if i not in (a, b)] + [a, b])
    out = matrix_norm(moved, False, "fro" if ord is None else ord)
    if keepdims:
        out = _shape.expand_dims(out, tuple(sorted((a, b))))
    return out


def outer(x1, x2):
    """The outer product of two vectors (the Array API's ``linalg.outer``)."""
    a, b = _base.promote(x1, x2)
    if a.ndim != 1 or b.ndim != 1:
        raise ShapeError(f"outer needs two vectors, got shapes {a.shape} and {b.shape}")
    return _shape.expand_dims(a, 1) * _shape.expand_dims(b, 0)


def trace(x, offset=0, *, dtype=None):
    """The sums of the diagonals (offset ``offset``) of the stacked matrices (the Array API's
    ``linalg.trace``; ``dtype``: the sum's, as ``sum``'s)."""
    return _reductions.sum(diagonal(x, offset), axis=-1, dtype=dtype)


def cross(x1, x2, axis=-1):
    """The cross products of the 3-vectors along ``axis`` (``np.linalg.cross``, the Array API's):
    the other axes broadcast; the promoted dtype (integers wrap, as NumPy's; bools refused, as
    NumPy's subtraction of bools). NumPy's formula, product by product
    (``x1[1] * x2[2] - x1[2] * x2[1]``, ...): its gradient is that of the pieces.

    >>> import replicate.numpy as rnp
    >>> rnp.linalg.cross(rnp.asarray([1, 2, 3]), rnp.asarray([4, 5, 6])).tolist()
    [-3, 6, -3]
    """
    a, b = _base.promote(x1, x2)
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError("cross needs arrays of 3-vectors, got a 0-d operand")
    a = _shape.moveaxis(a, _shape._axis(axis, a.ndim, "cross"), -1)
    b = _shape.moveaxis(b, _shape._axis(axis, b.ndim, "cross"), -1)
    if a.shape[-1] != 3 or b.shape[-1] != 3:
        raise ShapeError(f"cross needs 3-vectors along axis {axis}, got lengths {a.shape[-1]} "
                         f"and {b.shape[-1]}")
    (a0, a1, a2), (b0, b1, b2) = (_namespace.unstack(v, -1) for v in (a, b))
    out = _shape.stack([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0], -1)
    return _shape.moveaxis(out, -1, _shape._axis(axis, out.ndim, "cross"))


def diagonal(x, offset=0):
    """The diagonals (offset ``offset``: above the main one when positive) of the stacked
    matrices, the last axis of the result (``np.linalg.diagonal``, the Array API's); a gather,
    its gradient a scatter.

    >>> import replicate.numpy as rnp
    >>> rnp.linalg.diagonal(rnp.asarray([[1, 2, 3], [4, 5, 6]]), offset=1).tolist()
    [2, 6]
    """
    x = _base.as_array(x)
    if x.ndim < 2:
        raise ShapeError(f"diagonal needs matrices (the last two axes), got shape {x.shape}")
    offset = operator.index(offset)
    m, n = x.shape[-2:]
    rows = np.arange(max(0, min(m + min(offset, 0), n - max(offset, 0))))
    return x[..., rows - min(offset, 0), rows + max(offset, 0)]


def matrix_power(a, n):
    """``a`` to the integer power ``n`` by repeated squaring, NumPy's order of products
    (``np.linalg.matrix_power``): the identity in ``a``'s dtype for 0, ``inv(a)`` to ``-n`` for
    a negative ``n`` (float64 for integers; ``LinAlgError`` for a singular matrix, where NumPy
    raises). Integers and bools stay themselves for ``n >= 0``; the gradient is the products'.

    >>> import replicate.numpy as rnp
    >>> rnp.linalg.matrix_power(rnp.asarray([[1, 1], [0, 1]]), 5).tolist()
    [[1, 5], [0, 1]]
    """
    a = _base.as_array(a)
    if a.ndim < 2 or a.shape[-1] != a.shape[-2]:
        raise ShapeError(f"matrix_power needs square matrices (the last two axes), got shape "
                         f"{a.shape}")
    try:
        n = operator.index(n)
    except TypeError:
        raise DTypeError(f"matrix_power: the exponent must be an integer, got {n!r}") from None
    if n == 0:
        return _shape.broadcast_to(_creation.eye(a.shape[-1], dtype=a.dtype), a.shape)
    if n < 0:
        a, n = inv(a), -n
    if n <= 3:
        return {1: lambda: a, 2: lambda: matmul(a, a), 3: lambda: matmul(matmul(a, a), a)}[n]()
    z = result = None
    while n > 0:
        z = a if z is None else matmul(z, z)
        n, bit = divmod(n, 2)
        if bit:
            result = z if result is None else matmul(result, z)
    return result


def _tolerance(s, rtol, shape):
    """NumPy's cutoff: ``rtol`` (default ``max(m, n) * eps``) times each largest singular value."""
    if rtol is None:
        rtol = max(shape[-2:]) * finfo(s.dtype).eps
    rtol = _shape.expand_dims(_base.as_array(rtol, s.dtype), -1)
    return rtol * _reductions.max(s, axis=-1, keepdims=True)


def matrix_rank(x, tol=None, hermitian=False, *, rtol=None):
    """The number of singular values above the tolerance, per matrix (``np.linalg.matrix_rank``,
    the Array API's with ``rtol``): ``tol`` absolute, else ``rtol`` (default ``max(m, n) *
    eps``) times the largest singular value; ``hermitian``: the eigenvalues' magnitudes. int64;
    for a 0-d or 1-D ``x`` 1 unless every entry is 0 (NumPy's Python int, here a 0-d int64).

    >>> import replicate.numpy as rnp
    >>> rnp.linalg.matrix_rank(rnp.asarray([[1.0, 2.0], [2.0, 4.0]])).tolist()
    1
    """
    if tol is not None and rtol is not None:
        raise ShapeError("matrix_rank: tol and rtol cannot both be set")
    x = _float(x)
    if x.ndim < 2:
        return _base.cast(_namespace.any(x), np.int64)
    if 0 in x.shape[-2:]:
        return _creation.zeros(x.shape[:-2], np.int64)
    s = _elementwise.abs(eigvalsh(x)) if hermitian else svdvals(x)
    cut = _tolerance(s, rtol, x.shape) if tol is None else _shape.expand_dims(
        _base.as_array(tol, s.dtype), -1)
    return _base.cast(_reductions.sum(s > cut, axis=-1), np.int64)


_UNSET = object()


def pinv(a, rcond=None, hermitian=False, *, rtol=_UNSET):
    """The Moore-Penrose pseudo-inverse of each matrix (``np.linalg.pinv``): ``V diag(1/s) U^T``
    from the SVD, singular values at or below ``rcond`` (default 1e-15; ``rtol`` the Array
    API's, None: ``max(m, n) * eps``) times the largest taken as 0; ``hermitian``: from
    ``eigh``. Its gradient is the SVD's (it needs distinct singular values).

    >>> import replicate.numpy as rnp
    >>> rnp.linalg.pinv(rnp.asarray([[2.0, 0.0], [0.0, 0.0]])).tolist()
    [[0.5, 0.0], [0.0, 0.0]]
    """
    if rcond is not None and rtol is not _UNSET:
        raise ShapeError("pinv: rcond and rtol cannot both be set")
    a = _matrices(a, "pinv", square=False)
    m, n = a.shape[-2:]
    if m == 0 or n == 0:
        return _creation.zeros(a.shape[:-2] + (n, m), a.dtype)
    if rcond is None:
        rcond = 1e-15 if rtol is _UNSET else rtol
    if hermitian:
        s, v = eigh(a)
        u, vt = v, matrix_transpose(v)
        mag = _elementwise.abs(s)
    else:
        u, s, vt = svd(a, full_matrices=False)
        mag = s
    large = mag > _tolerance(mag, rcond, a.shape)
    s_inv = _elementwise.where(large, 1.0 / _elementwise.where(large, s, 1.0), 0.0)
    return matmul(matrix_transpose(vt), _shape.expand_dims(s_inv, -1) * matrix_transpose(u))


__all__ = ["EighResult", "QRResult", "SVDResult", "SlogdetResult", "cholesky", "cross", "det",
           "diagonal", "eigh", "eigvalsh", "inv", "matmul", "matrix_norm", "matrix_power",
           "matrix_rank", "matrix_transpose", "norm", "outer", "pinv", "qr", "slogdet", "solve",
           "svd", "svdvals", "tensordot", "trace", "vecdot", "vector_norm"]
