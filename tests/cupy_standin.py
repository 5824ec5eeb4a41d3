"""A CuPy stand-in for machines without an NVIDIA GPU: the ``cupy`` backend's host logic runs in
CI, its array maths executed by NumPy.

``install()`` (called by ``tests/conftest.py`` unless CuPy sees a GPU) puts a module named
``cupy`` (and ``cupyx``) into ``sys.modules`` before the backend is imported, so every cupy
test runs against it: the backend's cache keys, launch arguments, buffers, dtype checks and
communication staging are exercised as they are on a GPU. What it holds to CuPy's behaviour:

* a device array is not a NumPy array: ``np.asarray`` on one raises CuPy's ``TypeError``, a host
  array passed to a device function raises, ``asarray``/``asnumpy`` are the only copies (and are
  counted: ``TRANSFERS``);
* only names the real CuPy has exist (when the real CuPy is installed: the test extra has it),
  and a call whose arguments the real function's signature does not take raises;
* ``ElementwiseKernel``/``ReductionKernel`` parse their parameter lists as CuPy does (NumPy dtype
  names) and raise CuPy's "Type is mismatched" for arguments of another dtype (with the real
  CuPy: through its own ``_decide_params_type``); what was launched the tests read from the
  backend's own record (``replicate/backends/cuda_launches.py``), never from here, so a test
  means the same on a GPU;
* a kernel runs what its C code means, element by element: inputs broadcast to the output (to the
  reduction's input for a ``ReductionKernel``), the reduction over the axes it is given, in its
  accumulator type, the epilogue on the reduced value only (a ``broadcast_to`` is the identity in
  C, so a kernel whose epilogue broadcasts returns the reduced shape, as on the GPU). The ops
  are the reference's (``graph/reference.py``), which the generated expressions match op by op:
  the expressions themselves are checked by compiling them, and on a GPU by ``bench/gpu_check.sh``.

* a kernel that ``cuda_codegen.generate`` did not make (the random bits) runs its C ``operation``
  as written, where that is unsigned 32-bit arithmetic (C and NumPy compute it alike); ``raw``
  parameters are passed whole;
* reading a device value on the host (``get``, ``asnumpy``, ``int()``, ``float()``, ``bool()``,
  ``item``, ``tolist``) is a copy, counted in ``TRANSFERS``;
* an integer ``power`` is CuPy's (a negative exponent gives 0, 1 or -1, never NumPy's
  ValueError); in a generated kernel it is C's ``_ipow``, which sets the kernel's error flag;
  a float ``remainder`` is CuPy's ``a - floor(a / b) * b`` (NaN over an infinite divisor);
* a generated kernel flushes float32 denormals to 0, as CuPy's ``-ftz=true`` does, and a
  float16 value it (or ``astype``) makes from a float NaN is the GPU's canonical NaN, its sign
  bit clear (the hardware's float-to-half conversion, ``cvt.rn.f16.f32``; seen on an H200);
* a 0-d array made from a host value, ``fill``, ``full`` and ``full_like`` write a zero with
  ``memset`` (CuPy's ``ndarray.fill``): a -0.0 becomes +0.0 (seen with CuPy 14.2);
* ``left_shift``/``right_shift`` are the GPU's: the count's low 32 bits, unsigned, and a count
  past the width gives 0 (right: the sign) — NumPy's 0 for a negative count is not CuPy's
  (``1 << INT64_MIN`` is 1 on an H200);
* ``cupy.cuda`` (devices, streams, events) and ``cupy.cuda.nccl`` (carried by MPI) are in
  ``cupy_standin_cuda.py``; stream capture, CUDA graphs and memory pools in
  ``cupy_standin_graph.py``: during a capture every operation on device arrays passes through
  its ``value_op``/``mutation`` (recorded, run by ``Graph.launch``) or ``refuse`` (a host read).

Not modelled: asynchrony (streams run their work at once, except under capture), memory
pools' blocks, CuPy's own kernels' numerics (its ``sum`` order, its ``erf``).
"""

from __future__ import annotations

import importlib.machinery
import inspect
import os
import re
import sys
import types

import cupy_standin_blas as _BLAS
import cupy_standin_cuda as _CUDA
import cupy_standin_graph as _G
import cupy_standin_raw as _RAW
import numpy as np

from replicate.backends.cuda_codegen import CTYPE, KernelSpec, split_reduction
from replicate.graph.reference import IMPL, reference_apply

REAL = None          # the real cupy module, where it imports (no GPU needed)
SPECS: dict = {}     # kernel constructor arguments -> the KernelSpec they were made from
TRANSFERS = {"to_device": 0, "to_host": 0}  # bytes
INSTALLED = False    # the stand-in is ``cupy`` in this process
ACTIVE = False       # ... and the tests may treat it as one (False in the GPU view)
ACCUMULATOR = {c: np.dtype(name) for name, c in CTYPE.items()}


