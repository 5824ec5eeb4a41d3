"""The CuPy backend: generated CUDA kernels for fused groups, cuBLAS for matmul, on an NVIDIA GPU.

* each ``fused`` node is one kernel: ``cuda_codegen.generate`` writes its source, compiled once
  per (structure, dtypes) into a ``cupy.ElementwiseKernel`` or ``cupy.ReductionKernel`` and
  cached (CuPy caches the binary per shape and device); a map-only group whose operands are
  C-ordered and broadcast as one block each runs as a raw grid-stride kernel instead
  (``cuda_raw.py``: CuPy's indexing costs half the bandwidth); ``REPLICATE_DEBUG=cuda`` prints
  them;
* ``matmul`` calls cuBLAS directly (``cuda_blas.py``: its strided-batched GEMMs on a handle of
  our own, which a CUDA graph can capture), as do the convolution primitives, whose reference
  rows (``graph/conv.py``: im2col through a strided view, one batched GEMM, col2im by strided
  adds) run here on device arrays, float16 in float32; so does a two-operand ``einsum``
  (as one ``matmul``), other ``einsum`` calls ``cupy.einsum``;
* random bits are a generated kernel of the reference's hash (``cuda_random.py``): the same bits
  as NumPy, made on the device;
* other ops run the reference rows (``graph/reference.py``) built with ``cupy`` as their array
  module, float16 operands in float32 as the reference, with device versions where a row is
  NumPy's own (the logistic, erf, einsum's path search, top-k, scatter-add — in NumPy's order,
  with no atomics: ``cupy_scatter.py``): no row ever calls
  ``numpy`` on a device array; ``local_reduce`` (the in-process combine of the replicas) is one
  of them, on the device;
* communication nodes go through the process's transport (``cupy_comm.py``): NCCL when each
  rank has its own GPU, else host-staged MPI.

Device-resident (``DEVICE``, ``cupy_device.py``): ``run`` takes host or device arrays and
returns device arrays; a step keeps its variables on the device between calls, constants are
copied up once, at lowering, and ``DEVICE.transfers`` counts every byte that crosses.
Index arrays are bounds-checked (CuPy wraps an out-of-range index around, NumPy raises): on the
host before they go up when they are batch leaves, else on the device (``cupy_index.py``); an
integer to a negative integer power sets a flag on the device (NumPy raises, a kernel cannot);
the flags of a call are read together, once, at its end.

Opt-in (``rp.CompileOptions(cuda_graph=True)``, ``REPLICATE_CUDA_GRAPH=1``): a step without
communication captured once as a CUDA graph and replayed (``cuda_graph.py``).
"""

from __future__ import annotations

import cupy  # ImportError here -> "pip install 'replicate[cuda12]'" (or cuda13)
import cupyx
import cupyx.scipy.special
import numpy as np

from .. import profile
from ..debug import debug_enabled
from ..errors import ReplicateError
from ..graph.conv import ROWS as CONV_ROWS
from ..graph.interpret import note_failure
from ..graph.primitives import REGISTRY, index_tuple
from ..graph.reference import table, uniform_bits
from . import cuda_blas, cuda_codegen, cuda_random, cuda_raw
from .base import Executable, profile_label, profiled_bytes
from .cuda_graph import replayed
from .cuda_launches import LAUNCHES
from .cuda_ops import POW_MESSAGE, needs_flag
from .cupy_comm import comm_fn
from .cupy_device import DEVICE, place, upload
from .cupy_index import IndexChecks
from .cupy_scatter import ScatterAdd
from .numpy_backend import kernels

place()  # GPU (local rank % device count)

name = "cupy"
cuda_graph_replay = True  # ``lower(graph, cuda_graph=True)``: ``CompileOptions.cuda_graph``
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


