"""Compile the kernels the cupy backend launched, without a GPU: each launch the backend
recorded (``replicate.backends.cuda_launches.LAUNCHES``) is built by the real CuPy's own kernel
machinery (its
parameter parsing and type checks, its ``ElementwiseKernel``, ``ReductionKernel`` and CUB
block-reduction source templates, its headers and compile options) and compiled with NVRTC for
``sm_90`` (an H100). Needs the ``cupy-cuda13x`` and ``nvidia-cuda-nvrtc`` wheels (the ``test``
extra), not a driver.

Only the module load at the end of CuPy's compile path needs a driver: it is replaced by
NVRTC itself. Sources are compiled many to one NVRTC program (each in a namespace of its own,
its ``__global__`` renamed apart, its pass macros defined around it), since CuPy's CUB headers
take seconds to parse; a program that fails is compiled kernel by kernel to name the culprit.
"""

from __future__ import annotations

import contextlib
import importlib
import re
import time

import cupy_standin
import numpy as np

ARCH = "90"
ND, INDEXER, SCALAR, POINTER = 1, 2, 3, 4  # CuPy's _ArgInfo kinds
BLOCK = 512                                 # CuPy's default reduction block size
ITEMS_PER_THREAD = 4                        # its CUB default
TIMES: list = []                            # (kernels, seconds) per NVRTC program


def missing() -> str | None:
    """Why kernels cannot be compiled here (None: they can)."""
    if cupy_standin.REAL is None:
        return ("the real CuPy is not installed (pip install -e '.[test]' brings cupy-cuda13x "
                "and the NVRTC wheel)")
    try:
        importlib.import_module("cupy_backends.cuda.libs.nvrtc").getVersion()
    except Exception as e:  # noqa: BLE001 - the NVRTC library does not load
        return f"NVRTC does not load ({e}): pip install nvidia-cuda-nvrtc"
    return None


class _Source(Exception):
    def __init__(self, source, options):
        self.source, self.options = source, tuple(options)


@contextlib.contextmanager
def _capture():
    """CuPy's compile entry point raises the finished source and options instead of compiling
    and loading a module (loading needs a driver)."""
    compiler = importlib.import_module("cupy.cuda.compiler")
    saved = compiler._compile_module_with_cache

    def capture(source, options=(), **_):
        raise _Source(source, options)
    compiler._compile_module_with_cache = capture
    try:
        yield
    finally:
        compiler._compile_module_with_cache = saved


def _info(kind, typ, dtype, ndim, contiguous=False):
    kernel = importlib.import_module("cupy._core._kernel")
    return kernel._ArgInfo(kind, typ, None if dtype is None else np.dtype(dtype), ndim,
                           contiguous or ndim == 0, True)  # a 0-d array is C-contiguous


def _sources_of(signature, spec):
    """[(label, source, options)] of one launch, built as CuPy builds it."""
    real = cupy_standin.REAL
    kernel_mod = importlib.import_module("cupy._core._kernel")
    reduction = importlib.import_module("cupy._core._reduction")
    cub = importlib.import_module("cupy._core._cub_reduction")
    Indexer = importlib.import_module("cupy._core._carray").Indexer
    CScalar = importlib.import_module("cupy._core._scalar").CScalar
    MemoryPointer = importlib.import_module("cupy.cuda.memory").MemoryPointer
    from replicate.backends.cuda_codegen import kernel_args

    if signature[0] == "raw":  # a raw kernel (cuda_raw.py), through RawKernel's compile path
        core = importlib.import_module("cupy._core.core")
        try:
            core.compile_with_cache(signature[2], (), prepend_cupy_headers=False)
        except _Source as s:
            return [(f"{spec.name}_raw", s.source, s.options)]
        raise AssertionError(f"{spec.name}_raw: CuPy compiled nothing")
    cls, args, kwargs = kernel_args(spec)
    kernel = getattr(real, cls)(*args, **kwargs)
    out = []

    def build(label, fn, *fn_args):
        try:
            fn(*fn_args)
        except _Source as s:
            out.append((label, s.source, s.options))
            return
        raise AssertionError(f"{label}: CuPy compiled nothing")

    if signature[0] == "elementwise":  # ndims: per argument (a raw one keeps its own)
        _, _, dtypes, ndims = signature
        _, _, type_map = kernel._decide_params_type(*dtypes)
        infos = tuple(_info(ND, real.ndarray, d, n) for d, n in zip(dtypes[0] + dtypes[1],
                                                                     ndims)) + \
            (_info(INDEXER, Indexer, None, ndims[-1], True),)
        build(spec.name, kernel_mod._get_elementwise_kernel.__wrapped__, infos, type_map,
              kernel.params, kernel.operation, kernel.name, kernel.preamble)
        return out
    _, _, dtypes, ndim, axes, path = signature
    _, out_types, type_map = reduction._decide_params_type(kernel.in_params, kernel.out_params,
                                                           dtypes, ())
    out_ndim = ndim - len(axes)
    index = kernel_mod._TypeMap(type_map._pairs + (("IndexT", "int32"),))
    common = (kernel.reduce_expr,)
    if path == "simple":
        raw = [p.raw for p in kernel.in_params]  # a raw input (the error flag) keeps 1 dim
        infos = tuple(_info(ND, real.ndarray, d, 1 if r else ndim)
                      for d, r in zip(dtypes, raw)) + (
            _info(ND, real.ndarray, out_types[0], out_ndim),
            _info(INDEXER, Indexer, None, ndim, True),
            _info(INDEXER, Indexer, None, out_ndim, True),
            _info(SCALAR, CScalar, np.int32, 0, True))
        build(spec.name, reduction._ReductionKernel_get_cached_function.__wrapped__,
              len(dtypes), 1, kernel._params, infos, index, kernel.name, BLOCK,
              kernel.reduce_type, kernel.identity, kernel.map_expr, *common,
              kernel.post_map_expr, kernel.preamble, ())
        return out
    # CuPy's CUB block reduction: one input, parameters in0/out0 and the two sizes
    sizes = kernel_mod._get_param_info("int32 _segment_size, int32 _array_size", True)
    params = kernel._params[0:2] + sizes
    type_map = kernel_mod._TypeMap(index._pairs + (("sizeT", "int32"),))
    scalars = (_info(SCALAR, CScalar, np.int32, 0, True),) * 2
    arr_in = _info(ND, real.ndarray, dtypes[0], ndim, True)
    arr_out = _info(ND, real.ndarray, out_types[0], out_ndim, True)
    pointer = _info(POINTER, MemoryPointer, None, 0, True)
    fn = cub._SimpleCubReductionKernel_get_cached_function.__wrapped__
    passes = [("", kernel.map_expr, (arr_in, arr_out), ())] if path == "cub" else [
        ("_pass1", kernel.map_expr, (arr_in, pointer), ("-DFIRST_PASS=1",)),
        ("_pass2", "in0", (pointer, arr_out), ("-DSECOND_PASS=1",))]
    for suffix, map_expr, arrays, options in passes:
        build(f"{spec.name}{suffix} (CUB)", fn, map_expr, kernel.reduce_expr,
              kernel.post_map_expr, kernel.reduce_type, params, arrays + scalars, type_map,
              kernel.name + suffix, BLOCK, kernel.identity, kernel.preamble, options,
              ITEMS_PER_THREAD)
    return out