def _no_host_arrays(values):
    for v in values:
        if isinstance(v, np.ndarray) and v.ndim:
            raise TypeError(f"Unsupported type {type(v)} (a host NumPy array passed to a "
                            "device function: CuPy needs cupy.asarray first)")


def unwrap(x):
    if isinstance(x, ndarray):
        return x._a
    if hasattr(x, "_fields"):  # a named tuple (numpy.linalg's results)
        return type(x)(*(unwrap(v) for v in x))
    if isinstance(x, (list, tuple)):
        return type(x)(unwrap(v) for v in x)
    if isinstance(x, dict):
        return {k: unwrap(v) for k, v in x.items()}
    return x


def wrap(x):
    if isinstance(x, np.ndarray):
        return ndarray(x)
    if isinstance(x, np.generic):  # CuPy's reductions give 0-d arrays, never scalars
        return ndarray(np.asarray(x))
    if hasattr(x, "_fields"):  # a named tuple (numpy.linalg's results)
        return type(x)(*(wrap(v) for v in x))
    if isinstance(x, (list, tuple)):
        return type(x)(wrap(v) for v in x)
    return x


class ndarray(np.lib.mixins.NDArrayOperatorsMixin):
    """A device array: a NumPy array that refuses to be one implicitly."""

    __slots__ = ("_a",)
    __hash__ = None

    def __init__(self, a):
        self._a = a

    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    strides = property(lambda self: self._a.strides)
    itemsize = property(lambda self: self._a.itemsize)
    nbytes = property(lambda self: self._a.nbytes)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: ndarray(self._a.T))

    def __array__(self, *args, **kwargs):
        raise TypeError("Implicit conversion to a NumPy array is not allowed. Please use "
                        "`.get()` to construct a NumPy array explicitly.")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        _no_host_arrays(inputs)
        if ufunc is np.matmul:  # ``a @ b``: cuBLAS
            _G.refuse_library("matmul")
        out = kwargs.get("out")
        ins, kw = unwrap(inputs), unwrap(kwargs)
        if method == "__call__" and ufunc in (np.left_shift, np.right_shift):  # ``a << b``
            shift = _gpu_shift(ufunc is np.left_shift)
            if out is None:
                return wrap(_G.value_op(lambda: shift(*ins), ins))

            def write():
                kw["out"][0][...] = shift(*ins)
            _G.mutation([kw["out"][0]], write)
            return out[0]
        if out is not None:
            _G.mutation(list(kw["out"]), lambda: getattr(ufunc, method)(*ins, **kw))
            return out[0] if isinstance(out, tuple) and len(out) == 1 else out
        return wrap(_G.value_op(lambda: getattr(ufunc, method)(*ins, **kw), (ins, kw)))

    def __array_function__(self, func, types_, args, kwargs):
        if REAL is not None and not hasattr(REAL, func.__name__):
            return NotImplemented  # NumPy then raises TypeError, as with CuPy
        _no_host_arrays(args)
        a, kw = unwrap(args), unwrap(kwargs)
        if func.__name__ in _MUTATORS:
            return _G.mutation([a[0]], lambda: func(*a, **kw))
        return wrap(_G.value_op(lambda: func(*a, **kw), (a, kw)))

    def __getitem__(self, index):
        _no_host_arrays(index if isinstance(index, tuple) else (index,))
        a, ix = self._a, unwrap(index)
        return wrap(_G.value_op(lambda: a[_wrapped(ix, a.shape) if _G.REPLAYING else ix],
                                (a, ix)))

    def __setitem__(self, index, value):
        a, ix, v = self._a, unwrap(index), unwrap(value)

        def write():
            a[ix] = v
        _G.mutation([a], write)

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        return (wrap(v) for v in self._a)

    # reading a value on the host is a copy from the device in CuPy: counted as one
    def __bool__(self):
        _G.refuse_copy("bool() of a device value")
        TRANSFERS["to_host"] += self._a.nbytes
        return bool(self._a)

    def __float__(self):
        _G.refuse_copy("float() of a device value")
        TRANSFERS["to_host"] += self._a.nbytes
        return float(self._a)

    def __int__(self):
        _G.refuse_copy("int() of a device value")
        TRANSFERS["to_host"] += self._a.nbytes
        return int(self._a)

    def __index__(self):
        _G.refuse_copy("a device value used as an index on the host")
        TRANSFERS["to_host"] += self._a.nbytes
        return self._a.__index__()

    @property
    def data(self):  # CuPy's MemoryPointer: ``.ptr`` is the address (host memory here)
        return types.SimpleNamespace(ptr=_BLAS.register(self._a), device_id=_CUDA.STATE.device)

    @property
    def device(self):
        return _CUDA.Device(_CUDA.STATE.device)

    @property
    def __cuda_array_interface__(self):  # as CuPy's (an MPI reads the memory it points at)
        return {"shape": self._a.shape, "typestr": self._a.dtype.str, "version": 3,
                "data": (self._a.ctypes.data, False),
                "strides": None if self._a.flags.c_contiguous else self._a.strides}

    def __dlpack_device__(self):
        return (2, _CUDA.STATE.device)  # kDLCUDA: a consumer on the host must copy (``get``)

    def __dlpack__(self, *args, **kwargs):
        raise BufferError("the CuPy stand-in's device arrays cannot be exported over DLPack "
                          "(a host consumer cannot read CUDA memory either): use .get()")

    def __repr__(self):
        return f"standin_{self._a!r}"

    def get(self, stream=None):
        _G.refuse_copy("a copy to the host (get)")
        TRANSFERS["to_host"] += self._a.nbytes
        return self._a.copy()

    def fill(self, value):
        _G.mutation([self._a], lambda: _fill(self, unwrap(value)))

    def astype(self, dtype, *args, **kwargs):  # to float16: the GPU's conversion (a NaN's sign)
        a = self._a
        return ndarray(_G.value_op(lambda: canonical_half_nans(a.astype(dtype, *args, **kwargs)),
                                   a))

    def set(self, arr, stream=None):
        """CuPy's copy from the host into this array (same shape and dtype), on ``stream``."""
        a = np.asarray(arr)
        if a.shape != self._a.shape:
            raise ValueError(f"Shape mismatch. Old shape: {self._a.shape}, new shape: {a.shape}")
        if a.dtype != self._a.dtype:
            raise TypeError(f"{a.dtype} array cannot be set to {self._a.dtype} array")
        _G.refuse_copy("a copy up from host memory (set)")
        TRANSFERS["to_device"] += a.nbytes
        self._a[...] = a

    def __getattr__(self, name):
        if name.startswith("__"):  # no __array_interface__: NumPy must not see the data
            raise AttributeError(name)
        if name in ("item", "tolist", "tobytes"):  # copies to the host
            _G.refuse_copy(f"a copy to the host ({name})")
            TRANSFERS["to_host"] += self._a.nbytes
        attr = getattr(self._a, name)
        if name in _INPLACE_METHODS:
            _G.refuse_unrecordable(f"ndarray.{name} (in place)")
        if callable(attr):
            def method(*a, **k):
                a, k = unwrap(a), unwrap(k)
                return wrap(_G.value_op(lambda: attr(*a, **k), (self._a, a, k)))
            return method
        return wrap(attr)


