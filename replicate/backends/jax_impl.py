"""JAX lowering of every primitive that runs on the device (all but the collectives).

Each rule takes JAX (or, for constants, NumPy) arrays and the node's attributes and returns a JAX
array; ``jax_backend`` casts the result to the node's dtype where JAX's promotion differs from
the IR's (a sum of bools, say). The NumPy table ``IMPL`` is the reference semantics; where JAX
differs by default it is told to match it: integer ``div`` floors, matmuls run at full precision
(no TF32 on GPUs), random numbers come from the same counter-based hash, bit for bit.

>>> import numpy as np
>>> from replicate.backends.jax_impl import JAX
>>> np.asarray(JAX["div"](np.array([7, -7]), np.array([2, 2]))).tolist()
[3, -4]
"""

from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)  # the library computes in float64 a lot

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

from ..graph.primitives import COLLECTIVE, REGISTRY, index_tuple  # noqa: E402
from .numpy_impl import RuleTable  # noqa: E402

# the NumPy reference multiplies in full float32/float64; so do we (XLA may pick TF32 on GPUs)
PRECISION = lax.Precision.HIGHEST


def _div(a, b):
    if jnp.issubdtype(jnp.result_type(a), jnp.floating):
        return jnp.true_divide(a, b)
    return jnp.floor_divide(a, b)


def _getitem(x, *idx, index):
    return jnp.asarray(x)[index_tuple(index, idx)]


def _scatter_add(g, *idx, index, shape):
    return jnp.zeros(shape, jnp.result_type(g)).at[index_tuple(index, idx)].add(g)


# -- the counter-based random numbers of numpy_impl, in uint32 JAX ops --------------------------
_U32 = jnp.uint32


def _fmix(h):
    h = h ^ (h >> _U32(16))
    h = h * _U32(0x85EBCA6B)
    h = h ^ (h >> _U32(13))
    h = h * _U32(0xC2B2AE35)
    return h ^ (h >> _U32(16))


def random_bits_jax(key, size, stream):
    key = jnp.asarray(key).astype(_U32)
    k0, k1 = key[0], key[1]
    c = jnp.arange(size, dtype=_U32)
    h = _fmix(c * _U32(0x9E3779B9) + k0 + _U32((stream * 0x632BE5AB) & 0xFFFFFFFF))
    h = _fmix(h ^ k1)
    return _fmix(h + (k0 ^ _U32(0x5BD1E995)))


def _random_bits(key, shape, dtype, stream=0):
    return random_bits_jax(key, int(np.prod(shape, dtype=np.int64)), stream).reshape(shape)


def _random_uniform(key, shape, dtype):
    bits = _random_bits(key, shape, np.uint32, 2)
    # 24 random bits scaled by 2**-24 are exact in float32, so no float64 is needed on the way
    work = jnp.float64 if np.dtype(dtype) == np.float64 else jnp.float32
    return ((bits >> _U32(8)).astype(work) * work(1.0 / (1 << 24))).astype(dtype)


def _fused(*xs, body):
    """A fused group (from the NumPy pipeline's fusion pass): its body, op by op; XLA fuses."""
    graph = body.graph
    env = {x.id: v for x, v in zip(graph.inputs, xs)}
    for node in graph.nodes:
        env[node.out.id] = apply(node, [env[i.id] for i in node.inputs])
    return env[graph.outputs[0].id]


def apply(node, args):
    """Run ``node``'s rule on ``args``, with the result in the node's dtype."""
    value = JAX[node.prim](*args, **node.attrs)
    dtype = node.out.aval.dtype
    if value.dtype != dtype:
        value = value.astype(dtype)
    return value


JAX = RuleTable("jax", {
    "neg": jnp.negative, "abs": jnp.abs, "sign": jnp.sign, "exp": jnp.exp, "log": jnp.log,
    "log1p": jnp.log1p, "expm1": jnp.expm1, "sqrt": jnp.sqrt,
    "rsqrt": lambda x: 1.0 / jnp.sqrt(x), "tanh": jnp.tanh, "logistic": jax.nn.sigmoid,
    "sin": jnp.sin, "cos": jnp.cos,
    "add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "div": _div, "pow": jnp.power,
    "maximum": jnp.maximum, "minimum": jnp.minimum,
    "eq": jnp.equal, "ne": jnp.not_equal, "lt": jnp.less, "le": jnp.less_equal,
    "gt": jnp.greater, "ge": jnp.greater_equal, "logical_and": jnp.logical_and,
    "logical_or": jnp.logical_or, "logical_not": jnp.logical_not,
    "select": jnp.where,
    "cast": lambda x, dtype: jnp.asarray(x).astype(dtype),
    "stop_gradient": jnp.asarray,  # JAX never differentiates here: the IR has the gradient
    "reduce_sum": lambda x, axes: jnp.sum(x, axis=axes),
    "reduce_prod": lambda x, axes: jnp.prod(x, axis=axes),
    "reduce_max": lambda x, axes: jnp.max(x, axis=axes),
    "reduce_min": lambda x, axes: jnp.min(x, axis=axes),
    "argmax": lambda x, axis: jnp.argmax(x, axis=axis),
    "argmin": lambda x, axis: jnp.argmin(x, axis=axis),
    "reshape": lambda x, shape: jnp.reshape(x, shape),
    "transpose": lambda x, perm: jnp.transpose(x, perm),
    "broadcast_to": lambda x, shape: jnp.broadcast_to(x, shape),
    "concatenate": lambda *xs, axis: jnp.concatenate(xs, axis=axis),
    "pad": lambda x, widths, value: jnp.pad(x, widths, constant_values=value),
    "getitem": _getitem,
    "scatter_add": _scatter_add,
    "matmul": lambda a, b: jnp.matmul(a, b, precision=PRECISION),
    "einsum": lambda *xs, subscripts: jnp.einsum(subscripts, *xs, precision=PRECISION),
    "random_bits": _random_bits,
    "random_uniform": _random_uniform,
    "const": lambda value: value,  # a NumPy array: a literal in the compiled code
})
if "fused" in REGISTRY:  # groups made by the NumPy pipeline's fusion pass, should one come here
    JAX["fused"] = _fused


def missing_rules() -> list[str]:
    """Primitives that run on the device but have no JAX rule (the table test checks it)."""
    return [f"no jax rule for {name}" for name, prim in sorted(REGISTRY.items())
            if prim.kind != COLLECTIVE and name not in JAX]


__all__ = ["JAX", "PRECISION", "apply", "missing_rules", "random_bits_jax"]
