"""CUDA code generation for fused groups (used by the CuPy backend; needs neither CuPy nor a GPU).

Each fused group becomes one kernel:

* a map-only group: the ``operation`` of a ``cupy.ElementwiseKernel`` — one ``const`` statement per
  op, in the group's order, over inputs that CuPy broadcasts to the output's shape;
* a group with a reduction: a ``cupy.ReductionKernel`` whose ``map_expr`` calls a generated device
  function for the prologue, whose ``reduce_expr``/``identity`` come from the reduction, and whose
  ``post_map_expr`` calls a device function for the epilogue (the epilogue reads only the reduced
  value and constants: ``accepts`` tells the fusion pass so, and constants are inlined as
  literals).

The per-primitive CUDA expressions are a rule table (``CUDA``, ``cuda_ops.py``) built from the
primitives' declarations (``cuda=`` templates) plus the few whose expression depends on the
type, checked for completeness with the other tables. A group holding an integer power has an
error flag (a last ``raw int32`` input) that a negative exponent sets: NumPy raises there.
``standalone_source`` wraps a kernel into a complete ``.cu`` translation unit so the code can be
compiled with ``nvcc`` where a CUDA toolkit exists, without a GPU.

What CuPy expects of the pieces (each checked in ``tests/backends/test_cuda_codegen.py`` by building
the kernels through CuPy's own machinery and compiling them with NVRTC, no GPU needed):

* parameter lists name NumPy dtypes (``float32 in0``: CuPy parses the type as a dtype name,
  ``float`` would be float64); the bodies use C types (``const float v0 = ...``);
* infinities and NaNs are CuPy's ``CUDART_INF``/``CUDART_NAN`` (``_F`` for float): NVRTC has
  no ``INFINITY``;
* float16 values are CuPy's ``float16`` (``cupy/float16.cuh``, included by the preamble); every
  op on them computes in float and rounds its result once, as the reference does, and a float16
  reduction accumulates in float;
* a reduction's parameters are ``in0, in1, ...`` and ``out0``, with the ``type_in0_raw`` and
  ``type_out0_raw`` typedefs that CuPy's CUB path (one contiguous input) reads; it always has an
  array parameter, so CuPy knows the loop's size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..dtypes import bfloat16
from ..errors import DTypeError
from ..graph.primitives import REGISTRY
from .cuda_ops import CTYPE, CUDA, ERR, ERR_PARAM, PREAMBLE, ctype, max_expr, min_expr, needs_flag
from .cuda_raw import FULL, HOST_HEADERS, raw_source

REDUCE = {  # prim -> (reduce_expr, identity(dtype of the accumulator))
    "reduce_sum": ("a + b", lambda d: "0"),
    "reduce_prod": ("a * b", lambda d: "1"),
    "reduce_max": (max_expr("a", "b"),
                   lambda d: literal(-np.inf, d) if d.kind == "f" else _int_limit(d, "min")),
    "reduce_min": (min_expr("a", "b"),
                   lambda d: literal(np.inf, d) if d.kind == "f" else _int_limit(d, "max")),
}
F16, F32 = np.dtype(np.float16), np.dtype(np.float32)


def _accumulator(dtype) -> np.dtype:
    """The type a reduction accumulates in: float for float16 (10 000 ones sum to 10 000, not
    to 2 048), the value's own type otherwise."""
    return F32 if np.dtype(dtype) == F16 else np.dtype(dtype)


def _int_limit(dtype, which):
    if dtype.kind == "b":
        return "false" if which == "min" else "true"
    info = np.iinfo(dtype)
    if which == "max":
        return f"(({ctype(dtype)}){info.max})"
    # the most negative value is written as (-max - 1): its literal alone does not fit the type
    return f"(({ctype(dtype)})({info.min + 1}) - 1)" if info.min < 0 else f"(({ctype(dtype)})0)"


def dtype_name(dtype) -> str:
    """The name CuPy's parameter lists read (a NumPy dtype name: ``float32``, ``int64``)."""
    name = np.dtype(dtype).name
    if name not in CTYPE:
        raise NotImplementedError(f"no CUDA type for {name}")
    return name