def _wrapped(ix, shape):
    """Index arrays as a GPU reads them in a graph's kernels: CuPy wraps an out-of-range index
    around (NumPy raises; outside a graph the stand-in keeps NumPy's error, which the backend's
    own checks match)."""
    parts = ix if isinstance(ix, tuple) else (ix,)
    if any(p is None or p is Ellipsis for p in parts) or len(parts) > len(shape):
        return ix
    out = tuple(np.mod(p, shape[k]) if isinstance(p, np.ndarray) and p.dtype.kind in "iu" and
                shape[k] else p for k, p in enumerate(parts))
    return out if isinstance(ix, tuple) else out[0]


# functions that write their first operand (NumPy's names), methods that write their array
_MUTATORS = {"copyto", "put", "putmask", "place", "fill_diagonal", "put_along_axis"}
_INPLACE_METHODS = {"sort", "put", "partition", "resize", "itemset", "setfield", "byteswap",
                    "setflags"}


def asarray(x, dtype=None):
    if isinstance(x, ndarray):
        return x if dtype is None or x.dtype == dtype else x.astype(dtype)
    _G.refuse_copy("a copy up from host memory (asarray)")
    a = np.array(x, dtype=dtype, copy=True)
    TRANSFERS["to_device"] += a.nbytes
    return ndarray(_memset_zeros(a) if a.ndim == 0 else a)  # CuPy fills a 0-d array


def _memset_zeros(a):
    """CuPy's ``ndarray.fill``: a value equal to 0 is written by ``memset`` (all bits 0), so a
    -0.0 fill is +0.0."""
    a = np.array(a, copy=True)
    a[a == 0] = 0
    return a


def _fill(x, value):
    x._a[...] = value
    x._a[...] = _memset_zeros(x._a) if np.asarray(value) == 0 else x._a


