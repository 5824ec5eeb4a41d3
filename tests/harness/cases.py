"""The op harness's machinery: a ``Case`` (an op on replicate arrays, its plain-NumPy reference and
its inputs: shape, dtype, value domain), ``case()`` adding one to ``CASES``, and the helpers that
run a case (forward in a mode, gradient of ``sum(out * cotangent)``) and compare it with its
reference. The cases themselves are in ``ops_*.py``; ``harness.ops`` gathers them."""

from __future__ import annotations

import builtins
import zlib
from dataclasses import dataclass
from typing import Callable

import numpy as np

import replicate as rp
import replicate.numpy as rnp

F32, F64, I32, I64, BOOL = "float32", "float64", "int32", "int64", "bool"
DTYPES = (F32, F64, I32, I64, BOOL)


# -- case description -------------------------------------------------------------------------
@dataclass(frozen=True)
class In:
    """One input: shape, dtype, and the domain its values are drawn from."""

    shape: tuple
    dtype: str = F64
    # real | positive | away0 | unit | above1 | int | posint | special | index<N> | class<N> |
    # edges
    domain: str = "real"

    def sample(self, rng) -> np.ndarray:
        shape, kind = self.shape, np.dtype(self.dtype).kind
        if kind == "b":
            return rng.random(shape) < 0.5
        if self.domain.startswith("index"):  # valid indices for an axis of this size, negatives too
            n = int(self.domain[5:])
            return rng.integers(-n, n, shape).astype(self.dtype)
        if self.domain.startswith("class"):  # class labels 0 .. n-1
            return rng.integers(0, int(self.domain[5:]), shape).astype(self.dtype)
        if kind in "iu" and self.domain == "edges":  # 0, +-1, the extremes, in a fixed order
            info = np.iinfo(self.dtype)
            vals = [0, -1, 1, 7, -7, info.min, info.max] if kind == "i" else \
                [0, 1, 2, 7, info.max - 1, info.max, 3]
            return np.resize(np.array(vals, self.dtype), shape)
        if kind in "iu":
            lo, hi = {"positive": (1, 4), "posint": (1, 4), "away0": (1, 4),
                      "above1": (2, 5)}.get(self.domain, (-3, 4))
            v = rng.integers(lo, hi, shape)
            if self.domain == "away0":
                v = v * rng.choice([-1, 1], shape)
            return np.asarray(v, self.dtype)
        if self.domain == "positive":
            v = rng.uniform(0.5, 2.0, shape)
        elif self.domain == "away0":
            v = rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)
        elif self.domain == "unit":
            v = rng.uniform(-0.9, 0.9, shape)
        elif self.domain == "above1":  # arccosh's domain, away from its pole at 1
            v = rng.uniform(1.2, 3.0, shape)
        elif self.domain == "int":  # small integral values (ties for comparisons)
            v = rng.integers(-2, 3, shape).astype(float)
        elif self.domain == "special":
            v = rng.choice([0.0, 1.5, -2.0, np.inf, -np.inf, np.nan], shape)
        else:
            v = rng.standard_normal(shape)
        return np.asarray(v, self.dtype)


@dataclass
class Case:
    op: str  # the public name(s) this case covers, "+"-separated
    fn: Callable  # on replicate arrays
    ref: Callable  # on NumPy arrays
    inputs: tuple
    label: str = ""
    grad: bool = True
    rtol: float | None = None
    fd_eps: float = 1e-6
    grad_rtol: float = 1e-5
    grad_atol: float = 1e-6

    @property
    def id(self) -> str:
        shapes = ",".join(f"{np.dtype(i.dtype).name}{list(i.shape)}" for i in self.inputs)
        return f"{self.op}[{self.label}]({shapes})" if self.label else f"{self.op}({shapes})"

    def sample(self) -> list:
        rng = np.random.default_rng(zlib.crc32(self.id.encode()))
        return [i.sample(rng) for i in self.inputs]

    @property
    def float64_only(self) -> bool:
        floats = [i.dtype for i in self.inputs if np.dtype(i.dtype).kind == "f"]
        return bool(floats) and all(d == F64 for d in floats)


CASES: list[Case] = []
_IDS: set = set()


def case(op, fn, ref, *inputs, **kw) -> Case:
    c = Case(op, fn, ref, tuple(i if isinstance(i, In) else In(i) for i in inputs), **kw)
    base, k = c.label, 1
    while c.id in _IDS:  # same op and inputs, different arguments: number the variants
        k += 1
        c.label = f"{base}#{k}" if base else f"#{k}"
    _IDS.add(c.id)
    CASES.append(c)
    return c


# -- running a case -----------------------------------------------------------------------------
def leaves(out) -> list:
    return list(out) if isinstance(out, (list, tuple)) else [out]


def to_numpy(x) -> np.ndarray:
    return np.asarray(x.numpy() if hasattr(x, "numpy") else x)


def run_forward(fn, args, mode):
    if mode == "direct":
        return [to_numpy(o) for o in leaves(fn(*[rnp.asarray(a) for a in args]))]
    return [to_numpy(o) for o in leaves(rp.function(fn, mode=mode)(*args))]


def tolerance(dtype, rtol=None):
    if np.dtype(dtype).kind != "f":
        return 0.0, 0.0
    if np.dtype(dtype) == np.float32:
        return rtol or 1e-5, 1e-6
    return rtol or 1e-10, 1e-12


def assert_same(actual, expected, rtol=None, what=""):
    assert len(actual) == len(expected), what
    for a, e in zip(actual, expected):
        e = np.asarray(e)
        assert a.shape == e.shape, f"{what}: shape {a.shape} != NumPy's {e.shape}"
        assert a.dtype == e.dtype, f"{what}: dtype {a.dtype} != NumPy's {e.dtype}"
        r, t = tolerance(e.dtype, rtol)
        np.testing.assert_allclose(a, e, rtol=r, atol=t, err_msg=what)


def float_inputs(xs) -> list[int]:
    return [i for i, x in enumerate(xs) if x.dtype.kind == "f"]


def reference_loss(ref, xs, cots) -> float:
    return builtins.sum(float(np.sum(np.asarray(o, np.float64) * c))
                        for o, c in zip(leaves(ref(*xs)), cots))


def finite_differences(loss, xs, wrt, eps) -> list[np.ndarray]:
    """Central differences of the scalar ``loss(xs)`` w.r.t. each ``xs[i]`` for i in ``wrt``."""
    grads = []
    for i in wrt:
        g = np.zeros(xs[i].shape)
        for k in np.ndindex(xs[i].shape):
            plus = [x.copy() for x in xs]
            minus = [x.copy() for x in xs]
            plus[i][k] += eps
            minus[i][k] -= eps
            g[k] = (loss(plus) - loss(minus)) / (2 * eps)
        grads.append(g)
    return grads


def cotangents(c: Case, xs) -> list[np.ndarray]:
    rng = np.random.default_rng(zlib.crc32(("cot" + c.id).encode()))
    return [rng.standard_normal(np.shape(o)) for o in leaves(c.ref(*xs))]


def loss_of(c: Case, cots):
    def loss(*args):
        return builtins.sum(rnp.sum(o * ct) for o, ct in zip(leaves(c.fn(*args)), cots))

    return loss


def library_grad(c: Case, xs, cots, mode) -> list[np.ndarray]:
    wrt = float_inputs(xs)
    loss = loss_of(c, cots)

    def f(*args):
        return rp.grad(loss(*args), [args[i] for i in wrt])

    return [to_numpy(g) for g in rp.function(f, mode=mode)(*xs)]
