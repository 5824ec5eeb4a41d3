"""The op harness's cases: the last of NumPy's names (issue 30) — the sign bits (``signbit``,
``copysign``: -0.0 and -NaN included), ``hypot`` (no overflow or underflow), ``searchsorted``,
``rnp.linalg``'s compositions (``cross``, ``diagonal``, ``matrix_power``, ``matrix_rank``,
``pinv``) and ``rnp.fft``'s real-valued functions."""

from __future__ import annotations

import numpy as np

import replicate.numpy as rnp

from .cases import BOOL, F32, F64, I32, I64, In, case

# -- sign bits and hypot ------------------------------------------------------------------------
for _dtype, _domain in ((F64, "special"), (F32, "special"), (I32, "int"), (BOOL, "real")):
    case("signbit", rnp.signbit, np.signbit, In((2, 3), _dtype, _domain), grad=False)
# -0.0 (x * -0.0 for x > 0) and -NaN (NaN with a negative x's sign), made inside the step. The
# sign of a NaN an operation makes (inf * 0) or passes on (NaN * -0.0) is the hardware's (IEEE
# 754 leaves it open: an x86 CPU sets it, an NVIDIA GPU does not): read where x * -0.0 is a
# number only; copysign sets a NaN's sign everywhere
case("signbit+copysign",
     lambda x: (rnp.signbit(rnp.where(rnp.isnan(x * -0.0), 0.0, x * -0.0)),
                rnp.signbit(rnp.copysign(np.nan, x)), rnp.copysign(np.nan, x)),
     lambda x: (np.signbit(np.where(np.isnan(x * -0.0), 0.0, x * -0.0)),
                np.signbit(np.copysign(np.nan, x)), np.copysign(np.nan, x)),
     In((6,), F64, "special"), grad=False, label="signs")
for _name, _op, _ref in (("copysign", rnp.copysign, np.copysign),
                         ("hypot", rnp.hypot, np.hypot)):
    case(_name, _op, _ref, In((2, 3), F64, "away0"), In((3,), F64, "away0"))
    case(_name, _op, _ref, In((2, 1), F64, "away0"), In((1, 3), F64, "away0"))
    case(_name, _op, _ref, In((), F64, "away0"), In((4,), F64, "away0"))
    case(_name, _op, _ref, In((2, 3), F32), In((3,), F32))
    case(_name, _op, _ref, In((2, 3), I32, "int"), In((3,), I64, "int"), label="int")
    case(_name, _op, _ref, In((4,), BOOL), In((4,), BOOL), label="bool")  # float16, as NumPy
    case(_name, _op, _ref, In((6, 1), F64, "special"), In((1, 6), F64, "special"), grad=False,
         label="special")  # every pair of NaN, +-inf, 0, 1.5, -2
    case(_name, lambda a, op=_op: op(a, -0.0), lambda a, ref=_ref: ref(a, -0.0),
         In((4,), F64, "int"), grad=False, label="signed zero")
for _scale in (1e200, 1e-200):  # the squares overflow / underflow: hypot's do not
    case("hypot", lambda a, b, s=_scale: rnp.hypot(a * s, b * s),
         lambda a, b, s=_scale: np.hypot(a * s, b * s), In((2, 3), F64, "away0"),
         In((3,), F64, "away0"), grad=False, label=f"scale {_scale:g}")  # (test_signs.py)
case("hypot", lambda a: rnp.hypot(a, a * 0.0), lambda a: np.hypot(a, a * 0.0), In((4,)),
     label="on an axis")

# -- searchsorted -------------------------------------------------------------------------------
for _side in ("left", "right"):
    case("searchsorted", lambda a, v, s=_side: rnp.searchsorted(rnp.sort(a), v, side=s),
         lambda a, v, s=_side: np.searchsorted(np.sort(a), v, side=s), In((6,), F64, "int"),
         In((2, 4), F64, "int"), grad=False, label=_side)  # ties: left and right differ
    case("searchsorted", lambda a, v, s=_side: rnp.searchsorted(a, v, s, sorter=rnp.argsort(a)),
         lambda a, v, s=_side: np.searchsorted(a, v, s, sorter=np.argsort(a)),
         In((6,), F64, "special"), In((6,), F64, "special"), grad=False,
         label=f"{_side} sorter")  # NaNs sort last, as values too
    case("searchsorted", lambda a, v, s=_side: rnp.searchsorted(rnp.sort(a), v, s),
         lambda a, v, s=_side: np.searchsorted(np.sort(a), v, s), In((5,), I32, "int"),
         In((), I64, "int"), grad=False, label=f"{_side} int")