def _full(shape, fill_value, dtype=None, order="C"):
    out = ndarray(np.full(shape, fill_value, dtype=dtype, order=order))
    out._a[...] = _memset_zeros(out._a) if np.asarray(fill_value) == 0 else out._a
    return out


def _full_like(a, fill_value, dtype=None, order="K", subok=None, shape=None):
    out = ndarray(np.full_like(unwrap(a), fill_value, dtype=dtype, order=order, shape=shape))
    out._a[...] = _memset_zeros(out._a) if np.asarray(fill_value) == 0 else out._a
    return out


def _gpu_shift(left):
    """The GPU's shift (``shl``/``shr`` in PTX): the count's low 32 bits, unsigned; a count of
    the width or more gives 0 (an arithmetic right shift: the sign). NumPy's answer for a
    negative count (0, or -1) is not CuPy's where the low bits are small (``1 << INT64_MIN``
    is 1)."""
    def shift(a, b, *args, **kwargs):
        a, b = np.asarray(a), np.asarray(b)
        dtype = np.result_type(a, b)
        a, b = a.astype(dtype), b.astype(dtype)
        bits = 8 * dtype.itemsize
        count = b.astype(np.int64) & 0xFFFFFFFF
        past = count >= bits
        small = np.where(past, 0, count).astype(dtype)
        if left:
            value = np.where(past, 0, np.left_shift(a, small))
        else:
            value = np.where(past, np.where(a < 0, -1, 0), np.right_shift(a, small))
        return value.astype(dtype)
    return shift


def asnumpy(x):
    return x.get() if isinstance(x, ndarray) else np.asarray(x)


def _checked(fn, name):
    """``fn`` on device arrays, refusing the arguments the real CuPy's ``name`` (dotted for a
    submodule's: ``linalg.solve``) refuses."""
    real = REAL
    for part in name.split("."):
        real = getattr(real, part, None)
    try:
        signature = inspect.signature(real) if real is not None else None
    except (TypeError, ValueError):  # a Cython function or ufunc without one
        signature = None

    def run(*args, **kwargs):
        if signature is not None:
            try:
                signature.bind(*args, **kwargs)
            except TypeError as e:
                raise TypeError(f"cupy.{name}: {e} (the real CuPy's signature)") from None
        _no_host_arrays(args)
        _G.refuse_library(name)
        a, kw = unwrap(args), unwrap(kwargs)
        if name in _MUTATORS:
            return _G.mutation([a[0]], lambda: fn(*a, **kw))
        if kw.get("out") is not None:  # ``cupy.exp(s, out=s)``: a write into ``out``
            outs = kw["out"] if isinstance(kw["out"], tuple) else (kw["out"],)
            _G.mutation(list(outs), lambda: fn(*a, **kw))
            return kwargs["out"]
        if name in ("array_equal", "array_equiv", "allclose"):  # CuPy's: a 0-d array
            return wrap(_G.value_op(lambda: np.asarray(fn(*a, **kw)), (a, kw)))
        return wrap(_G.value_op(lambda: unwrap(fn(*a, **kw)), (a, kw),
                                alloc_only=name in ("empty", "empty_like")))
    run.__name__ = name
    return run


# -- kernels ------------------------------------------------------------------------------------
def _param_dtypes(params: str):
    """CuPy's reading of a parameter list: the type is a NumPy dtype name (``float`` is
    float64; ``long long`` does not parse); a ``raw`` parameter is passed whole, not indexed."""
    out = []
    for p in (q.strip() for q in params.split(",") if q.strip()):
        words = p.split()
        if words[0] == "raw":
            words = words[1:]
        if len(words) != 2:
            raise TypeError(f"data type {' '.join(words[:-1])!r} not understood (CuPy "
                            f"parameter {p!r})")
        out.append(np.dtype(words[0]))
    return out


def _raw_params(params: str) -> list:
    return [p.split()[0] == "raw" for p in (q.strip() for q in params.split(",") if q.strip())]


# -- kernels that cuda_codegen did not make: their C run as written --------------------------------
# Only the arithmetic of unsigned 32-bit words: declarations, assignments (= ^= += *=), the
# operators * + >> ^ & | (whose precedence and wrapping are the same in C on ``unsigned int`` and
# in NumPy on uint32), hexadecimal or decimal literals, ``name[digit]`` reads of raw parameters,
# ``(unsigned int)`` casts and the element index ``i``. Anything else is refused, not guessed.
_C_ALLOWED = re.compile(r"^[\w\s\[\]()^+*&|>=;]*$")
_C_WORDS = {"const", "unsigned", "int", "i", "out"}