def literal(value, dtype) -> str:
    """``value`` as a C expression of ``dtype`` that any template can take as an operand: one
    primary expression (parenthesised), so ``-{a}`` of a negative constant is ``-(-2.5f)``, never
    the decrement ``--2.5f`` that NVRTC rejects."""
    dtype = np.dtype(dtype)
    v = np.asarray(value).reshape(()).item()
    if dtype.kind == "b":
        return "true" if v else "false"
    if dtype.kind in "iu":
        if dtype.kind == "i" and int(v) == np.iinfo(dtype).min:
            return _int_limit(dtype, "min")  # its literal alone does not fit the type
        return f"(({ctype(dtype)}){int(v)})"
    if dtype == F16:
        return f"((float16){literal(np.float16(v), F32)})"
    suffix = "_F" if dtype == F32 else ""  # CuPy's math_constants.h (NVRTC has no INFINITY)
    if math.isnan(v):  # its sign bit kept (signbit, copysign read it): negation sets it
        return f"(-CUDART_NAN{suffix})" if math.copysign(1.0, v) < 0 else f"CUDART_NAN{suffix}"
    if math.isinf(v):
        return f"CUDART_INF{suffix}" if v > 0 else f"(-CUDART_INF{suffix})"
    text = repr(float(v))
    if dtype != F32:
        return f"(({ctype(dtype)}){text})"
    return f"({text}f)" if text.startswith("-") else text + "f"


@dataclass(frozen=True)
class KernelSpec:
    """What the CuPy backend compiles for one fused group."""

    kind: str                 # "elementwise" | "reduction"
    name: str
    in_params: str            # e.g. "float32 in0, float32 in1" (NumPy dtype names)
    out_params: str           # e.g. "float32 out0"
    operation: str = ""       # elementwise
    map_expr: str = ""        # reduction
    reduce_expr: str = ""
    post_map_expr: str = ""
    identity: str = ""
    preamble: str = ""
    params: tuple = ()        # indices of the fused node's inputs passed to the kernel
    flag: bool = False        # a last ``raw int32`` input: the error flag (``cuda_ops``)
    axes: tuple = ()          # reduction axes
    red_shape: tuple = ()     # the reduction's input shape (inputs are broadcast to it)
    reduce_type: str = ""     # C type the reduction accumulates in
    out_shape: tuple = ()     # the fused node's output shape
    body: object = field(default=None, compare=False, repr=False)  # the FusedBody it was made of
    consts: dict = field(default_factory=dict, compare=False, repr=False)  # inlined constants

    @property
    def key(self) -> tuple:
        return (self.kind, self.in_params, self.out_params, self.operation, self.map_expr,
                self.reduce_expr, self.post_map_expr, self.identity, self.preamble,
                self.reduce_type)


def kernel_args(spec: KernelSpec) -> tuple[str, tuple, dict]:
    """``(class name, args, kwargs)``: how ``spec`` is made a ``cupy.ElementwiseKernel`` or
    ``cupy.ReductionKernel`` (the backend builds it so; the tests build the same through CuPy's
    machinery and compile it with NVRTC)."""
    if spec.kind == "elementwise":
        return ("ElementwiseKernel", (spec.in_params, spec.out_params, spec.operation, spec.name),
                {"preamble": spec.preamble})
    return ("ReductionKernel", (spec.in_params, spec.out_params, spec.map_expr, spec.reduce_expr,
                                spec.post_map_expr, spec.identity, spec.name),
            {"reduce_type": spec.reduce_type, "preamble": spec.preamble})


def cast_operand(expr: str, src, dst) -> str:
    """The operand of a cast from ``src`` to ``dst``: a float cast to an integer narrower than
    64 bits goes through ``long long``, so a value beyond the target's range wraps, as NumPy's
    cast does on x86-64 (-46.0 to uint8 is 210); CUDA's direct conversion saturates (0), seen
    on an H200. (NaN, infinities and values beyond 64 bits stay undefined, as in NumPy.)"""
    src, dst = np.dtype(src), np.dtype(dst)
    if src.kind == "f" and dst.kind in "iu" and dst.itemsize < 8:
        return f"((long long){expr})"
    return expr


def _operand(name: str, dtype) -> str:
    return f"((float){name})" if np.dtype(dtype) == F16 else name


def _statements(nodes, names):
    """``const T vK = expr;`` per node; fills ``names`` (value id -> C name). A float16 value is
    computed in float from its operands in float and rounded once (the reference's rule)."""
    lines = []
    for k, node in enumerate(nodes):
        out = np.dtype(node.out.dtype)
        t = ctype(out)
        args = [_operand(names[x.id], x.dtype) for x in node.inputs]
        if node.prim == "cast":
            args = [cast_operand(args[0], node.inputs[0].dtype, out)]
        expr = CUDA[node.prim](*args, t="float" if out == F16 else t, **node.attrs,
                               **_broadcast_exponent(node))
        if out == F16:
            expr = f"((float16)({expr}))"
        names[node.out.id] = f"v{k}"
        lines.append(f"const {t} v{k} = {expr};")
    return lines