def _compile_raw(spec, how, n):
    """The raw kernel of elementwise ``spec`` for operands read as ``how`` (``cuda_raw.py``)."""
    key = (spec.key, cuda_raw.kinds(how), cuda_raw.wide(n))  # (the sizes are arguments)
    entry = _KERNELS.get(key)
    if entry is None:
        source = cuda_raw.raw_source(spec, how, n)
        if debug_enabled("cuda"):
            print(f"// {spec.name}_raw\n{source}", flush=True)
        entry = _KERNELS[key] = (cupy.RawKernel(source, f"{spec.name}_raw"), source)
    return entry


def _pow_error():
    return ValueError(POW_MESSAGE)


def _fused_fn(node, consts, index, checks):
    try:
        spec = cuda_codegen.generate(node, consts, f"replicate_fused_{index}")
    except NotImplementedError as e:  # fusion asked ``fusion_accepts``: this is a bug, not a path
        raise ReplicateError(f"internal error: fused group {node.attrs['body']} has no kernel "
                             f"({e}); please report it") from None
    kernel = _compile(spec)
    shape, dtype = node.out.shape, node.out.dtype
    # the member an error names: the group's one integer power, else the group
    powers = [n for n in node.attrs["body"].graph.nodes if needs_flag(n)]
    culprit = powers[0] if len(powers) == 1 else node

    def flag():  # the kernel's error flag, read at the call's end (NumPy raises at once)
        err = cupy.zeros((1,), cupy.int32)
        checks.add(err, culprit, _pow_error)
        return [err]

    if spec.kind == "elementwise":
        layouts: dict = {}  # the operands' (shape, strides) -> the raw launch, or None
        size = int(np.prod(shape))

        def raw_launch(ins):
            how = cuda_raw.modes(ins, shape) if size else None
            if how is None:
                return None
            raw, source = _compile_raw(spec, how, size)
            return raw, source, *cuda_raw.grid(size), tuple(cuda_raw.args(how, size, np))

        def run(*xs):
            out = cupy.empty(shape, dtype)
            ins = [xs[i] for i in spec.params]
            key = tuple((x.shape, x.strides) for x in ins)
            launch = layouts.get(key, False)
            if launch is False:
                launch = layouts[key] = raw_launch(ins)
            if launch is not None:  # read linearly: the raw kernel
                raw, source, blocks, threads, sizes = launch
                LAUNCHES.raw(spec, source)
                raw(blocks, threads, (*ins, *(flag() if spec.flag else ()), out, *sizes))
                return out
            args = [*ins, *(flag() if spec.flag else ()), out]
            LAUNCHES.elementwise(spec, args)
            kernel(*args)
            return out
        return run

    def reduce(*xs):
        args = [*(cupy.broadcast_to(xs[i], spec.red_shape) for i in spec.params),
                *(flag() if spec.flag else ())]
        LAUNCHES.reduction(spec, args, spec.axes)
        out = kernel(*args, axis=spec.axes)
        if out.shape != shape or out.dtype != dtype:  # never a silently wrong shape
            raise ReplicateError(f"internal error: fused group {node.attrs['body']} made "
                                 f"{out.dtype}{list(out.shape)}, not {dtype}{list(shape)}; "
                                 "please report it")
        return out
    return reduce


def _random_bits(key, shape, dtype, stream=0):
    """The reference's hash of (key, counter), one thread per value: the same bits as NumPy."""
    out = cupy.empty(shape, cupy.uint32)
    if out.size:
        spec = cuda_random.random_bits_spec(stream)
        LAUNCHES.elementwise(spec, (key, out))
        _compile(spec)(key, out)
    return out


def _random_uniform(key, shape, dtype, bits=None):
    """As the reference: n random bits scaled by 2**-n (``reference.uniform_bits``)."""
    n = uniform_bits(dtype) if bits is None else bits
    bits = _random_bits(key, shape, np.uint32, 2)
    work = cupy.float64 if np.dtype(dtype) == np.float64 else cupy.float32
    return ((bits >> cupy.uint32(32 - n)).astype(work) * work(1.0 / (1 << n))).astype(dtype)


_SCATTER_ADD = ScatterAdd(cupy)