def _c_program(operation: str, names) -> list:
    """The statements of a kernel's C ``operation`` as Python, or TypeError for C it does not
    read."""
    shifts = operation.replace(">>=", "").replace(">>", "")
    if not _C_ALLOWED.match(operation) or ">" in shifts or any(
            op in operation for op in ("==", "&&", "||")):
        raise TypeError("the CuPy stand-in runs C made of unsigned int arithmetic only")
    code = re.sub(r"\b(0[xX][0-9A-Fa-f]+|\d+)[uU]\b", r"\1", operation)
    code = re.sub(r"\(unsigned int\)\s*(\w+(?:\[\d+\])?)", r"_u32(\1)", code)
    code = re.sub(r"\b(?:const\s+)?unsigned int\s+(?=\w)", "", code)
    statements = [c.strip() for c in code.split(";") if c.strip()]
    for st in statements:
        words = set(re.findall(r"\b[A-Za-z_]\w*\b", st)) - {"_u32"}
        unknown = words - _C_WORDS - set(names) - {w for x in statements for w in
                                                   re.findall(r"^(\w+)\s*=", x)}
        if unknown or re.search(r"\b(?!_u32\()[A-Za-z_]\w*\s*\(", st):  # no calls
            raise TypeError(f"the CuPy stand-in does not read {st!r} ({sorted(unknown)})")
    return statements


def _run_c(statements, env: dict):
    scope = dict(env, _u32=lambda v: np.asarray(v).astype(np.uint32))
    with np.errstate(over="ignore"):
        for st in statements:
            exec(st, {"__builtins__": {}}, scope)  # noqa: S102 - checked above: arithmetic only
    return scope["out"]


def _check_types(params, dtypes, what):
    for i, (want, got) in enumerate(zip(params, dtypes)):
        if want != got:
            raise TypeError(f"Type is mismatched. {what}{i} {got} {want}")


def _spec_for(cls, args, kwargs):
    spec = SPECS.get(repr((cls, args, sorted(kwargs.items()))))
    if spec is None:
        raise RuntimeError(f"the CuPy stand-in runs only kernels that cuda_codegen.generate "
                           f"made; {cls} {args[-1]!r} is not one")
    return spec


def cupy_remainder(a, b, *args, **kwargs):
    """CuPy's ``remainder`` (``cupy._core._routines_math``): for floats ``a - floor(a / b) * b``
    — NaN for a finite ``a`` over an infinite ``b``, where NumPy's ``fmod``-based one gives ``a``
    (or ``b``); for integers NumPy's (0 for a divisor of 0)."""
    if np.result_type(a, b).kind != "f":
        return np.remainder(a, b, *args, **kwargs)
    with np.errstate(all="ignore"):
        return np.subtract(a, np.floor(np.true_divide(a, b)) * b, *args, **kwargs)


def integer_power(a, b):
    """CuPy's integer ``power`` (and the generated ``_ipow`` before issue 18's fix): by squaring,
    and for a negative exponent 0, or 1 / -1 for a base of 1 / -1 — never NumPy's ValueError."""
    a, b = np.broadcast_arrays(np.asarray(a), np.asarray(b))
    with np.errstate(over="ignore"):
        value = np.power(a, np.where(b < 0, 0, b).astype(b.dtype))
    if a.dtype.kind == "b":
        return value
    odd = (b % 2).astype(bool)
    small = np.where(a == 1, 1, np.where(a == -1, np.where(odd, -1, 1), 0)).astype(value.dtype)
    return np.where(b < 0, small, value)


def _evaluate(nodes, env, err=None):
    """The body's ops by the reference; ``broadcast_to`` is the identity, as in the kernel; an
    integer power is C's (``cuda_ops._ipow``): a negative exponent sets the error flag ``err``
    (the kernel's ``raw int32`` input) where the kernel has one, and is silent where not."""
    for node in nodes:
        args = [env[x.id] for x in node.inputs]
        if node.prim == "broadcast_to":
            env[node.out.id] = args[0]
        elif node.prim == "pow" and node.out.dtype.kind != "f":
            if err is not None and np.any(np.asarray(args[1]) < 0):
                err[0] = 1
            env[node.out.id] = integer_power(*args).astype(node.out.dtype)
        else:
            env[node.out.id] = reference_apply(node, args)
        if node.out.dtype == np.float16:
            env[node.out.id] = canonical_half_nans(env[node.out.id])
    return env


def canonical_half_nans(x):
    """A float16 the kernel makes from a float: the GPU's conversion gives a NaN the canonical
    NaN, its sign bit clear (``signbit(float16(copysign(NaN, -1.0f)))`` is false on an H200)."""
    x = np.asarray(x)
    if x.dtype != np.float16 or not np.isnan(x).any():
        return x
    return np.where(np.isnan(x), np.float16(np.nan), x).astype(np.float16)


