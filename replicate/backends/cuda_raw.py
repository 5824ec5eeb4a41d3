"""Raw kernels for the map-only fused groups whose operands a GPU can read linearly (issue 31).

CuPy's ``ElementwiseKernel`` reads every operand through its indexer; on an H200 one that only
copies 16 M float32 reaches 42 % of the copy bandwidth, and the 8-op chain of ``bench/fusion.py``
as one ``ElementwiseKernel`` the same 42 %, where a raw grid-stride kernel of the same chain
reaches 83 % (``bench/gpu_chain_probe.py``, ``docs/guides/gpu.md``). So a map-only group runs as
the raw kernel ``raw_source`` writes when each operand (each C-contiguous) is

* ``FULL``: the output's shape: ``in_p[i]``;
* ``SCALAR``: one value: ``in_p[0]``;
* a run of the output's axes, broadcast over the axes before and after it, with ``m`` the run's
  size and ``r`` the size of the axes after it: ``MOD`` when nothing comes after (a bias
  ``(C,)`` against ``(B, T, C)``): ``in_p[i % m]``; ``DIV`` when nothing comes before (a row
  statistic ``(B, T, 1)``): ``in_p[i / r]``; ``BLOCK`` otherwise (``(T, 1)`` against
  ``(B, T, C)``): ``in_p[(i / r) % m]``;

and through the ``ElementwiseKernel`` otherwise (a transposed or strided view, a broadcast that
is not one run). The loop index is 32-bit when the output has fewer than 2**31 elements. The
body is the group's ``operation``, as ``cuda_codegen.generate`` wrote it for the
``ElementwiseKernel`` (the same statements: the host-compiled check of the generated code,
``tests/backends/test_cuda_host.py``, runs this kernel's loop, its ``standalone_source``).
"""

from __future__ import annotations

import math

from .cuda_ops import ERR_PARAM, ctype

FULL, SCALAR, MOD, DIV, BLOCK = "full", "scalar", "mod", "div", "block"
CUPY_HEADERS = ("#include <cupy/complex.cuh>\n#include <cupy/carray.cuh>\n"
                "#include <cupy/atomics.cuh>\n#include <cupy/math_constants.h>\n")
HOST_HEADERS = "#include <cmath>\n#include <math_constants.h>\n"
THREADS = 256       # a block's threads
MAX_BLOCKS = 4096   # the grid's cap (each thread then loops): 1 M threads in flight


def mode(x, out_shape) -> tuple | None:
    """How the raw kernel reads operand ``x`` (an array with ``shape``, ``size`` and
    ``flags.c_contiguous``) for an output of ``out_shape``: ``(FULL,)``, ``(SCALAR,)``,
    ``(MOD, m)``, ``(DIV, r)``, ``(BLOCK, m, r)``, or None (it cannot: the
    ``ElementwiseKernel`` runs). The kernel's source depends on the kinds only, its arguments
    on the sizes."""
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
    whole = m * r == math.prod(out_shape)  # nothing before the run
    if whole and r == 1:
        return (FULL,)  # (only axes of size 1 differ)
    if r == 1:
        return (MOD, m)
    return (DIV, r) if whole else (BLOCK, m, r)


def modes(xs, out_shape) -> tuple | None:
    """Every operand's ``mode``, or None when one cannot be read linearly."""
    found = tuple(mode(x, out_shape) for x in xs)
    return None if any(m is None for m in found) else found


def wide(n: int) -> bool:
    """A 64-bit loop index (``n`` too big for a signed 32-bit one)."""
    return n >= 2 ** 31


_INDEX = {FULL: "i", SCALAR: "0", MOD: "i % m{k}", DIV: "i / r{k}", BLOCK: "(i / r{k}) % m{k}"}
_SIZES = {FULL: (), SCALAR: (), MOD: ("m",), DIV: ("r",), BLOCK: ("m", "r")}  # its arguments


def kinds(how) -> tuple:
    """What the source depends on: each operand's kind of reading."""
    return tuple(h[0] for h in how)


def raw_source(spec, how, n, head=CUPY_HEADERS, name=None) -> str:
    """The raw kernel ``name`` (``{spec.name}_raw``) of elementwise ``spec``, its operands read
    as ``how`` (``modes``), for an output of ``n`` elements. Its arguments: a pointer per
    operand, the error flag's pointer (when ``spec.flag``), the output's pointer, ``n``, then
    the sizes of each operand read in blocks (``m`` for ``MOD``, ``r`` for ``DIV``, both for
    ``BLOCK``), every integer of the loop index's type (``args``)."""
    index_t = "unsigned long long" if wide(n) else "unsigned int"
    params = [p.strip().rsplit(" ", 1) for p in spec.in_params.split(",")
              if p.strip() and not p.strip().startswith("raw ")]
    out_dtype, out_name = spec.out_params.strip().rsplit(" ", 1)
    out_t = ctype(out_dtype)
    sig = [f"const {ctype(d)}* __restrict__ {name}_p" for d, name in params]
    sig += [f"int* {ERR_PARAM}"] * spec.flag
    sig += [f"{out_t}* __restrict__ {out_name}_p", f"{index_t} n"]
    for k, kind in enumerate(kinds(how)):
        sig += [f"{index_t} {size}{k}" for size in _SIZES[kind]]
    loads = [f"    const {ctype(d)} {name} = {name}_p[{_INDEX[how[k][0]].format(k=k)}];"
             for k, (d, name) in enumerate(params)]
    body = "\n".join("    " + line for line in spec.operation.splitlines())
    return (f"{head}{spec.preamble}\n"
            f"extern \"C\" __global__ void {name or spec.name + '_raw'}({', '.join(sig)}) {{\n"
            f"  for ({index_t} i = blockIdx.x * ({index_t})blockDim.x + threadIdx.x; i < n;"
            f" i += ({index_t})blockDim.x * gridDim.x) {{\n" + "\n".join(loads) +
            f"\n    {out_t} {out_name};\n{body}\n    {out_name}_p[i] = {out_name};\n  }}\n}}\n")


def args(how, n, np_module):
    """The trailing integer arguments (``n``, then each block reading's sizes), as NumPy
    scalars of the loop index's type (CuPy passes a NumPy scalar as its C type)."""
    t = np_module.uint64 if wide(n) else np_module.uint32
    return [t(n)] + [t(v) for h in how for v in h[1:]]


def grid(n: int) -> tuple:
    """``((blocks,), (threads,))`` for ``n`` elements."""
    return (max(1, min(MAX_BLOCKS, -(-n // THREADS))),), (THREADS,)


__all__ = ["BLOCK", "CUPY_HEADERS", "DIV", "FULL", "HOST_HEADERS", "MAX_BLOCKS", "MOD", "SCALAR",
           "THREADS", "args", "grid", "kinds", "mode", "modes", "raw_source", "wide"]
