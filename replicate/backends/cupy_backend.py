"""The CuPy backend: generated CUDA kernels for fused groups, cuBLAS for matmul, on an NVIDIA GPU.

* each ``fused`` node is one kernel: ``cuda_codegen.generate`` writes its source, compiled once
  per (structure, dtypes) into a ``cupy.ElementwiseKernel`` or ``cupy.ReductionKernel`` and
  cached (CuPy caches the binary per shape and device); ``REPLICATE_DEBUG=cuda`` prints it;
* ``matmul``/``einsum`` call cuBLAS through ``cupy.matmul``/``cupy.einsum``; so do the
  convolution primitives, whose reference rows (``graph/conv.py``: im2col through a strided view,
  one batched GEMM, col2im by strided adds) run here on device arrays, float16 in float32;
* other ops run the reference rows (``graph/reference.py``) built with ``cupy`` as their array
  module, float16 operands in float32 as the reference, with device versions where a row is
  NumPy's own (the logistic, erf, einsum's path search, top-k, scatter-add, random numbers): no
  row ever calls ``numpy`` on a device array;
* communication nodes run on the host: their inputs come back from the device, their results go
  up again (host-staged MPI; NCCL is not wired in).

Inputs and outputs are host NumPy arrays, as for every backend; they are copied to and from the
device on each call.
"""

from __future__ import annotations

import cupy  # ImportError here -> "pip install 'replicate[cuda12]'" (or cuda13)
import cupyx
import cupyx.scipy.special
import numpy as np

from ..debug import debug_enabled
from ..errors import ReplicateError
from ..graph.conv import ROWS as CONV_ROWS
from ..graph.index_check import index_bounds_error
from ..graph.interpret import note_failure
from ..graph.primitives import REGISTRY, index_tuple
from ..graph.reference import IMPL, MOVES, table
from . import cuda_codegen
from .base import Executable
from .numpy_backend import kernels

try:
    _DEVICES = cupy.cuda.runtime.getDeviceCount()
except Exception:  # no driver, or no device
    _DEVICES = 0
if not _DEVICES:
    raise ReplicateError("the 'cupy' backend needs an NVIDIA GPU; CuPy sees none here (CuPy "
                         "for CUDA 12: pip install 'replicate[cuda12]', for CUDA 13: "
                         "'replicate[cuda13]')")

name = "cupy"
passes = ("const_fold", "cse", "dce", "bucketing", "fusion")  # CuPy's pool manages memory
fusion_accepts = cuda_codegen.accepts  # only groups that become one generated kernel

_KERNELS: dict = {}


def _compile(spec):
    kernel = _KERNELS.get(spec.key)
    if kernel is None:
        if debug_enabled("cuda"):
            print(f"// {spec.name}\n{cuda_codegen.standalone_source(spec)}", flush=True)
        cls, args, kwargs = cuda_codegen.kernel_args(spec)
        kernel = _KERNELS[spec.key] = getattr(cupy, cls)(*args, **kwargs)
    return kernel


def _fused_fn(node, consts, index):
    try:
        spec = cuda_codegen.generate(node, consts, f"replicate_fused_{index}")
    except NotImplementedError as e:  # fusion asked ``fusion_accepts``: this is a bug, not a path
        raise ReplicateError(f"internal error: fused group {node.attrs['body']} has no kernel "
                             f"({e}); please report it") from None
    kernel = _compile(spec)
    shape, dtype = node.out.shape, node.out.dtype
    if spec.kind == "elementwise":
        def run(*xs):
            out = cupy.empty(shape, dtype)
            kernel(*[xs[i] for i in spec.params], out)
            return out
        return run

    def reduce(*xs):
        args = [cupy.broadcast_to(xs[i], spec.red_shape) for i in spec.params]
        out = kernel(*args, axis=spec.axes)
        if out.shape != shape or out.dtype != dtype:  # never a silently wrong shape
            raise ReplicateError(f"internal error: fused group {node.attrs['body']} made "
                                 f"{out.dtype}{list(out.shape)}, not {dtype}{list(shape)}; "
                                 "please report it")
        return out
    return reduce


def _random_bits(key, shape, dtype, stream=0):
    return cupy.asarray(IMPL["random_bits"](cupy.asnumpy(key), shape, dtype, stream))


def _random_uniform(key, shape, dtype):
    return cupy.asarray(IMPL["random_uniform"](cupy.asnumpy(key), shape, dtype))


def _scatter_add(g, *idx, index, shape):
    out = cupy.zeros(shape, g.dtype)
    cupyx.scatter_add(out, index_tuple(index, idx), g)
    return out