def flush_denormals(x):
    """CuPy compiles every kernel with ``-ftz=true`` (``cupy/cuda/compiler.py``): a float32
    denormal that a generated kernel reads or makes is 0 (its sign kept). Applied to a fused
    group's inputs, constants and result; float16 is computed in float, whose denormals are far
    below float16's, and float64 is not flushed."""
    x = np.asarray(x)
    if x.dtype != np.float32:
        return x
    tiny = np.finfo(np.float32).tiny
    return np.where(np.abs(x) < tiny, np.copysign(np.float32(0), x), x).astype(np.float32)


def _inputs_env(spec, arrays):
    env = {}
    for i, x in enumerate(spec.body.graph.inputs):
        if i in spec.consts:
            env[x.id] = flush_denormals(np.asarray(spec.consts[i], x.dtype))
        else:
            env[x.id] = flush_denormals(arrays[spec.params.index(i)])
    return env


class ElementwiseKernel:
    def __init__(self, in_params, out_params, operation, name="kernel", **kwargs):
        args = (in_params, out_params, operation, name)
        key = repr(("ElementwiseKernel", args, sorted(kwargs.items())))
        self.in_types, self.out_types = _param_dtypes(in_params), _param_dtypes(out_params)
        self.raw = _raw_params(in_params) + _raw_params(out_params)
        self.model = MODELS.get(name) if key not in SPECS else None
        if key in SPECS:  # a fused group: its body's ops
            self.spec, self.program = SPECS[key], None
        elif self.model is not None:  # C with loops: its NumPy model (the C runs in a test)
            self.program = None
            self.spec = KernelSpec("elementwise", name, in_params, out_params, operation=operation,
                                   preamble=kwargs.get("preamble", ""))
        else:  # anything else: its C, read (or refused) now
            names = [p.split()[-1] for p in (in_params + "," + out_params).split(",") if p.strip()]
            self.program = _c_program(operation, names)
            self.names = names
            self.spec = KernelSpec("elementwise", name, in_params, out_params, operation=operation,
                                   preamble=kwargs.get("preamble", ""))
        self.real = REAL.ElementwiseKernel(*args, **kwargs) if REAL is not None else None

    def __call__(self, *args):
        ins, outs = args[:len(self.in_types)], args[len(self.in_types):]
        if len(ins) != len(self.in_types) or len(outs) != 1:
            raise TypeError(f"Wrong number of arguments for {self.spec.name!r}")
        for a in args:
            if not isinstance(a, ndarray):
                raise TypeError(f"Unsupported type {type(a)}")
        dtypes = tuple(a.dtype for a in ins), tuple(a.dtype for a in outs)
        _check_types(self.in_types, dtypes[0], "in")
        _check_types(self.out_types, dtypes[1], "out")
        if self.real is not None:
            self.real._decide_params_type(*dtypes)
        out = outs[0]
        shape = np.broadcast_shapes(*(a.shape for a, raw in zip(args, self.raw) if not raw))
        if not self.raw[-1] and shape != out.shape:  # a raw output is passed whole
            raise ValueError("Out shape is mismatched")
        written = [out._a] + [a._a for a, raw in zip(ins, self.raw) if raw]  # (a raw: a flag)
        _G.mutation(written, lambda: self._launch(args, ins, out, shape))
        return out

    def _launch(self, args, ins, out, shape):
        if self.model is not None:
            self.model(*[a._a if raw else np.broadcast_to(a._a, shape)
                         for a, raw in zip(args, self.raw)])
            return out
        if self.program is not None:
            env = {n: a._a if raw else np.broadcast_to(a._a, shape).reshape(-1)
                   for n, a, raw in zip(self.names, args, self.raw)}
            env["i"] = np.arange(out.size, dtype=np.int64)
            value = _run_c(self.program, env)
            out._a[...] = np.broadcast_to(np.asarray(value), (out.size,)).reshape(shape)
            return out
        raws = [a._a for a, raw in zip(ins, self.raw) if raw]
        env = _inputs_env(self.spec, [np.broadcast_to(a._a, shape)
                                      for a, raw in zip(ins, self.raw) if not raw])
        g = self.spec.body.graph
        value = _evaluate(g.nodes, env, raws[0] if raws else None)[g.outputs[0].id]
        out._a[...] = np.broadcast_to(flush_denormals(np.asarray(value).astype(out.dtype)), shape)
        return out


