"""The NumPy backend: the reference, and the embedded default.

``lower`` turns the optimised graph into a flat list of steps run by one loop. Fused groups,
elementwise ops, reductions and matmuls write into buffers that the memory plan
(``numpy_memory.py``) allocated once, with ``out=`` — inside a fused group too, where the
intermediate values of a chain share a scratch buffer in place — so a step makes no per-op
temporaries where NumPy allows it. Everything else calls the reference table ``IMPL``. An
elementwise primitive whose reference is a NumPy ufunc writes with ``out=`` without being listed
here.
"""

from __future__ import annotations

import numpy as np

from .. import profile
from ..graph.interpret import note_failure
from ..graph.passes import Pass
from ..graph.primitives import REGISTRY, SOURCE
from ..graph.reference import IMPL, _logistic_np, stack_folds
from .base import Executable, kernel_name, profile_label, profiled_bytes
from .numpy_memory import memory, plan_memory

name = "numpy"
passes = ("const_fold", "cse", "dce", "bucketing", "widen", "fusion")
# after those: the memory plan (buffers allocated once, reused every call)
own_passes = (Pass("memory", lambda g, c: memory(g, writes_out)),)


def _rsqrt(x, out):
    np.sqrt(x, out=out)
    return np.divide(1.0, out, out=out)


_BITS = {1: (np.int8, np.uint8), 2: (np.int16, np.uint16), 4: (np.int32, np.uint32),
         8: (np.int64, np.uint64)}


def _select(c, a, b, out):
    """``where(c, a, b)`` into ``out`` by bits: ``((a ^ b) & mask) ^ b`` on the values' bit
    patterns, the mask all ones where ``c``. Every value's bits are kept (-0.0, NaN payloads)
    and there is no branch per element: NumPy's masked copy (``copyto(where=)``, ``np.where``)
    branches per element and is 5-15x slower on a mask with no pattern (a ReLU's). Safe when
    ``out`` is ``a``, ``b`` or ``c`` (the memory plan may write in place)."""
    a, b = np.asarray(a), np.asarray(b)
    kinds = _BITS.get(out.dtype.itemsize)
    in_a, in_b = np.may_share_memory(out, a), np.may_share_memory(out, b)
    if kinds is None or a.dtype != out.dtype or b.dtype != out.dtype or (in_a and in_b):
        np.copyto(out, a, where=c)  # (a masked copy: right whatever out shares)
        np.copyto(out, b, where=np.logical_not(c))
        return out
    signed, bits = kinds
    mask = np.empty(out.shape, signed)
    if b.ndim == 0 and not b.view(bits):  # b is +0 (a ReLU, its gradient): a & mask
        np.subtract(0, c, out=mask, dtype=signed)
        np.bitwise_and(a.view(bits), mask.view(bits), out=out.view(bits))
        return out
    if a.ndim == 0 and not a.view(bits):  # a is +0: b & ~mask
        np.subtract(c, 1, out=mask, dtype=signed)
        np.bitwise_and(b.view(bits), mask.view(bits), out=out.view(bits))
        return out
    if in_b:  # keep a: ((a ^ b) & ~mask) ^ a, the mask all ones where not c
        np.subtract(c, 1, out=mask, dtype=signed)
        keep = a.view(bits)
    else:
        np.subtract(0, c, out=mask, dtype=signed)
        keep = b.view(bits)
    o = out.view(bits)
    np.bitwise_xor(a.view(bits), b.view(bits), out=o)
    np.bitwise_and(o, mask.view(bits), out=o)
    np.bitwise_xor(o, keep, out=o)
    return out


def _cast(x, out, dtype):
    np.copyto(out, x, casting="unsafe")
    return out


def _div(a, b, out):
    if out.dtype.kind == "f":
        return np.true_divide(a, b, out=out)
    return np.floor_divide(a, b, out=out)


def _matmul(a, b, out):
    if out.flags.c_contiguous and stack_folds(a, b):  # one BLAS call over the stack's rows
        np.matmul(a.reshape(-1, a.shape[-1]), b, out=out.reshape(-1, out.shape[-1]))
        return out
    return np.matmul(a, b, out=out)


def _reduction(ufunc):
    def run(x, out, axes):
        return ufunc.reduce(x, axis=axes, out=out)
    return run


# elementwise primitives that can write into a given buffer: fn(*inputs, out=buffer, **attrs):
# every one whose reference is a ufunc, and these
# (the reference rows unwrapped: the ``widen`` pass leaves no float16/bfloat16 arithmetic here)
OUT_UFUNCS = {name: fn for name, fn in ((n, getattr(f, "__wrapped__", f)) for n, f in IMPL.items())
              if isinstance(fn, np.ufunc) and name in REGISTRY and REGISTRY[name].elementwise}
