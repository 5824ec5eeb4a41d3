"""Gradient (VJP) rules of the linear-algebra primitives (``graph/linalg.py``), in
``replicate.numpy`` as ``vjp_rules.py``'s (which adds ``RULES`` to its table).

A factorisation's parts are separate primitives, so each rule is the factorisation's gradient
with the other parts' cotangents zero (the gradient is linear in the cotangents: the parts' sum
is the whole). ``cholesky`` and ``eigh`` read a symmetric matrix (NumPy reads its lower
triangle): their gradients are the symmetric ones, as JAX's and PyTorch's. Where the derivative
does not exist the gradient is what the formula gives (inf or NaN), as JAX's: a singular
matrix (``solve``, ``slogdet``), equal singular values or eigenvalues (``svd``'s ``u``/``vh``,
``eigh``'s ``v``), a zero singular value (``svd``'s ``u``/``vh`` of a tall or wide matrix).
``det``'s gradient is ``det(a) inv(a).T``: at a singular matrix, where the derivative (the
adjugate) exists and JAX gives it, the NumPy backend raises NumPy's ``LinAlgError`` and the
JAX backend gives NaN — never a finite wrong number. ``qr`` has a gradient for m >= n (as
JAX), ``svd``'s S always, its U and Vh for ``full_matrices=False`` or square matrices.
"""

from __future__ import annotations

from .. import numpy as rnp
from ..errors import ShapeError
from .core import bind


def _t(x):
    return rnp.swapaxes(x, -1, -2)


def _solve_right(x, a):
    """``x @ inv(a)``: ``solve(a.T, x.T).T``."""
    return _t(bind("solve", _t(a), _t(x)))


def _eye_like(x):
    return rnp.eye(x.shape[-1], dtype=x.dtype)


def _solve(g, out, needs, a, b):
    gb = bind("solve", _t(a), g)  # inv(a).T @ g
    return (-rnp.matmul(gb, _t(out)) if needs[0] else None, gb)


def _cholesky(g, out, needs, a):
    # Murray (2016): inv(L).T @ phi(L.T @ tril(g)) @ inv(L), symmetrised; phi: the lower
    # triangle with its diagonal halved
    p = rnp.matmul(_t(out), rnp.tril(g))
    p = rnp.tril(p) - 0.5 * p * _eye_like(p)
    s = _solve_right(bind("solve", _t(out), p), out)
    return (0.5 * (s + _t(s)),)


def _copyltu(m):
    """The lower triangle of ``m`` mirrored into the upper one."""
    return rnp.tril(m) + _t(rnp.tril(m, -1))


def _qr(g, out, needs, a, part):
    # Liao et al. (2019), m >= n: (gQ + Q copyltu(M)) inv(R).T with M = R gR.T - gQ.T Q
    if a.shape[-2] < a.shape[-1]:
        raise ShapeError(f"the gradient of qr needs m >= n (rows >= columns), got {a.shape} "
                         "(JAX has none there either)")
    q = out if part == "q" else bind("qr", a, part="q")
    r = out if part == "r" else bind("qr", a, part="r")
    if part == "q":
        x = g + rnp.matmul(q, _copyltu(-rnp.matmul(_t(g), q)))
    else:
        x = rnp.matmul(q, _copyltu(rnp.matmul(r, _t(g))))
    return (_solve_right(x, _t(r)),)


def _spread(values):
    """``F[i, j] = 1 / (values[j] - values[i])``, 0 on the diagonal."""
    diff = rnp.expand_dims(values, -2) - rnp.expand_dims(values, -1)
    eye = rnp.eye(values.shape[-1], dtype=bool)
    return rnp.where(eye, 0.0, 1.0 / rnp.where(eye, 1.0, diff))


def _svd(g, out, needs, a, part, full_matrices):
    # Townsend (2016), "Differentiating the singular value decomposition"
    m, n = a.shape[-2:]
    if full_matrices and m != n and part != "s":
        raise ShapeError(f"the gradient of svd's U and Vh of a {m}x{n} matrix needs "
                         "full_matrices=False")
    u, s, vh = (out if p == part else bind("svd", a, part=p, full_matrices=full_matrices)
                for p in ("u", "s", "vh"))
    if part == "s":  # (full matrices of a non-square a: the k = min(m, n) vectors S scales)
        k = min(m, n)
        return (rnp.matmul(u[..., :, :k] * rnp.expand_dims(g, -2), vh[..., :k, :]),)
    f = _spread(s * s)
    if part == "u":
        utg = rnp.matmul(_t(u), g)
        inner = f * (utg - _t(utg)) * rnp.expand_dims(s, -2)
        rest = (g - rnp.matmul(u, utg)) / rnp.expand_dims(s, -2)  # (I - U U.T) gU / S
        return (rnp.matmul(rnp.matmul(u, inner) + rest, vh),)
    gvh = g  # vh = V.T: gV.T is g
    vgv = rnp.matmul(vh, _t(gvh))  # V.T gV
    inner = rnp.expand_dims(s, -1) * (f * (vgv - _t(vgv)))
    rest = (gvh - rnp.matmul(rnp.matmul(gvh, _t(vh)), vh)) / rnp.expand_dims(s, -1)
    return (rnp.matmul(u, rnp.matmul(inner, vh) + rest),)


def _eigh(g, out, needs, a, part):
    w, v = (out if p == part else bind("eigh", a, part=p) for p in ("w", "v"))
    if part == "w":
        inner = rnp.expand_dims(g, -1) * _eye_like(v)
    else:
        inner = _spread(w) * rnp.matmul(_t(v), g)
    ga = rnp.matmul(rnp.matmul(v, inner), _t(v))
    return (0.5 * (ga + _t(ga)),)


def _inverse_t(a):
    return _t(bind("solve", a, rnp.broadcast_to(_eye_like(a), a.shape)))


def _det(g, out, needs, a):
    return (rnp.expand_dims(g * out, (-1, -2)) * _inverse_t(a),)


def _slogdet(g, out, needs, a, part):
    if part == "sign":  # piecewise constant
        return (rnp.zeros_like(a),)
    return (rnp.expand_dims(g, (-1, -2)) * _inverse_t(a),)


RULES = {"solve": _solve, "cholesky": _cholesky, "qr": _qr, "svd": _svd, "eigh": _eigh,
         "det": _det, "slogdet": _slogdet}