class ReductionKernel:
    def __init__(self, in_params, out_params, map_expr, reduce_expr, post_map_expr, identity,
                 name="reduce_kernel", **kwargs):
        args = (in_params, out_params, map_expr, reduce_expr, post_map_expr, identity, name)
        self.spec = _spec_for("ReductionKernel", args, kwargs)
        self.in_types, self.out_types = _param_dtypes(in_params), _param_dtypes(out_params)
        self.raw = _raw_params(in_params)
        self.real = REAL.ReductionKernel(*args, **kwargs) if REAL is not None else None

    def __call__(self, *ins, axis=None):
        return ndarray(_G.value_op(lambda: self._reduce(*ins, axis=axis),
                                   [getattr(a, "_a", None) for a in ins]))

    def _reduce(self, *ins, axis=None):
        if len(ins) != len(self.in_types):
            raise TypeError(f"Wrong number of arguments for {self.spec.name!r}")
        if not ins or not all(isinstance(a, ndarray) for a in ins):
            raise TypeError(f"{self.spec.name}: a ReductionKernel needs array arguments")
        dtypes = tuple(a.dtype for a in ins)
        _check_types(self.in_types, dtypes, "in")
        if self.real is not None:
            from cupy._core import _reduction  # the real one (kept in sys.modules)
            _reduction._decide_params_type(self.real.in_params, self.real.out_params, dtypes,
                                           ())
        raws = [a._a for a, raw in zip(ins, self.raw) if raw]
        err = raws[0] if raws else None
        arrays = np.broadcast_arrays(*(a._a for a, raw in zip(ins, self.raw) if not raw))
        shape = arrays[0].shape
        axes = tuple(range(len(shape))) if axis is None else \
            tuple(sorted(a % len(shape) for a in (axis if isinstance(axis, tuple) else (axis,))))
        g, red = self.spec.body.graph, self.spec.body.reduction
        pre, post = split_reduction(g.nodes, red)
        env = _evaluate(pre, _inputs_env(self.spec, arrays), err)
        acc = ACCUMULATOR[self.spec.reduce_type]  # the C type the kernel accumulates in
        value = np.asarray(env[red.inputs[0].id]).astype(acc)
        env[red.out.id] = np.asarray(IMPL[red.prim](np.broadcast_to(value, shape), axes=axes)
                                     ).astype(acc)
        env = _evaluate(post, env, err)
        return flush_denormals(np.array(env[g.outputs[0].id], dtype=self.out_types[0]))


# -- the module ---------------------------------------------------------------------------------
def _module_getattr(name):
    if name.startswith("__"):
        raise AttributeError(name)
    if name.startswith("_") and REAL is not None:  # the real CuPy's internals import "cupy"
        return getattr(REAL, name)
    if REAL is not None and not hasattr(REAL, name):
        raise AttributeError(f"module 'cupy' has no attribute {name!r}")
    obj = getattr(np, name)
    if callable(obj) and not isinstance(obj, type):
        return _checked(obj, name)
    return obj


def _scatter_add(out, index, g):
    """CuPy's atomic adds apply in no set order: here, last update first (so a result that
    relies on NumPy's order — ``np.add.at``'s, first to last — shows it)."""
    a, ix, gv = out._a, unwrap(index), unwrap(g)

    def add():
        pos = np.arange(a.size).reshape(a.shape)[ix]
        vals = np.broadcast_to(gv, pos.shape).reshape(-1)
        np.add.at(a.reshape(-1), pos.reshape(-1)[::-1], vals[::-1])
    _G.mutation([a], add)


def _segment_sum(p, pos, vals, out):
    """``cupy_scatter.segment_sum``: each run of equal sorted positions ``pos`` summed in order,
    from 0, into ``out[pos]`` (its C is compiled with NVRTC and run on the host by
    ``tests/test_cupy_scatter``)."""
    starts = np.flatnonzero(np.r_[True, pos[1:] != pos[:-1]])
    totals = np.zeros(starts.size, vals.dtype)
    np.add.at(totals, np.repeat(np.arange(starts.size), np.diff(np.r_[starts, pos.size])),
              vals)  # each run's adds in order, from 0
    out[pos[starts]] = totals


# kernels with loops, by name: NumPy models, called with the inputs and the output to write
MODELS = {"replicate_segment_sum": _segment_sum}


def _erf(x):
    from replicate.graph.special import erf
    a = x._a
    return wrap(_G.value_op(lambda: erf(a).astype(x.dtype), a))


def _as_strided(x, shape=None, strides=None):
    return ndarray(np.lib.stride_tricks.as_strided(x._a, shape, strides))


def _from_dlpack(array, *, device=None, copy=None):
    """Only CUDA memory comes in without a copy; no other library has any here."""
    if isinstance(array, ndarray):
        return array
    raise BufferError(f"cupy.from_dlpack: {type(array).__name__} is not in CUDA memory (the "
                      "stand-in has no GPU)")