OUT_UFUNCS.update({"rsqrt": _rsqrt, "select": _select, "cast": _cast, "div": _div,
                   "logistic": _logistic_np})
OUT_OTHER = {
    "reduce_sum": _reduction(np.add), "reduce_prod": _reduction(np.multiply),
    "reduce_max": _reduction(np.maximum), "reduce_min": _reduction(np.minimum),
    "matmul": lambda a, b, out: _matmul(a, b, out),
    "concatenate": lambda *xs, axis, out: np.concatenate(xs, axis=axis, out=out),
}


writes_out = frozenset(OUT_UFUNCS) | frozenset(OUT_OTHER) | {"fused"}  # for memory planning


def _out_fn(node):
    fn = OUT_UFUNCS.get(node.prim) or OUT_OTHER.get(node.prim)
    if fn is None:
        return None
    attrs = node.attrs
    if attrs:
        return lambda *xs, out: fn(*xs, out=out, **attrs)
    return fn


def _plain_fn(node):
    fn, attrs, dtype = IMPL[node.prim], node.attrs, node.out.dtype
    if REGISTRY[node.prim].host:  # communication: its value may be a handle, not an array
        def host(*xs):
            value = fn(*xs, **attrs)
            if isinstance(value, np.ndarray) and value.dtype != dtype:
                value = value.astype(dtype)
            return value
        return host

    def run(*xs):
        value = fn(*xs, **attrs)
        if type(value) is not np.ndarray:
            value = np.asarray(value)
        return value if value.dtype == dtype else value.astype(dtype)
    return run


def _in_place(*xs, out):
    return out


def _program(graph, plan, buffers):
    """Steps ``(fn, input slots, output slot, buffer or None)`` over an environment list."""
    slot = {x.id: i for i, x in enumerate(graph.inputs)}
    steps = []
    for node in graph.nodes:
        args = tuple(slot[i.id] for i in node.inputs)
        slot[node.out.id] = len(slot)
        b = plan.slot.get(node.out.id)
        part = plan.part.get(node.out.id)
        if part is not None:  # written straight into its part of a concatenation's buffer
            i, offset, shape = part
            size = int(np.prod(shape))
            buf = buffers[i][offset:offset + size].reshape(shape)
            fn = _fused_runner(node) if node.prim == "fused" else _out_fn(node)
            steps.append((fn, args, slot[node.out.id], buf, True))
        elif node.out.id in plan.done:  # its parts are in place already: nothing to copy
            steps.append((_in_place, args, slot[node.out.id], buffers[b], True))
        elif node.prim == "fused":
            steps.append((_fused_runner(node), args, slot[node.out.id],
                          None if b is None else buffers[b], True))
        elif b is not None:
            steps.append((_out_fn(node), args, slot[node.out.id], buffers[b], True))
        else:
            steps.append((_plain_fn(node), args, slot[node.out.id], None, False))
    return steps, slot


CHUNK = 1 << 14  # elements per block of a cache-blocked elementwise group (64 KiB of float32)


def _fused_runner(node):
    """Run a fused group's body: each op writes into a scratch buffer planned for the body, the
    last one into the group's output buffer. A large group of elementwise ops only, whose inputs
    are whole arrays of its shape or single values, runs block by block instead (``_blocked``):
    its intermediates stay in the cache, as in a generated kernel."""
    whole = _whole_runner(node)
    blocked = _blocked_runner(node)
    if blocked is None:
        return whole
    size = node.out.size

    def run(*xs, out=None):
        if all(x.size == 1 or (x.size == size and x.flags.c_contiguous) for x in xs):
            return blocked(*xs, out=out)
        return whole(*xs, out=out)
    return run