def _scatter_add(g, *idx, index, shape):
    """As ``np.add.at``, in its order (``cupy_scatter.py``; ``cupyx.scatter_add``'s atomics
    would make the sums' rounding vary run to run)."""
    if idx:
        return _SCATTER_ADD(g, index_tuple(index, idx), shape)
    out = cupy.zeros(shape, g.dtype)
    out[index_tuple(index, idx)] = g  # no index arrays: no element is updated twice
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


def _remainder(a, b):
    """NumPy's float remainder (its ``npy_divmod``): ``fmod``, moved by the divisor when the
    signs differ, a zero taking the divisor's sign. CuPy's is ``a - floor(a / b) * b``, NaN
    for a finite ``a`` over an infinite ``b`` (NumPy: ``a``, or ``b`` where the signs differ).
    Integers: CuPy's, which is NumPy's (0 for a divisor of 0)."""
    if cupy.result_type(a, b).kind != "f":
        return cupy.remainder(a, b)
    r = cupy.fmod(a, b)
    r = cupy.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)
    return cupy.where(r == 0, cupy.copysign(r * 0, b), r)


def _shift(left):
    """NumPy's shift: a count outside [0, bits) gives 0 (right: -1 for a negative operand).
    CuPy's is the GPU's, which reads the count's low 32 bits (``1 << INT64_MIN`` is 1); the
    generated kernels use the same rule (``primitives.py``)."""
    def shift(a, b):
        bits = 8 * cupy.result_type(a, b).itemsize
        out = (b < 0) | (b >= bits)
        safe = cupy.where(out, 0, b).astype(b.dtype)
        if left:
            return cupy.where(out, 0, cupy.left_shift(a, safe))
        return cupy.where(out, cupy.where(a < 0, -1, 0), cupy.right_shift(a, safe))
    return shift


def _top_k(x, k):  # as the reference: a stable sort of the reversed axis, read backwards
    order = cupy.argsort(cupy.flip(x, -1), axis=-1)
    return cupy.flip(x.shape[-1] - 1 - order, -1)[..., :k]


class _BlasCupy:
    """``cupy`` with its products on cuBLAS directly (``cuda_blas.py``): the rows' ``xp``."""

    def __getattr__(self, name):
        return getattr(cupy, name)

    @staticmethod
    def matmul(a, b, out=None):
        return cuda_blas.matmul(cupy, a, b, out=out)


# every reference row with cupy as its array module; float16 operands in float32 (as IMPL)
_XP = _BlasCupy()
_ROWS = table(_XP, "cupy", {
    **{name: _widened(row(_XP)) for name, row in CONV_ROWS.items()},
    "logistic": _logistic, "erf": lambda x: cupyx.scipy.special.erf(x), "mod": _remainder,
    "left_shift": _shift(True), "right_shift": _shift(False),
    "top_k_indices": _top_k,  # CuPy's sorts are stable (kind=None), with no ``stable=``
    "sort": lambda x, axis: cupy.sort(x, axis=axis),
    "argsort": lambda x, axis: cupy.argsort(x, axis=axis),
    "matmul": lambda a, b: cuda_blas.matmul(cupy, a, b),
    "einsum": lambda *xs, subscripts: cuda_blas.einsum(cupy, subscripts, *xs),
    "random_bits": _random_bits, "random_uniform": _random_uniform,
    "scatter_add": _scatter_add,
    "const": lambda value: upload(value),  # a -0.0 kept (``cupy_device.upload``)
})
DEVICE_RULES = {name: rule if REGISTRY[name].moves or name in CONV_ROWS else _widened(rule)
                for name, rule in _ROWS.items()}


def _op_fn(node, checks):
    if REGISTRY[node.prim].host:  # communication: NCCL, or staged through the host
        return comm_fn(node, DEVICE)
    fn = DEVICE_RULES[node.prim]
    attrs, dtype = node.attrs, node.out.dtype
    if REGISTRY[node.prim].indexes and len(node.inputs) > 1:
        return checks.wrap(fn, node)  # bounds checked (CuPy wraps around, NumPy raises)
    int_pow = node.prim == "pow" and np.dtype(dtype).kind != "f"  # CuPy: 0 where NumPy raises

    def run(*xs):
        if int_pow:
            checks.add(xs[1] < 0, node, _pow_error)
        value = fn(*xs, **attrs)
        if not isinstance(value, cupy.ndarray):  # a host scalar: up bit for bit (a -0.0 too)
            value = upload(value)
        return value if value.dtype == dtype else value.astype(dtype)
    return run