def _widened(fn):
    """float16 operands computed in float32 (one rounding, as the reference)."""
    def run(*xs, **attrs):
        if any(getattr(x, "dtype", None) == np.float16 for x in xs):
            xs = [x.astype(cupy.float32) if getattr(x, "dtype", None) == np.float16 else x
                  for x in xs]
        return fn(*xs, **attrs)
    return run


def _logistic(x):
    """The reference's stable 1 / (1 + exp(-x)): exp(min(x, 0)) / (1 + exp(-|x|))."""
    return cupy.exp(cupy.minimum(x, 0)) / (1 + cupy.exp(-cupy.abs(x)))


def _top_k(x, k):  # as the reference: a stable sort of the reversed axis, read backwards
    order = cupy.argsort(cupy.flip(x, -1), axis=-1)
    return cupy.flip(x.shape[-1] - 1 - order, -1)[..., :k]


# every reference row with cupy as its array module; float16 operands in float32 (as IMPL)
_ROWS = table(cupy, "cupy", {
    **{name: _widened(row(cupy)) for name, row in CONV_ROWS.items()},
    "logistic": _logistic, "erf": lambda x: cupyx.scipy.special.erf(x),
    "top_k_indices": _top_k,  # CuPy's sorts are stable (kind=None), with no ``stable=``
    "sort": lambda x, axis: cupy.sort(x, axis=axis),
    "argsort": lambda x, axis: cupy.argsort(x, axis=axis),
    "matmul": lambda a, b: cupy.matmul(a, b),
    "einsum": lambda *xs, subscripts: cupy.einsum(subscripts, *xs),
    "random_bits": _random_bits, "random_uniform": _random_uniform,
    "scatter_add": _scatter_add,
    "const": lambda value: cupy.asarray(value),
})
DEVICE = {name: rule if name in MOVES or name in CONV_ROWS else _widened(rule)
          for name, rule in _ROWS.items()}


def _op_fn(node):
    if REGISTRY[node.prim].host:  # host-staged communication
        fn, attrs = IMPL[node.prim], node.attrs
        if node.prim == "comm_start":
            return lambda x: fn(cupy.asnumpy(x), **attrs)
        if node.prim == "comm_wait":
            return lambda h: cupy.asarray(fn(h, **attrs))
        return lambda *xs: cupy.asarray(fn(*[cupy.asnumpy(x) for x in xs], **attrs))
    fn = DEVICE[node.prim]
    attrs, dtype = node.attrs, node.out.dtype
    if node.prim in ("getitem", "scatter_add") and len(node.inputs) > 1:
        return _checked_indexing(fn, attrs, dtype, node)

    def run(*xs):
        value = cupy.asarray(fn(*xs, **attrs))
        return value if value.dtype == dtype else value.astype(dtype)
    return run


def _checked_indexing(fn, attrs, dtype, node):
    """CuPy wraps an out-of-range index around (NumPy raises): check the index arrays first
    (one reduction and one read on the host per op) and raise NumPy's ``IndexError``."""
    shape = node.inputs[0].shape if node.prim == "getitem" else attrs["shape"]

    def run(x, *idx):
        message = index_bounds_error(shape, attrs["index"], idx, cupy)
        if message is not None:
            raise IndexError(message)
        value = cupy.asarray(fn(x, *idx, **attrs))
        return value if value.dtype == dtype else value.astype(dtype)
    return run


def lower(graph):
    cuda_codegen.refuse_bfloat16(graph)
    producer = {n.out.id: n for n in graph.nodes}
    slot = {x.id: i for i, x in enumerate(graph.inputs)}
    steps = []
    for k, node in enumerate(graph.nodes):
        if node.prim == "fused":
            consts = {i: producer[x.id].attrs["value"] for i, x in enumerate(node.inputs)
                      if x.id in producer and producer[x.id].prim == "const" and x.size == 1}
            fn = _fused_fn(node, consts, k)
        else:
            fn = _op_fn(node)
        slot[node.out.id] = len(slot)
        steps.append((fn, tuple(slot[i.id] for i in node.inputs), slot[node.out.id], node))
    n_in, n_slots = len(graph.inputs), len(slot)
    outputs = [slot[o.id] for o in graph.outputs]

    def run(inputs):
        env = [cupy.asarray(x) for x in inputs] + [None] * (n_slots - n_in)
        for fn, args, out, node in steps:
            try:
                env[out] = fn(*[env[a] for a in args])
            except Exception as e:  # name the op and the user's line that made it
                note_failure(e, node, [cupy.asnumpy(env[a]) for a in args])
                raise
        return [cupy.asnumpy(env[o]) for o in outputs]

    return Executable(graph, run, kernels(graph))
