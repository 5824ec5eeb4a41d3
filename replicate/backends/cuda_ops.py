"""The per-primitive CUDA expressions of fused kernels (``CUDA``, a rule table) and the device
helpers they call (``PREAMBLE``), for ``cuda_codegen.py``.

Where the reference raises on a value (``np.power`` of an integer to a negative integer power:
"Integers to negative integer powers are not allowed.") the generated code cannot raise: it
writes 1 to an error flag (``*_err``), a ``raw int32`` parameter of the kernel that the backend
reads once per call (``cupy_index.DeviceChecks``) and turns into NumPy's error. Where the
reference gives a value for what C leaves undefined (an integer divided by 0 is 0, the most
negative integer divided by -1 wraps), the helpers give NumPy's value, not the hardware's.
"""

from __future__ import annotations

import numpy as np

from ..graph.primitives import REGISTRY, RuleTable

ERR = "_err"             # the C name of the flag pointer inside a kernel's code
ERR_PARAM = "err_flag"   # the kernel's ``raw int32`` parameter it points into
POW_MESSAGE = "Integers to negative integer powers are not allowed."  # NumPy's

CTYPE = {"float16": "float16", "float32": "float", "float64": "double", "int8": "signed char",
         "int32": "int", "int64": "long long", "uint8": "unsigned char", "uint32": "unsigned int",
         "bool": "bool"}


def ctype(dtype) -> str:
    name = np.dtype(dtype).name
    if name not in CTYPE:
        raise NotImplementedError(f"no CUDA type for {name}")
    return CTYPE[name]


PREAMBLE = """
template <typename T> __device__ T _ipow(T a, T b, int* err) {
  if (b < 0) { *err = 1; return 0; }
  T r = 1;
  while (b) { if (b & 1) r *= a; a *= a; b >>= 1; }
  return r;
}
template <typename T> __device__ T _floordiv(T a, T b) {
  if (b == 0) return 0;
  if (b < 0 && b == (T)-1) return (T)(0ull - (unsigned long long)a);
  T q = a / b; return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q;
}
template <typename T> __device__ T _imod(T a, T b) {
  if (b == 0 || (b < 0 && b == (T)-1)) return 0;
  T r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
__device__ float _ffloordiv(float a, float b) {
  if (b == 0) return a / b;
  float m = fmodf(a, b), d = (a - m) / b;
  if (m != 0 && ((b < 0) != (m < 0))) d -= 1.0f;
  if (d == 0) return copysignf(0.0f, a / b);
  float f = floorf(d);
  return d - f > 0.5f ? f + 1.0f : f;
}
__device__ double _ffloordiv(double a, double b) {
  if (b == 0) return a / b;
  double m = fmod(a, b), d = (a - m) / b;
  if (m != 0 && ((b < 0) != (m < 0))) d -= 1.0;
  if (d == 0) return copysign(0.0, a / b);
  double f = floor(d);
  return d - f > 0.5 ? f + 1.0 : f;
}
__device__ float _fmod(float a, float b) {
  float r = fmodf(a, b);
  return r != 0 ? (((r < 0) != (b < 0)) ? r + b : r) : copysignf(0.0f, b);
}
__device__ double _fmod(double a, double b) {
  double r = fmod(a, b);
  return r != 0 ? (((r < 0) != (b < 0)) ? r + b : r) : copysign(0.0, b);
}
"""


def max_expr(a, b):  # NaN-propagating, as NumPy's maximum
    return f"(({a} > {b} || {a} != {a}) ? {a} : {b})"


def min_expr(a, b):
    return f"(({a} < {b} || {a} != {a}) ? {a} : {b})"


FLOATS = ("float", "double", "float16")


def _div(a, b, t):
    return f"({a} / {b})" if t in FLOATS else f"_floordiv({a}, {b})"


def _mod(a, b, t):
    """NumPy's remainder: the result has the divisor's sign (an integer mod 0 is 0, as NumPy)."""
    return f"_fmod({a}, {b})" if t in ("float", "double") else f"_imod({a}, {b})"


def _pow(a, b, t, scalar_exponent=False, **_):
    """Floats through CUDA's ``pow``; integers by squaring (CUDA has no integer ``pow``), a
    negative exponent setting the kernel's error flag (NumPy raises).

    NumPy's float power loop takes a broadcast exponent of 0.5 as ``sqrt``: ``np.power(x,
    0.5)`` is nan at -inf and -0.0 at -0.0, where C's ``pow`` (and NumPy's own loop over an
    exponent array) gives inf and +0. A power by one broadcast value (``scalar_exponent``,
    ``x ** 0.5`` with a constant) does the same here."""
    if t not in ("float", "double"):
        return f"_ipow<{t}>({a}, {b}, {ERR})"
    if scalar_exponent:
        return f"(({t})({b} == ({t})0.5 ? sqrt({a}) : pow({a}, {b})))"
    return f"(({t})pow({a}, {b}))"


def needs_flag(node) -> bool:
    """Whether ``node`` (of a fused body) can set the error flag: an integer power."""
    return node.prim == "pow" and node.out.dtype.kind != "f"


def _template(text):
    """A declaration's ``cuda=`` template as a rule: operands {a}, {b}, {c}; result type {t}."""
    def rule(*args, t, **_):
        return text.format(t=t, **dict(zip("abc", args)))
    return rule


# prim -> fn(*argument expressions, t=output C type, attrs) -> expression
CUDA = RuleTable("cuda", {name: _template(p.cuda) for name, p in REGISTRY.items() if p.cuda})
CUDA.update({  # expressions that depend on the type
    "div": lambda a, b, t, **_: _div(a, b, t),
    "maximum": lambda a, b, t, **_: max_expr(a, b), "minimum": lambda a, b, t, **_: min_expr(a, b),
    "mod": lambda a, b, t, **_: _mod(a, b, t), "pow": _pow,
    # NumPy's npy_floor_divide (floats only: integers floor in ``div``); float16 in float
    "floor_divide": lambda a, b, t, **_: f"_ffloordiv({a}, {b})",
})

__all__ = ["CTYPE", "CUDA", "ERR", "ERR_PARAM", "POW_MESSAGE", "PREAMBLE", "ctype", "max_expr",
           "min_expr", "needs_flag"]