def _broadcast_exponent(node) -> dict:
    """``scalar_exponent=True`` for a power whose exponent is one value that NumPy broadcasts
    (0-d, or of size 1 against a bigger result): NumPy's loop then takes 0.5 as ``sqrt``."""
    if node.prim != "pow":
        return {}
    b = node.inputs[1]
    return {"scalar_exponent": b.size == 1 and (b.ndim == 0 or node.out.size > 1)}


def split_reduction(nodes, reduction):
    """(prologue, epilogue) of a group with a reduction, each in order: the prologue is what the
    reduction reads (computed per input element), the epilogue everything else (computed once
    per reduced element: what reads the reduced value, and what only it reads, such as a sum of
    two constants, which may come before the reduction in the group's order)."""
    upstream, work = set(), [reduction]
    inside = {n.out.id: n for n in nodes}
    while work:
        for x in work.pop().inputs:
            n = inside.get(x.id)
            if n is not None and id(n) not in upstream:
                upstream.add(id(n))
                work.append(n)
    return ([n for n in nodes if id(n) in upstream],
            [n for n in nodes if id(n) not in upstream and n is not reduction])


def accepts(members) -> bool:
    """Whether ``generate`` makes one kernel of a group the fusion pass would form (``members``:
    its nodes in order). A reduction's epilogue runs once per reduced element, so it may read,
    from outside the group, only the reduced value and constants (they become literals), and no
    epilogue op may change the shape (a ``broadcast_to``, or a (1, 1) constant against a scalar:
    the kernel's output has the reduction's shape, never a bigger one)."""
    reduction = next((m for m in members if REGISTRY[m.prim].fuse == "reduce"), None)
    if reduction is None:
        return True
    inside = {m.out.id for m in members}
    _, post = split_reduction(members, reduction)
    for m in post:
        for x in m.inputs:
            if x.id not in inside and not (x.node is not None and x.node.prim == "const"):
                return False
    return _keeps_shape(post, reduction)


def _keeps_shape(post, reduction) -> bool:
    """No epilogue op that reads the reduced value (or what it made) changes its shape."""
    reads = {reduction.out.id}
    for m in post:
        if any(x.id in reads for x in m.inputs):
            reads.add(m.out.id)
            if m.out.shape != reduction.out.shape:
                return False
    return True


def _includes(dtypes) -> str:
    return "#include <cupy/float16.cuh>\n" if F16 in {np.dtype(d) for d in dtypes} else ""


def generate(node, consts: dict, name: str) -> KernelSpec:
    """The kernel for fused ``node``; ``consts``: {input index: value} of scalar constants."""
    body = node.attrs["body"]
    g = body.graph
    consts = dict(consts)
    if len(consts) == len(g.inputs) and consts:  # an array parameter gives CuPy the loop's size
        del consts[0]
    names, params, np_decls, c_decls = {}, [], [], []
    for i, x in enumerate(g.inputs):
        if i in consts:
            names[x.id] = literal(consts[i], x.dtype)
        else:
            names[x.id] = f"in{len(params)}"
            np_decls.append(f"{dtype_name(x.dtype)} in{len(params)}")
            c_decls.append(f"{ctype(x.dtype)} in{len(params)}")
            params.append(i)
    flag = any(needs_flag(n) for n in g.nodes)  # the kernel's error flag, its last input
    if flag:
        np_decls.append(f"raw int32 {ERR_PARAM}")
    err_arg = f"(int*)&{ERR_PARAM}[0]"  # (CuPy passes a raw input as a const CArray)
    out_t = ctype(node.out.dtype)
    out_params = f"{dtype_name(node.out.dtype)} out0"
    dtypes = [x.dtype for x in g.inputs] + [n.out.dtype for n in g.nodes]
    common = dict(params=tuple(params), flag=flag, out_shape=tuple(node.out.shape), body=body,
                  consts=consts)
    if body.reduction is None:
        lines = ([f"int* {ERR} = {err_arg};"] if flag else []) + _statements(g.nodes, names)
        lines.append(f"out0 = {names[g.outputs[0].id]};")
        return KernelSpec("elementwise", name, ", ".join(np_decls), out_params,
                          operation="\n".join(lines),
                          preamble=_includes(dtypes) + PREAMBLE.strip(), **common)
    red = body.reduction
    pre, post = split_reduction(g.nodes, red)
    acc = _accumulator(red.out.dtype)
    red_t = ctype(acc)
    # prologue: a device function of the kernel's inputs
    pre_lines = _statements(pre, names)
    call_args = ", ".join([f"in{j}" for j in range(len(params))] + [err_arg] * flag)
    c_decls += [f"int* {ERR}"] * flag
    in0_t = ctype(g.inputs[params[0]].dtype) if params else red_t
    preamble = [_includes(dtypes) + PREAMBLE.strip(),
                # CuPy's CUB path (one contiguous input) reads these names
                f"typedef {in0_t} type_in0_raw;", f"typedef {out_t} type_out0_raw;",
                f"__device__ {red_t} {name}_map({', '.join(c_decls)}) {{",
                *["  " + s for s in pre_lines],
                f"  return ({red_t}){names[red.inputs[0].id]};", "}"]
    # epilogue: a device function of the reduced value (held in the accumulator's type)
    post_names = {x.id: names[x.id] for i, x in enumerate(g.inputs) if i in consts}
    post_names[red.out.id] = "a"
    try:
        post_lines = _statements(post, post_names)
    except KeyError:
        raise NotImplementedError("the epilogue reads a non-constant input") from None
    if not _keeps_shape(post, red):
        raise NotImplementedError("an epilogue op changes the reduced value's shape")
    result = post_names[g.outputs[0].id]
    preamble += [f"__device__ {out_t} {name}_post({red_t} a{f', int* {ERR}' * flag}) {{",
                 *["  " + s for s in post_lines], f"  return ({out_t}){result};", "}"]
    reduce_expr, identity = REDUCE[red.prim]
    return KernelSpec("reduction", name, ", ".join(np_decls), out_params,
                      map_expr=f"{name}_map({call_args})", reduce_expr=reduce_expr,
                      post_map_expr=f"out0 = {name}_post(a{f', {err_arg}' * flag})",
                      identity=identity(acc), preamble="\n".join(preamble),
                      axes=tuple(red.attrs["axes"]), red_shape=tuple(red.inputs[0].shape),
                      reduce_type=red_t, **common)