def _make_modules() -> dict:
    cp = types.ModuleType("cupy", "the CuPy stand-in of the tests (tests/cupy_standin.py)")
    cp.__getattr__ = _module_getattr
    cp.__version__ = "standin"
    cp.ndarray, cp.asarray, cp.asnumpy = ndarray, asarray, asnumpy
    cp.ElementwiseKernel, cp.ReductionKernel = ElementwiseKernel, ReductionKernel
    cp.RawKernel = _RAW.RawKernel
    cp.STANDIN = True
    cp.get_default_memory_pool = _G.get_default_memory_pool
    # CuPy's sorts are stable whatever ``kind`` says (NumPy's default quicksort is not)
    cp.sort = _checked(lambda a, axis=-1, kind=None: np.sort(a, axis, kind="stable"), "sort")
    cp.argsort = _checked(lambda a, axis=-1, kind=None: np.argsort(a, axis, kind="stable"),
                          "argsort")
    cp.power = _checked(lambda a, b, *args, **kw: integer_power(a, b) if np.result_type(
        a, b).kind in "iub" else np.power(a, b, *args, **kw), "power")  # CuPy's: never raises
    cp.remainder = cp.mod = _checked(cupy_remainder, "remainder")
    cp.full, cp.full_like = _checked(_full, "full"), _checked(_full_like, "full_like")
    cp.left_shift = _checked(_gpu_shift(True), "left_shift")
    cp.right_shift = _checked(_gpu_shift(False), "right_shift")
    cp.lib = types.SimpleNamespace(stride_tricks=types.SimpleNamespace(as_strided=_as_strided))
    cp.cuda, nccl = _CUDA.make_cuda()
    cp.from_dlpack = _from_dlpack
    cp.linalg = types.ModuleType("cupy.linalg", "numpy.linalg on device arrays")
    for name in ("solve", "cholesky", "qr", "svd", "eigh", "det", "slogdet"):
        setattr(cp.linalg, name, _checked(getattr(np.linalg, name), f"linalg.{name}"))
    cx = types.ModuleType("cupyx", "the cupyx stand-in of the tests")
    cx.scatter_add = _scatter_add
    special = types.ModuleType("cupyx.scipy.special")
    special.erf = _erf
    scipy = types.ModuleType("cupyx.scipy")
    scipy.special, cx.scipy = special, scipy
    modules = {"cupy": cp, "cupyx": cx, "cupyx.scipy": scipy, "cupyx.scipy.special": special,
               "cupy.cuda.nccl": nccl}
    for name, module in modules.items():  # importlib.util.find_spec("cupy") works
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    return modules


def _record_generate():
    """Every kernel ``cuda_codegen.generate`` makes is registered, so a stand-in kernel built
    from its pieces knows the fused body it runs."""
    from replicate.backends import cuda_codegen
    original = cuda_codegen.generate
    if getattr(original, "standin", False):
        return

    def generate(node, consts, name):
        spec = original(node, consts, name)
        cls, args, kwargs = cuda_codegen.kernel_args(spec)
        SPECS[repr((cls, args, sorted(kwargs.items())))] = spec
        return spec
    generate.standin = True
    cuda_codegen.generate = generate


def real_gpu() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - not installed, no driver, no device
        return False


def install() -> bool:
    """Put the stand-in in place of ``cupy`` unless CuPy sees a GPU (or
    ``REPLICATE_CUPY_STANDIN=0``); True when it is in place.

    ``REPLICATE_CUPY_STANDIN=gpu-view`` puts it in place and has the tests see a GPU machine:
    ``ACTIVE`` stays False, so every test takes the path it takes on a GPU (it reads what the
    backend records, and skips what only the stand-in can check, saying "a GPU is here"). CI
    runs the cupy tests so (``tests/backends/test_gpu_check.py``): a test that passes only against
    the stand-in's internals fails there, before it fails on the first GPU.
    """
    global REAL, ACTIVE, INSTALLED
    if INSTALLED:
        return True
    mode = os.environ.get("REPLICATE_CUPY_STANDIN", "1")
    if mode not in ("0", "1", "gpu-view"):
        raise ValueError(f"REPLICATE_CUPY_STANDIN={mode!r}: expected 0, 1 or gpu-view")
    if mode == "0" or "replicate.backends.cupy_backend" in sys.modules or real_gpu():
        return False
    REAL = sys.modules.get("cupy")
    if REAL is not None:
        import cupy._core._reduction  # noqa: F401 - kept for the kernels' type checks
    sys.modules.update(_make_modules())
    _record_generate()
    _RAW.record()
    from replicate.backends import cuda_blas  # its libcublas: the stand-in's (host memory)
    cuda_blas.open_library = _BLAS.open_library
    INSTALLED, ACTIVE = True, mode != "gpu-view"
    return True
