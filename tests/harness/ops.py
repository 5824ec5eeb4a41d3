"""The op harness: every public op of ``replicate.numpy`` described as ``Case``s (in the spirit
of ``chainer.testing``): the op on replicate arrays, a plain-NumPy reference, and the inputs
(shape, dtype, value domain); with the helpers that run a case and compare it with its reference.

``tests/api/test_ops.py`` checks every case (forward in every mode, gradients, gradients of
gradients); ``test_ops_low_precision.py`` runs them in bfloat16 and float16, and
``test_backend_parity.py`` on every backend against the NumPy one.
"""

from __future__ import annotations

import builtins

import numpy as np

import replicate.numpy as rnp

# each table module adds its cases to CASES when imported: elementwise, structure, windows,
# everyday (which imports the two before it for their helpers), numpy_rest
from . import (  # noqa: F401
    ops_elementwise,
    ops_everyday,
    ops_numpy_rest,
    ops_structure,
    ops_windows,
)
from .cases import (
    CASES,
    F32,
    F64,
    Case,
    In,
    assert_same,
    cotangents,
    finite_differences,
    float_inputs,
    leaves,
    library_grad,
    loss_of,
    reference_loss,
    run_forward,
    to_numpy,
    tolerance,
)
from .ops_elementwise import BINARY
from .ops_structure import REDUCTIONS, axis_op

__all__ = ["BINARY", "CASES", "EXPECTED", "F32", "F64", "GG_CASES", "GRAD_CASES", "LOGITS",
           "REDUCTIONS", "Case", "In", "assert_same", "axis_op", "cotangents", "draws",
           "finite_differences", "float_inputs", "leaves", "library_grad", "loss_of",
           "reference_loss", "run_forward", "to_numpy", "tolerance"]


def differentiable(c: Case) -> bool:
    """Float64 inputs, floating-point outputs, and not excluded by the case."""
    if not (c.grad and c.float64_only):
        return False
    return all(np.asarray(o).dtype.kind == "f" for o in leaves(c.ref(*c.sample())))


GRAD_CASES = [c for c in CASES if differentiable(c)]


GRAD_OF_GRAD = {"exp", "log", "tanh", "sigmoid", "softplus", "sin", "cos", "sqrt", "rsqrt",
                "multiply", "divide", "power", "matmul", "einsum", "logsumexp", "var", "std",
                "prod", "getitem", "take", "where", "conv2d", "max_pool2d", "avg_pool2d",
                "concatenate", "pad", "maximum", "reciprocal", "abs", "expm1", "log1p",
                "broadcast_to", "mean", "max", "erf", "mod", "cumsum", "cumprod", "sort",
                "top_k", "flip", "roll", "repeat", "tile", "conv_transpose2d", "conv2d_input_grad",
                "conv2d_weight_grad", "tan", "sinh", "arcsin", "arctan", "arccosh", "arctanh",
                "log2", "arctan2", "logaddexp"}


def _pick_gg():
    picked, seen = [], {}
    for c in GRAD_CASES:
        n = seen.get(c.op, 0)
        size = builtins.sum(np.prod(i.shape) for i in c.inputs)
        if c.op in GRAD_OF_GRAD and n < 2 and size <= 30:
            picked.append(c)
            seen[c.op] = n + 1
    return picked


GG_CASES = _pick_gg()


def draws(k, logits):
    a, b = rnp.random.split(k)
    three = rnp.random.split(b, 3)
    return {
        "uniform": rnp.random.uniform(a, (3, 4)),
        "uniform64": rnp.random.uniform(k, (5,), dtype=np.float64, minval=-2.0, maxval=3.0),
        "normal": rnp.random.normal(three[0], (2, 3)),
        "normal0d": rnp.random.normal(three[1]),
        "bernoulli": rnp.random.bernoulli(three[2], 0.3, (6,)),
        "bernoulli_p": rnp.random.bernoulli(a, rnp.asarray([0.1, 0.9, 0.5])),
        "categorical": rnp.random.categorical(b, logits),
        "categorical0": rnp.random.categorical(a, logits, axis=0),
        "split": three,
        "fold_in": rnp.random.fold_in(k, 7),
    }


LOGITS = np.log(np.array([[0.2, 0.5, 0.3], [0.6, 0.1, 0.3]]))
EXPECTED = {"uniform": ((3, 4), np.float32), "uniform64": ((5,), np.float64),
            "normal": ((2, 3), np.float32), "normal0d": ((), np.float32),
            "bernoulli": ((6,), np.bool_), "bernoulli_p": ((3,), np.bool_),
            "categorical": ((2,), np.int64), "categorical0": ((3,), np.int64),
            "split": ((3, 2), np.uint32), "fold_in": ((2,), np.uint32)}