def standalone_source(spec: KernelSpec) -> str:
    """A complete CUDA translation unit for ``spec`` (contiguous inputs of the output's size, or
    scalars), for compiling with ``nvcc`` and for reading: an elementwise group's is the raw
    kernel the CuPy backend launches for contiguous operands (``cuda_raw.py``); otherwise the
    backend hands the pieces to ``ElementwiseKernel``/``ReductionKernel``, which add
    broadcasting and indexing. (float16 kernels need CuPy's headers: they are compiled through
    CuPy in the tests.)"""
    if spec.kind == "elementwise":
        n_params = sum(1 for p in spec.in_params.split(",")
                       if p.strip() and not p.strip().startswith("raw "))
        return raw_source(spec, [(FULL,)] * n_params, 0, head=HOST_HEADERS, name=spec.name)

    def c_param(p):
        dtype, name = p.rsplit(" ", 1)
        return ctype(dtype), name
    params = [c_param(p.strip()) for p in spec.in_params.split(",")
              if p.strip() and not p.strip().startswith("raw ")]
    out_t, out_name = c_param(spec.out_params)
    ptrs = [f"const {t}* __restrict__ {n}_p" for t, n in params] + \
        [f"int* {ERR_PARAM}"] * spec.flag  # the error flag: a pointer, read as err_flag[0]
    loads = [f"    const {t} {n} = {n}_p[i];" for t, n in params]
    head = HOST_HEADERS
    sig = ", ".join(ptrs + [f"{out_t}* __restrict__ {out_name}_p", "long long n"])
    # reduction over everything, one thread: enough to check that the pieces compile together
    red_t = spec.reduce_type
    return (f"{head}{spec.preamble}\nextern \"C\" __global__ void {spec.name}({sig}) {{\n"
            f"  {red_t} a = {spec.identity};\n"
            f"  for (long long i = 0; i < n; ++i) {{\n" + "\n".join(loads) +
            f"\n    {red_t} b = {spec.map_expr};\n    a = {spec.reduce_expr};\n  }}\n"
            f"  {out_t} {out_name};\n  {spec.post_map_expr};\n"
            f"  {out_name}_p[0] = {out_name};\n}}\n")


def refuse_bfloat16(graph) -> None:
    """CuPy has no bfloat16 arrays: a step that holds one is an error naming the value, not a
    failure inside CuPy (float16 runs; bfloat16 runs on the NumPy and JAX backends)."""
    values = list(graph.inputs) + [n.out for n in graph.nodes]
    for x in values:
        if x.aval.dtype == bfloat16:
            raise DTypeError(
                f"the CuPy backend cannot hold bfloat16 values (CuPy has no bfloat16 dtype): "
                f"{x.aval} in this step; use float16 (rp.autocast('float16')), or the JAX "
                "backend (backend='jax') for bfloat16")


__all__ = ["CTYPE", "CUDA", "REDUCE", "KernelSpec", "accepts", "cast_operand", "ctype",
           "dtype_name", "generate", "kernel_args", "literal", "refuse_bfloat16",
           "split_reduction", "standalone_source"]