def _blocked_runner(node):
    body = node.attrs["body"].graph
    final = body.nodes[-1]
    shape, dtype, size = node.out.shape, node.out.dtype, node.out.size
    if size < 4 * CHUNK or node.attrs["body"].reduction is not None or \
            not (final.prim in OUT_UFUNCS or final.prim in OUT_OTHER):
        return None
    for n in body.nodes:
        if n.prim != "const" and (not REGISTRY[n.prim].elementwise or n.out.shape != shape):
            return None
    plan = plan_memory(body, writes_out)
    scratch = [np.empty(CHUNK if s == shape else s, d) for s, d in plan.buffers]
    steps, slot = _program(body, plan, scratch)
    programs = {CHUNK: steps}  # the body's steps on blocks of m elements (m < CHUNK: the tail)

    def program(m):
        if m not in programs:
            bufs = [b[:m] if b.shape == (CHUNK,) else b for b in scratch]
            programs[m] = _program(body, plan, bufs)[0]
        return programs[m]
    n_in, n_slots = len(body.inputs), len(slot)
    last_fn = _out_fn(final)

    def run(*xs, out=None):
        if out is None:
            out = np.empty(shape, dtype)
        flat = [x.reshape(-1) if x.size == size else x.reshape(()) for x in xs]
        dest = out.reshape(-1)
        env = [None] * n_slots
        for lo in range(0, size, CHUNK):
            hi = min(lo + CHUNK, size)
            steps = program(hi - lo)
            env[:n_in] = [x[lo:hi] if x.ndim else x for x in flat]
            for fn, args, o, buf, takes_out in steps[:-1]:
                env[o] = fn(*[env[a] for a in args], out=buf) if takes_out else \
                    fn(*[env[a] for a in args])
            last_fn(*[env[a] for a in steps[-1][1]], out=dest[lo:hi])
        return out
    return run


def _whole_runner(node):
    body = node.attrs["body"].graph
    plan = plan_memory(body, writes_out)
    scratch = [np.empty(shape, dtype) for shape, dtype in plan.buffers]
    steps, slot = _program(body, plan, scratch)
    n_in, n_slots, result = len(body.inputs), len(slot), slot[body.outputs[0].id]
    final = body.nodes[-1]
    last_fn = _out_fn(final) if final.prim in OUT_UFUNCS or final.prim in OUT_OTHER else None
    head = steps[:-1]
    last_args = steps[-1][1]
    dtype, shape = node.out.dtype, node.out.shape

    def run(*xs, out=None):
        env = list(xs) + [None] * (n_slots - n_in)
        for fn, args, o, buf, takes_out in head:
            env[o] = fn(*[env[a] for a in args], out=buf) if takes_out else \
                fn(*[env[a] for a in args])
        ins = [env[a] for a in last_args]
        if last_fn is not None:  # the last op writes the result itself (fresh if not planned)
            return last_fn(*ins, out=np.empty(shape, dtype) if out is None else out)
        env[result] = steps[-1][0](*ins, out=steps[-1][3]) if steps[-1][4] else steps[-1][0](*ins)
        value = env[result]
        if out is not None:
            np.copyto(out, value, casting="unsafe")
            return out
        return np.array(value, dtype=dtype)  # a fresh array: scratch is reused next call
    return run


def lower(graph):
    """Return an ``Executable`` for ``graph`` (inputs and outputs are NumPy arrays)."""
    # without the memory pass, only the ops that cannot do without a buffer get one
    plan = graph.meta.memory_plan or plan_memory(graph, frozenset(OUT_OTHER) | {"fused"})
    buffers = [np.empty(shape, dtype) for shape, dtype in plan.buffers]
    steps, slot = _program(graph, plan, buffers)
    n_inputs, n_slots = len(graph.inputs), len(slot)
    outputs = [slot[o.id] for o in graph.outputs]

    labels = None  # (name, kind, line) per step, made when a profiler first asks

    def run(inputs):
        nonlocal labels
        if len(inputs) != n_inputs:
            raise ValueError(f"expected {n_inputs} inputs, got {len(inputs)}")
        env = list(inputs) + [None] * (n_slots - n_inputs)
        profiler = profile.active()
        if profiler is not None:
            labels = labels or [profile_label(node) for node in graph.nodes]
        i = 0
        try:
            for i, (fn, args, out, buf, takes_out) in enumerate(steps):  # noqa: B007 (i: read on failure)
                if profiler is not None and labels[i] is not None:
                    start = profiler.now()
                if takes_out:
                    env[out] = fn(*[env[a] for a in args], out=buf)
                else:
                    env[out] = fn(*[env[a] for a in args])
                if profiler is not None and labels[i] is not None:
                    name, kind, line = labels[i]
                    profiler.add(name, kind, start, profiler.now(), line=line,
                                 **profiled_bytes(kind, [env[a] for a in args]))
        except Exception as e:  # name the node and the user's line that made it
            node = graph.nodes[i]
            note_failure(e, node, [env[a] for a in steps[i][1]])
            raise
        return [env[o] for o in outputs]

    return Executable(graph, run, kernels(graph))


def kernels(graph) -> list[str]:
    """What a call launches: one entry per fused group or compute op (views, constants and
    communication are not kernels)."""
    return [kernel_name(node) for node in graph.nodes
            if not (REGISTRY[node.prim].kind == SOURCE or REGISTRY[node.prim].host
                    or REGISTRY[node.prim].alias)]  # (an alias is never a copy)