# -- rnp.linalg's compositions (tests/api/test_linalg.py: more shapes, the errors) -----------------
L = rnp.linalg
case("linalg.cross", L.cross, np.linalg.cross, In((2, 3)), In((3,)))
case("linalg.cross", lambda a, b: L.cross(a, b, axis=0), lambda a, b: np.linalg.cross(a, b, axis=0),
     In((3, 2)), In((3, 2)))
case("linalg.cross", L.cross, np.linalg.cross, In((4, 3), I64, "int"), In((4, 3), I64, "int"),
     label="int")
for _offset in (-1, 0, 2):
    case("linalg.diagonal", lambda x, k=_offset: L.diagonal(x, offset=k),
         lambda x, k=_offset: np.linalg.diagonal(x, offset=k), In((2, 3, 4)), label=f"{_offset}")


def _well(a, xp):
    """``a`` + 3 I: invertible, for the negative powers."""
    return a + 3.0 * xp.eye(a.shape[-1], dtype=a.dtype)


for _n in (-3, -1, 0, 1, 2, 5):
    case("linalg.matrix_power", lambda a, n=_n: L.matrix_power(_well(a, rnp), n),
         lambda a, n=_n: np.linalg.matrix_power(_well(a, np), n), In((2, 3, 3)), label=f"{_n}")
case("linalg.matrix_power", lambda a: L.matrix_power(a, 6), lambda a: np.linalg.matrix_power(a, 6),
     In((3, 3), I64, "int"), label="int")
case("linalg.matrix_rank", lambda a: (L.matrix_rank(a), L.matrix_rank(a[..., :1] * a[..., :1].mT),
                                      L.matrix_rank(a[0, 0]), L.matrix_rank(a * 0)),
     lambda a: (np.linalg.matrix_rank(a), np.linalg.matrix_rank(a[..., :1] * a[..., :1].mT),
                np.linalg.matrix_rank(a[0, 0]), np.linalg.matrix_rank(a * 0)),
     In((2, 4, 4), I64, "int"), grad=False)  # (the default rtol: its dtype's eps)
case("linalg.matrix_rank", lambda a: (L.matrix_rank(a, rtol=0.5), L.matrix_rank(a, tol=1.0),
                                      L.matrix_rank(a @ a.mT, hermitian=True)),
     lambda a: (np.linalg.matrix_rank(a, rtol=0.5), np.linalg.matrix_rank(a, tol=1.0),
                np.linalg.matrix_rank(a @ a.mT, hermitian=True)), In((2, 4, 3)), grad=False)
for _shape in ((2, 4, 3), (3, 5), (3, 3)):
    case("linalg.pinv", L.pinv, np.linalg.pinv, In(_shape))
case("linalg.pinv", lambda a: L.pinv(_well(a @ a.mT, rnp), hermitian=True),
     lambda a: np.linalg.pinv(_well(a @ a.mT, np), hermitian=True), In((3, 3)), label="hermitian")

# -- rnp.fft: what is real (the transforms are complex: tests/api/test_fft.py) ---------------------
case("fft.fftfreq+fft.rfftfreq", lambda x: (x * rnp.fft.fftfreq(5, d=0.1),
                                            x * rnp.fft.rfftfreq(8, 0.5)[:5]),
     lambda x: (x * np.fft.fftfreq(5, d=0.1), x * np.fft.rfftfreq(8, 0.5)[:5]),
     In((5,), I64, "int"), grad=False)  # (constants: float64, as NumPy's)
for _axes in (None, 1, (0, 2)):
    case("fft.fftshift+fft.ifftshift", lambda x, a=_axes: (rnp.fft.fftshift(x, a),
                                                          rnp.fft.ifftshift(x, a)),
         lambda x, a=_axes: (np.fft.fftshift(x, a), np.fft.ifftshift(x, a)), In((2, 3, 5)),
         label=f"axes {_axes}")

# -- the complex functions of real arrays: NumPy's (real, conj: the values; imag: zeros) ----------
case("real+conj", lambda x: (rnp.real(x), rnp.conj(x)), lambda x: (np.real(x), np.conj(x)),
     In((2, 3)))
for _dtype in (F32, I32, BOOL):
    case("real+imag+conj", lambda x: (rnp.real(x), rnp.imag(x), rnp.conj(x)),
         lambda x: (np.real(x), np.imag(x), np.conj(x)), In((4,), _dtype), grad=False)
case("linalg.trace", lambda x: rnp.linalg.trace(x, offset=1, dtype="float32"),
     lambda x: np.linalg.trace(x, offset=1, dtype="float32"), In((2, 3, 4), I32, "int"))