def _views_of_inputs(graph, slot) -> set:
    """Slots of the values that may share memory with a graph input."""
    views = set(range(len(graph.inputs)))
    for node in graph.nodes:
        if REGISTRY[node.prim].view and slot[node.inputs[0].id] in views:
            views.add(slot[node.out.id])
    return views


def lower(graph, cuda_graph=False):
    """``cuda_graph``: replay the step as a CUDA graph where it can (``cuda_graph.py``; also
    ``REPLICATE_CUDA_GRAPH=1``)."""
    cuda_codegen.refuse_bfloat16(graph)
    producer = {n.out.id: n for n in graph.nodes}
    slot = {x.id: i for i, x in enumerate(graph.inputs)}
    template, consts, steps = [None] * len(graph.inputs), set(), []
    checks = IndexChecks(graph, cupy, DEVICE)
    for k, node in enumerate(graph.nodes):
        slot[node.out.id] = len(slot)
        if node.prim == "const":  # copied to the device once, here
            template.append(DEVICE.to_device(np.asarray(node.attrs["value"], node.out.dtype)))
            consts.add(slot[node.out.id])
            continue
        template.append(None)
        if node.prim == "fused":
            scalars = {i: producer[x.id].attrs["value"] for i, x in enumerate(node.inputs)
                       if x.id in producer and producer[x.id].prim == "const" and x.size == 1}
            fn = _fused_fn(node, scalars, k, checks)
        else:
            fn = _op_fn(node, checks)
        steps.append((fn, tuple(slot[i.id] for i in node.inputs), slot[node.out.id], node))
    n_in = len(graph.inputs)
    views = _views_of_inputs(graph, slot)
    outputs = [(slot[o.id], slot[o.id] in consts or slot[o.id] in views) for o in graph.outputs]

    def execute(env, capturing=False):  # every step, its values into ``env`` (inputs filled)
        profiler = profile.active()
        for fn, args, out, node in steps:
            label = profile_label(node) if profiler is not None else None
            start = profiler.now() if label is not None else 0
            try:
                env[out] = fn(*[env[a] for a in args])
            except Exception as e:  # name the op and the user's line that made it
                if not capturing:  # (a capture cannot read its operands: it fails as it is)
                    note_failure(e, node, [DEVICE.to_host(env[a]) for a in args])
                raise
            if label is not None:  # (synchronised: the kernel's own time, not its launch's)
                cupy.cuda.get_current_stream().synchronize()
                profiler.add(label[0], label[1], start, profiler.now(), line=label[2],
                             **profiled_bytes(label[1], [env[a] for a in args]))
        return env

    def run(inputs):
        if len(inputs) != n_in:
            raise ValueError(f"expected {n_in} inputs, got {len(inputs)}")
        checks.before(inputs)
        env = template.copy()
        env[:n_in] = [DEVICE.to_device(x) for x in inputs]
        execute(env)
        checks.after()
        # a constant, or an input (or a view of one: a variable's buffer, written in place by
        # the next commit), leaves as a copy: what is kept for the next call is never the caller's
        return [env[o].copy() if const else env[o] for o, const in outputs]

    def compute(buffers):  # the steps on device inputs, for a CUDA graph's capture
        env = template.copy()
        env[:n_in] = buffers
        return execute(env, capturing=True)

    run = replayed(cupy, graph, n_in, checks, DEVICE, compute, [o for o, _ in outputs], run,
                   cuda_graph, before_capture=lambda stream: cuda_blas.bind(cupy, stream))
    return Executable(graph, run, kernels(graph), DEVICE, DEVICE.stage)
