"""``cupy.RawKernel`` of the CuPy stand-in (``cupy_standin.py``): the raw kernels the cupy backend
generates for map-only fused groups (``replicate/backends/cuda_raw.py``), run as a GPU runs them
and at least as strict:

* only a source the backend's ``cuda_raw.raw_source`` wrote (recorded as it is written) can be
  built; anything else is refused rather than guessed; the kernel's name must be the
  ``extern "C"`` function the source defines (CuPy: "named symbol not found");
* ``kernel(grid, block, args)``: ``grid`` and ``block`` tuples of positive ints (at most 1024
  threads a block); ``args`` a tuple of exactly the kernel's parameters: a device array for each
  pointer, of the pointer's element type (CuPy passes only the address: another dtype would be
  read as garbage), and a NumPy scalar of exactly the parameter's C type for each integer (a
  Python ``int`` or another width would shift every argument after it);
* memory is read and written through the addresses, by the index each load of the source
  writes (``in0_p[i]``, ``[0]``, ``[i % m0]``, ``[i / r0]``, ``[(i / r0) % m0]``: read from
  the source, with the sizes the call passes) for every ``i < n``, the output at ``out0_p[i]``
  — so a transposed or strided view passed as a pointer gives the wrong elements, as on a GPU,
  a kernel compiled for another reading reads what that reading reads, and an extent beyond a
  live device array is the GPU's illegal address (``RuntimeError``) — the grid-stride loop
  covering every ``i`` whatever the grid;
* during a capture the launch is recorded as a step of the graph (``cupy_standin_graph``).
"""

from __future__ import annotations

import ctypes
import re

import cupy_standin_blas as _BLAS
import cupy_standin_graph as _G
import numpy as np

SOURCES: dict = {}  # source -> (spec, how, n) of the first group it was written for
_SCALAR_TYPES = {"unsigned int": np.uint32, "unsigned long long": np.uint64}


def record() -> None:
    """Every raw source ``cuda_raw.raw_source`` writes is registered with what it was made of."""
    from replicate.backends import cuda_raw
    original = cuda_raw.raw_source
    if getattr(original, "standin", False):
        return

    def raw_source(spec, how, n, *args, **kwargs):
        source = original(spec, how, n, *args, **kwargs)
        SOURCES.setdefault(source, (spec, tuple(how), n))
        return source
    raw_source.standin = True
    cuda_raw.raw_source = raw_source


def _memory(array, count, dtype, what):
    """``count`` elements of ``dtype`` from ``array``'s address on, as a NumPy view (bounds
    checked against the live device arrays)."""
    ptr = array.data.ptr
    size = np.dtype(dtype).itemsize * max(count, 1)
    _BLAS._owner(ptr, ptr + size, what)
    return np.frombuffer((ctypes.c_char * size).from_address(ptr), dtype)[:count]


