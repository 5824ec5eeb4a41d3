"""Raw kernels for the map-only fused groups whose operands a GPU can read linearly (issue 31).

CuPy's ``ElementwiseKernel`` reads every operand through its indexer; on an H200 one that only
copies 16 M float32 reaches 42 % of the copy bandwidth, and the 8-op chain of ``bench/fusion.py``
as one ``ElementwiseKernel`` the same 42 %, where a raw grid-stride kernel of the same chain
reaches 83 % (``bench/gpu_chain_probe.py``, ``docs/guides/gpu.md``). So a map-only group runs as
the raw kernel ``raw_source`` writes when each operand (each C-contiguous) is

* ``FULL``: the output's shape: ``in_p[i]``;
* ``SCALAR``: one value: ``in_p[0]``;
* ``BLOCK``: a run of the output's axes, broadcast over the axes before and after it (a bias
  ``(C,)`` against ``(B, T, C)``, a row statistic ``(B, T, 1)``): ``in_p[(i / r) % m]``, with
  ``m`` the run's size and ``r`` the size of the axes after it (``i % m`` when ``r`` is 1,
  ``i / r`` when nothing comes before);

and through the ``ElementwiseKernel`` otherwise (a transposed or strided view, a broadcast that
is not one run). The loop index is 32-bit when the output has fewer than 2**31 elements. The
body is the group's ``operation``, as ``cuda_codegen.generate`` wrote it for the
``ElementwiseKernel`` (the same statements: the host-compiled check of the generated code,
``tests/backends/test_cuda_host.py``, runs this kernel's loop, its ``standalone_source``).
"""

from __future__ import annotations

import math

from .cuda_ops import ERR_PARAM, ctype

FULL, SCALAR, BLOCK = "full", "scalar", "block"
CUPY_HEADERS = ("#include <cupy/complex.cuh>\n#include <cupy/carray.cuh>\n"
                "#include <cupy/atomics.cuh>\n#include <cupy/math_constants.h>\n")
HOST_HEADERS = "#include <cmath>\n#include <math_constants.h>\n"
THREADS = 256       # a block's threads
MAX_BLOCKS = 4096   # the grid's cap (each thread then loops): 1 M threads in flight


def mode(x, out_shape) -> tuple | None:
    """How the raw kernel reads operand ``x`` (an array with ``shape``, ``size`` and
    ``flags.c_contiguous``) for an output of ``out_shape``: ``(FULL,)``, ``(SCALAR,)``,
    ``(BLOCK, m, r)``, or None (it cannot: the ``ElementwiseKernel`` runs)."""
    out_shape = tuple(out_shape)
    if x.size == 1:
        return (SCALAR,)
    if not x.flags.c_contiguous or x.ndim > len(out_shape):
        return None
    if tuple(x.shape) == out_shape:
        return (FULL,)
    padded = (1,) * (len(out_shape) - x.ndim) + tuple(x.shape)
    present = []
    for d, (a, s) in enumerate(zip(padded, out_shape)):
        if a == s and s != 1:
            present.append(d)
        elif a != 1:
            return None  # (not broadcastable: the caller's shapes are wrong)
    lo, hi = present[0], present[-1] + 1
    if any(padded[d] == 1 and out_shape[d] != 1 for d in range(lo, hi)):
        return None  # a broadcast axis inside the run: not one block
    m, r = math.prod(out_shape[lo:hi]), math.prod(out_shape[hi:])
    if m * r == math.prod(out_shape) and r == 1:
        return (FULL,)  # (only axes of size 1 differ)
    return (BLOCK, m, r)


def modes(xs, out_shape) -> tuple | None:
    """Every operand's ``mode``, or None when one cannot be read linearly."""
    found = tuple(mode(x, out_shape) for x in xs)
    return None if any(m is None for m in found) else found


def wide(n: int) -> bool:
    """A 64-bit loop index (``n`` too big for a signed 32-bit one)."""
    return n >= 2 ** 31


def _load(k, how, n_total):
    name = f"in{k}"
    if how[0] == FULL:
        return f"{name}_p[i]"
    if how[0] == SCALAR:
        return f"{name}_p[0]"
    _, m, r = how
    if r == 1:
        return f"{name}_p[i % m{k}]"
    if m * r == n_total:
        return f"{name}_p[i / r{k}]"
    return f"{name}_p[(i / r{k}) % m{k}]"


def raw_source(spec, how, n, head=CUPY_HEADERS, name=None) -> str:
    """The raw kernel ``name`` (``{spec.name}_raw``) of elementwise ``spec``, its operands read
    as ``how`` (``modes``), for an output of ``n`` elements. Its arguments: a pointer per
    operand, the error flag's pointer (when ``spec.flag``), the output's pointer, ``n``, then
    ``m`` and ``r`` of each ``BLOCK`` operand, every integer of the loop index's type
    (``args``)."""
    index_t = "unsigned long long" if wide(n) else "unsigned int"
    params = [p.strip().rsplit(" ", 1) for p in spec.in_params.split(",")
              if p.strip() and not p.strip().startswith("raw ")]
    out_dtype, out_name = spec.out_params.strip().rsplit(" ", 1)
    out_t = ctype(out_dtype)
    sig = [f"const {ctype(d)}* __restrict__ {name}_p" for d, name in params]
    sig += [f"int* {ERR_PARAM}"] * spec.flag
    sig += [f"{out_t}* __restrict__ {out_name}_p", f"{index_t} n"]
    for k, h in enumerate(how):
        if h[0] == BLOCK:
            sig += [f"{index_t} m{k}", f"{index_t} r{k}"]
    loads = [f"    const {ctype(d)} {name} = {_load(k, how[k], n)};"
             for k, (d, name) in enumerate(params)]
    body = "\n".join("    " + line for line in spec.operation.splitlines())
    return (f"{head}{spec.preamble}\n"
            f"extern \"C\" __global__ void {name or spec.name + '_raw'}({', '.join(sig)}) {{\n"
            f"  for ({index_t} i = blockIdx.x * ({index_t})blockDim.x + threadIdx.x; i < n;"
            f" i += ({index_t})blockDim.x * gridDim.x) {{\n" + "\n".join(loads) +
            f"\n    {out_t} {out_name};\n{body}\n    {out_name}_p[i] = {out_name};\n  }}\n}}\n")


def args(how, n, np_module):
    """The trailing integer arguments (``n``, then each ``BLOCK``'s ``m`` and ``r``), as NumPy
    scalars of the loop index's type (CuPy passes a NumPy scalar as its C type)."""
    t = np_module.uint64 if wide(n) else np_module.uint32
    out = [t(n)]
    for h in how:
        if h[0] == BLOCK:
            out += [t(h[1]), t(h[2])]
    return out


def grid(n: int) -> tuple:
    """``((blocks,), (threads,))`` for ``n`` elements."""
    return (max(1, min(MAX_BLOCKS, -(-n // THREADS))),), (THREADS,)


__all__ = ["BLOCK", "CUPY_HEADERS", "FULL", "HOST_HEADERS", "MAX_BLOCKS", "SCALAR", "THREADS",
           "args", "grid", "mode", "modes", "raw_source", "wide"]