def sources(launches: dict) -> list:
    """Every recorded launch's CUDA sources, as CuPy would compile them."""
    out = []
    with _capture():
        for signature, spec in launches.items():
            out += _sources_of(signature, spec)
    return out


_PASS = re.compile(r"^-D(FIRST_PASS|SECOND_PASS)=1$")


def _program(chunks):
    """One NVRTC program of many CuPy sources."""
    includes, bodies = [], []
    for k, (_, source, options) in enumerate(chunks):
        lines = source.splitlines()
        # every #include at the top, an indented one too (CuPy's ElementwiseKernel source has
        # one inside its preamble block): a header included inside one kernel's namespace
        # would declare its types there, and its guard would keep them from the next kernels
        include = [ln for ln in lines if ln.lstrip().startswith("#include")]
        includes += [ln.strip() for ln in include if ln.strip() not in includes]
        body = "\n".join(ln for ln in lines if not ln.lstrip().startswith("#include"))
        body = re.sub(r"(__global__\s+void\s+)(\w+)", rf"\g<1>\g<2>__k{k}", body)
        macros = [m.group(1) for o in options if (m := _PASS.match(o))]
        defined = re.findall(r"^\s*#define\s+(\w+)", body, flags=re.M) + macros
        bodies.append("\n".join([*(f"#define {m} 1" for m in macros),
                                 f"namespace _k{k} {{", body, "}",
                                 *(f"#undef {m}" for m in defined)]))
    return "\n".join(includes + bodies)


def _options(chunks):
    return tuple(dict.fromkeys(o for _, _, opts in chunks for o in opts if not _PASS.match(o)))


def _nvrtc(source, options):
    """None, or NVRTC's log."""
    compiler = importlib.import_module("cupy.cuda.compiler")
    saved = compiler._get_arch_for_options_for_nvrtc  # memoized per device: needs a driver
    compiler._get_arch_for_options_for_nvrtc = lambda arch=None: (f"-arch=sm_{ARCH}", "cubin")
    try:
        compiler.compile_using_nvrtc(source, options + ("-ftz=true",), arch=ARCH,
                                     cache_in_memory=True)
    except compiler.CompileException as e:
        return str(e)
    finally:
        compiler._get_arch_for_options_for_nvrtc = saved
    return None


def compile_all(launches: dict) -> tuple[int, list]:
    """Compile every recorded launch: (number of kernels, [(label, log, source)] that failed)."""
    chunks = sources(launches)
    cub = [c for c in chunks if "cub/block" in c[1]]
    groups = [g for g in (cub, [c for c in chunks if c not in cub]) if g]
    failures = []
    for group in groups:
        t0 = time.monotonic()
        ok = _nvrtc(_program(group), _options(group)) is None
        TIMES.append((len(group), time.monotonic() - t0))
        if ok:
            continue
        for chunk in group:  # name the kernels that fail
            log = _nvrtc(chunk[1], chunk[2])
            if log is not None:
                failures.append((chunk[0], log, chunk[1]))
        if not failures:
            raise AssertionError("the batched program failed, each kernel alone compiles")
    return len(chunks), failures