class RawKernel:
    def __init__(self, code, name, options=(), backend="nvrtc", **kwargs):
        if code not in SOURCES:
            raise NotImplementedError("CuPy stand-in: it runs only the raw kernels the cupy "
                                      "backend generates (cuda_raw.raw_source)")
        match = re.search(r'extern "C" __global__ void (\w+)\((.*?)\) \{', code)
        if match is None or match.group(1) != name:
            raise RuntimeError(f"CUDA_ERROR_NOT_FOUND: named symbol not found ({name!r}; the "
                               "CuPy stand-in)")
        self.code, self.name, self.options = code, name, tuple(options)
        self.spec = SOURCES[code][0]
        self.params = [p.strip() for p in match.group(2).split(",")]
        self.names = [p.rsplit(" ", 1)[1] for p in self.params]
        self.loads = dict(re.findall(r"const [\w ]+ (in\d+) = in\d+_p\[([^;]*)\];", code))
        if not re.fullmatch(r"[\w ()%/]*", "".join(self.loads.values())):
            raise NotImplementedError(f"CuPy stand-in: a load it cannot read in {name}")

    def _check(self, grid, block, args):
        for what, dims in (("grid", grid), ("block", block)):
            if not isinstance(dims, tuple) or not 1 <= len(dims) <= 3 or not all(
                    isinstance(d, int) and d > 0 for d in dims):
                raise ValueError(f"CuPy stand-in: {what} must be a tuple of 1 to 3 positive "
                                 f"ints, got {dims!r}")
        if int(np.prod(block)) > 1024:
            raise RuntimeError("CUDA_ERROR_INVALID_VALUE: more than 1024 threads a block")
        if not isinstance(args, tuple) or len(args) != len(self.params):
            raise TypeError(f"CuPy stand-in: {self.name} takes {len(self.params)} arguments "
                            f"in a tuple, got {args!r:.200}")
        import cupy_standin

        from replicate.backends.cuda_codegen import CTYPE
        by_ctype = {c: np.dtype(d) for d, c in CTYPE.items()}
        for param, arg in zip(self.params, args):
            ctype = param.rsplit(" ", 1)[0].replace("const ", "").replace("__restrict__", "")
            ctype = ctype.strip()
            if ctype.endswith("*"):
                want = np.dtype(np.int32) if ctype == "int*" else by_ctype[ctype[:-1].strip()]
                if not isinstance(arg, cupy_standin.ndarray) or arg.dtype != want:
                    raise TypeError(f"CuPy stand-in: {param} takes a device array of {want}, "
                                    f"got {getattr(arg, 'dtype', type(arg))} (the kernel would "
                                    "read its bytes as the wrong type)")
            elif type(arg) is not _SCALAR_TYPES[ctype]:
                want = _SCALAR_TYPES[ctype].__name__
                raise TypeError(f"CuPy stand-in: {param} takes numpy.{want}, got "
                                f"{type(arg).__name__} (CuPy would pass another width)")

    def __call__(self, grid, block, args, *, shared_mem=0):
        self._check(grid, block, args)
        named = dict(zip(self.names, args))
        ins = [named[f"{k}_p"] for k in sorted(self.loads, key=lambda s: int(s[2:]))]
        flag, out = named.get("err_flag"), named["out0_p"]
        sizes = {k: int(v) for k, v in named.items() if isinstance(v, np.integer)}
        written = [out._a] + ([flag._a] if flag is not None else [])
        _G.mutation(written, lambda: self._launch(ins, flag, out, sizes))

    def _launch(self, ins, flag, out, sizes):
        import cupy_standin
        spec, n = self.spec, sizes["n"]
        i = np.arange(n, dtype=np.int64)
        gathered = []
        for k, x in enumerate(ins):
            expr = self.loads[f"in{k}"].replace("/", "//")  # (unsigned C division: floor)
            index = np.broadcast_to(eval(expr, {"__builtins__": {}}, {"i": i, **sizes}), (n,))
            count = int(index.max()) + 1 if n else 0
            gathered.append(_memory(x, count, x.dtype, f"operand {k}")[index])
        # (flat: a kernel of the same source serves every group of the same structure and
        # dtypes, whatever its shape; ``broadcast_to`` in a body is the identity, as in the C)
        env = cupy_standin._inputs_env(spec, gathered)
        env = {k: v.reshape(()) if v.size == 1 else v for k, v in env.items()}  # (constants)
        g = spec.body.graph
        err = _memory(flag, 1, np.int32, "the error flag") if flag is not None else None
        with np.errstate(all="ignore"):
            value = cupy_standin._evaluate(g.nodes, env, err)[g.outputs[0].id]
        target = _memory(out, n, out.dtype, "the output")
        value = cupy_standin.flush_denormals(np.asarray(value).astype(out.dtype))
        target[...] = np.broadcast_to(value.reshape(-1) if value.size == n else value, (n,))
        return out


__all__ = ["RawKernel", "SOURCES", "record"]
