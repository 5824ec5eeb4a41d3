"""Every kernel the cupy backend generates compiles and runs, without a GPU.

* The sweep: every fusible primitive (``fuse="map"``/``"reduce"``) in a fused group, in every
  dtype it takes (float16, float32, float64, int32, int64, bool; casts to int8 and uint8), run on
  the cupy backend (on a machine without a GPU: the CuPy stand-in of ``cupy_standin.py``) against
  the NumPy reference, each fused group one launch; CuPy's CUB reduction path (one contiguous
  input, 128 or more elements reduced) in one and two passes.
* Every launch of the sweep and of the MLP, conv and WGAN-GP steps (the MLP with a batch of 256)
  built through CuPy's own kernel machinery and compiled
  with NVRTC for sm_90 (``cupy_nvrtc.py``).
* The fixes of issue 18 each have a test here or in ``test_cuda_codegen.py``: the shape of a
  group whose epilogue would broadcast, float16 accumulation, integer powers, a reduction over
  constants only, an unfused logistic on device arrays.
"""

from __future__ import annotations

import sys

import cupy_nvrtc
import cupy_standin
import numpy as np
import pytest
from harness import steps as modes

import replicate as rp
import replicate.numpy as rnp
from replicate.backends import available
from replicate.backends.cuda_launches import LAUNCHES
from replicate.graph.primitives import REGISTRY, prims_where

pytestmark = pytest.mark.skipif("cupy" not in available(), reason=(
    "the cupy backend is not available: no GPU, and the CuPy stand-in is off "
    "(REPLICATE_CUPY_STANDIN=0)"))
F16, F32, F64, I32, I64 = (np.dtype(t) for t in ("float16", "float32", "float64", "int32",
                                                 "int64"))


def _unary_float(x, y):
    """Each float op on its own fused input (a distinct scale, so CSE keeps them apart)."""
    s = iter(np.linspace(1.0, 1.5, 40).tolist())
    pos = lambda: x * next(s)  # noqa: E731 - positive
    sig = lambda: y * next(s)  # noqa: E731 - either sign
    return [rnp.exp(sig()), rnp.log(pos()), rnp.log1p(pos()), rnp.expm1(sig()), rnp.sqrt(pos()),
            rnp.rsqrt(pos()), rnp.tanh(sig()), rnp.sin(sig()), rnp.cos(sig()),
            rnp.sigmoid(sig()), rnp.floor(sig()), rnp.ceil(sig()), rnp.round(sig()),
            rnp.erf(sig()), rnp.isfinite(sig()), rnp.clip(sig(), -1.0, 1.0),
            rnp.power(pos(), y), rnp.divide(sig(), x),
            rnp.tan(sig()), rnp.sinh(sig()), rnp.cosh(sig()), rnp.arcsin(sig() * 0.3),
            rnp.arccos(sig() * 0.3), rnp.arctan(sig()), rnp.arcsinh(sig()),
            rnp.arccosh(pos() + 1.0), rnp.arctanh(sig() * 0.3), rnp.log2(pos()),
            rnp.log10(pos()), rnp.arctan2(sig(), y), rnp.logaddexp(sig(), y),
            rnp.signbit(sig()), rnp.copysign(pos(), y), rnp.hypot(sig(), y)]


def _numeric(x, y):
    """Ops every numeric dtype takes; ``y`` is never 0."""
    k = iter(range(1, 40))
    a = lambda: x + x.dtype.type(next(k))  # noqa: E731 - a distinct input per op
    return [rnp.negative(a()), rnp.abs(a() - y), rnp.sign(a() - y), rnp.add(a(), y),
            rnp.subtract(a(), y), rnp.multiply(a(), y), rnp.maximum(a(), y),
            rnp.minimum(a(), y), rnp.mod(a(), y), a() // y,  # float floor_divide; integers: div
            rnp.equal(a(), y), rnp.not_equal(a(), y),
            rnp.less(a(), y), rnp.less_equal(a(), y), rnp.greater(a(), y),
            rnp.greater_equal(a(), y), rnp.where(a() > y, a(), y),
            rnp.broadcast_to(a()[0], (4, 3)) * y,  # broadcasting inside a kernel
            rnp.sum(a() * y, axis=1) * 2, rnp.prod(a() * y, axis=0),
            rnp.max(a() * y) + 1, rnp.min(a() - y, axis=1),
            *[rnp.cast(a() * y, t) for t in ("int8", "uint8", "int32", "float32", "bool")]]


def _integer(x, y):
    k, j = iter(range(1, 10)), iter(range(1, 10))
    a = lambda: x + x.dtype.type(next(k) % 3)  # noqa: E731 - small bases
    b = lambda: x - x.dtype.type(next(j))  # noqa: E731 - a distinct input per op, negatives too
    return [a() // y, rnp.power(a(), rnp.abs(y)), ~a(),  # integer pow: by squaring; bitwise not
            b() & y, b() | y, b() ^ y, b() << y, b() >> y,  # y < 0: every bit shifted out
            b() << (y * 20), b() >> (y * 13)]  # counts past the width: 0 or -1, as NumPy


def _boolean(x, y):
    k = iter(np.linspace(-0.5, 0.5, 16).tolist())
    p = lambda: x > next(k)  # noqa: E731 - a distinct input per op
    q = lambda: y > next(k)  # noqa: E731
    return [rnp.logical_and(p(), q()), rnp.logical_or(p(), q()), rnp.logical_not(p()),
            rnp.where(p(), x, y), rnp.sum(p() & q()), rnp.max(p() | q(), axis=0)]


def _cub(w):
    """Single contiguous input, >= 128 elements reduced: CuPy's CUB block reduction."""
    return [rnp.sum(w * 2.0, axis=1), rnp.max(w * 3.0) + 1.0]


def _inputs(dtype):
    rng = np.random.default_rng(0)
    x = rng.uniform(0.5, 2.0, (4, 3))
    y = rng.uniform(-2.0, 2.0, (4, 3))
    if dtype.kind in "iu":
        x, y = np.round(x * 2), np.where(y < 0, -1.0, 1.0) * np.ceil(np.abs(y) + 0.1)
    return x.astype(dtype), y.astype(dtype)


PROGRAMS = [(F16, _unary_float), (F32, _unary_float), (F64, _unary_float),
            (F16, _numeric), (F32, _numeric), (F64, _numeric), (I32, _numeric),
            (I64, _numeric), (I32, _integer), (I64, _integer), (F64, _boolean)]
CUB = [(F16, (2, 256))]  # float16: the typedefs, its header, the float accumulator


def _tolerance(dtype):
    return {"float16": 2e-3, "float32": 1e-5, "float64": 1e-12}.get(np.dtype(dtype).name, 0)


def _run(fn, args):
    """(fused nodes, fused-kernel launches, mismatches) of ``fn`` on cupy against numpy (the
    launches as the backend records them: ``cuda_launches.LAUNCHES``)."""
    with np.errstate(all="ignore"):
        want = rp.function(fn)(*args)
        f = rp.function(fn, backend="cupy")
        graph = f.executable(*args).graph
        with LAUNCHES.recording() as seen:
            got = f(*args)
        calls = seen.fused
    fused = [n for n in graph.nodes if n.prim == "fused"]
    bad = []
    for i, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g)
        tol = _tolerance(w.dtype)
        if g.shape != w.shape or g.dtype != w.dtype or not np.allclose(
                g, w, rtol=tol, atol=tol, equal_nan=True):
            bad.append(f"{fn.__name__}[{i}] {w.dtype}{list(w.shape)}: {g} != {w}")
    return fused, calls, bad


@pytest.fixture(scope="module")
def sweep():
    """Run the sweep once: (prims inside fused groups, launches recorded, mismatches, [(fused
    groups, launches)] per program)."""
    prims, bad, counts = set(), [], []
    runs = [(fn, _inputs(dtype)) for dtype, fn in PROGRAMS] + [
        (_cub, (np.linspace(0.5, 1.5, int(np.prod(shape))).reshape(shape).astype(dtype),))
        for dtype, shape in CUB]
    with LAUNCHES.recording() as seen:
        for fn, args in runs:
            fused, calls, mismatches = _run(fn, args)
            prims |= {n.prim for f in fused for n in f.attrs["body"].graph.nodes}
            bad += mismatches
            counts.append((fn.__name__, len(fused), calls))
    return prims, seen.signatures, bad, counts


def test_sweep_matches_the_reference(sweep):
    _, _, bad, _ = sweep
    assert bad == []


def test_sweep_covers_every_fusible_primitive(sweep):
    prims, launches, _, counts = sweep
    fusible = prims_where(fuse="map") | prims_where(fuse="reduce")
    # stop_gradient is the identity (a view): nothing to generate; custom_vjp never fuses
    assert fusible - prims - {"stop_gradient"} == set()
    assert all(REGISTRY[p].fuse for p in prims if p != "const")
    paths = {s[-1] for s in launches if s[0] == "reduction"}
    assert paths == {"simple", "cub", "cub-two-pass"}
    # each fused group is one launch: no group fell back to op-by-op
    for name, fused, calls in counts:
        assert fused > 1 and calls == fused, name


def _compile_or_skip(launches):
    if not cupy_standin.ACTIVE:
        pytest.skip("a GPU is here: CuPy compiled every kernel it ran")
    reason = cupy_nvrtc.missing()
    if reason:
        pytest.skip(reason)
    n, failures = cupy_nvrtc.compile_all(launches)
    report = "\n\n".join(f"{label}:\n{log[:3000]}" for label, log, _ in failures)
    assert failures == [], report
    return n


def test_every_sweep_kernel_compiles_with_nvrtc(sweep):
    assert _compile_or_skip(sweep[1]) >= len(sweep[1])


def test_every_kernel_of_the_model_steps_is_one_generated_kernel_and_compiles():
    """The MLP (batch 256), the conv net and the WGAN-GP steps: every fused group is one
    generated kernel (one launch each, no op-by-op fallback), the results are NumPy's, and every
    kernel compiles."""
    rng = np.random.default_rng(1)
    batches = {"mlp": [(rng.standard_normal((256, 4)), rng.integers(0, 3, 256))],
               "conv": modes.CNN_BATCHES[:1], "wgan-gp": modes.GP_BATCHES[:1]}
    steps = {"mlp": (modes.make_mlp_step, modes.MLP_INIT),
             "conv": (modes.make_cnn_step, modes.CNN_INIT),
             "wgan-gp": (modes.make_gp_step, modes.GP_INIT)}
    launched = {}
    for model, (make, init) in steps.items():
        outs = {}
        for backend in ("numpy", "cupy"):
            params = modes.variables(init)
            f = rp.function(make(params), backend=backend)
            graph = f.executable(*batches[model][0]).graph
            with LAUNCHES.recording() as seen:
                outs[backend] = (f(*batches[model][0]), modes.snapshot(params))
            calls = seen.fused
            launched.update(seen.signatures)
        fused = [n for n in graph.nodes if n.prim == "fused"]
        assert len(fused) >= 3, model
        assert calls == len(fused), f"{model}: {calls} launches for {len(fused)} fused groups"
        for a, b in zip(outs["cupy"][1].values(), outs["numpy"][1].values()):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12, err_msg=model)
    _compile_or_skip(launched)


# -- the findings of issue 18, one test each where the sweep does not name them -----------------
def test_an_epilogue_that_broadcasts_is_not_fused_into_the_reduction():
    """A ``broadcast_to`` after a reduction is the identity in a kernel's epilogue: fused, the
    result had the reduced shape (() for (4, 3)). The group is not formed; the shape is right."""
    x = np.arange(12.0).reshape(4, 3)
    for fn in (lambda x: rnp.broadcast_to(rnp.sum(x * 2.0), (4, 3)) + 1.0,
               lambda x: rnp.sum(x * x) * np.ones((1, 1))):
        got, want = rp.function(fn, backend="cupy")(x), rp.function(fn)(x)
        assert got.shape == want.shape and np.allclose(got, want)


def test_parameter_lists_are_read_as_numpy_dtypes_by_cupy():
    """CuPy parses "float in0" as float64: a float32 argument is "Type is mismatched". The
    backend's kernel names its float32 parameters ``float32``; a kernel that says ``float``,
    built by ``cupy`` (the real one on a GPU), refuses a float32 argument."""
    import cupy

    f = rp.function(lambda x: rnp.tanh(x * 2.0) + 1.0, backend="cupy")
    with LAUNCHES.recording() as seen:
        assert f(np.ones(3, np.float32)).dtype == np.float32
    (spec,) = seen.signatures.values()
    assert spec.in_params == "float32 in0" and spec.out_params == "float32 out0", spec
    kernel = cupy.ElementwiseKernel("float x", "float y", "y = x", "replicate_float_params")
    x = cupy.asarray(np.ones(3, np.float32))
    with pytest.raises(TypeError, match="Type is mismatched"):
        kernel(x, cupy.empty(3, cupy.float64))


def test_float16_reductions_accumulate_in_float():
    """10 000 float16 ones sum to 10 000 (accumulated in half: 2 048)."""
    f = rp.function(lambda x: rnp.sum(x * 1.0), backend="cupy")
    with LAUNCHES.recording() as seen:
        assert float(f(np.ones(10_000, np.float16))) == 10_000.0
    spec = next(s for s in seen.signatures.values() if s.kind == "reduction")
    assert spec.reduce_type == "float" and spec.out_params == "float16 out0"
    assert "#include <cupy/float16.cuh>" in spec.preamble


def test_a_reduction_over_constants_only_has_an_array_argument():
    """Nothing but constants (too large to fold): the kernel still gets an array, so CuPy knows
    the loop's size."""
    f = rp.function(lambda x: rnp.sum(rnp.full((100, 100), 2.0) * 3.0) + x, backend="cupy")
    assert float(f(np.float64(1.0))) == 60_001.0


def test_unfused_logistic_and_erf_run_on_device_arrays():
    """A row that calls NumPy on a device array raises in CuPy (np.asarray refuses it)."""
    opts = {"disable": {"fusion"}}
    for fn in (rnp.sigmoid, rnp.erf):
        x = np.linspace(-3, 3, 7)
        got = rp.function(fn, backend="cupy", options=opts)(x)
        np.testing.assert_allclose(got, rp.function(fn)(x), rtol=1e-12)
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.asarray(sys.modules["cupy"].asarray(x))


def test_missing_cupy_names_both_extras(monkeypatch):
    from replicate.backends import get_backend

    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy now raises ImportError
    monkeypatch.delitem(sys.modules, "replicate.backends.cupy_backend", raising=False)
    with pytest.raises(rp.ReplicateError, match=r"replicate\[cuda12\].*replicate\[cuda13\]"):
        get_backend("cupy")


def test_random_bits_are_the_reference_hash_made_on_the_device_and_compile():
    """The random kernel (``cuda_random.py``) run as written by the stand-in gives NumPy's bits,
    for every stream the draws use (uniform, split, fold-in); NVRTC compiles it."""
    def draws(k):
        return (rnp.random.uniform(k, (3, 5)), rnp.random.split(k, 3),
                rnp.random.fold_in(k, 7), rnp.random.uniform(k, (4,), np.float64))

    key = rnp.random.key(2**33 + 5).numpy()
    with LAUNCHES.recording() as seen:
        draws_on_device = rp.function(draws, backend="cupy")(key)
    for got, want in zip(draws_on_device, rp.function(draws)(key)):
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
    random = seen.named("replicate_random_bits_")
    # the draws' streams (uniform, split, fold-in), each its own generated kernel
    assert len({s.name for s in random.values()}) >= 2 and seen.fused == 0
    _compile_or_skip(random)


def test_an_integer_to_a_negative_integer_power_raises_as_in_numpy():
    """NumPy raises "Integers to negative integer powers are not allowed."; CuPy's ``power``
    and a kernel's integer power by squaring gave 0 (1 or -1 for a base of 1 or -1) silently.
    Fused (elementwise, in a reduction's prologue) and unfused, the call raises NumPy's error,
    naming the user's line, from the flag read at its end; the kernels compile."""
    x, e = np.array([2, 3, 1], np.int32), np.array([1, -1, 2], np.int32)
    steps = [(lambda a, b: a ** b + 1, {}), (lambda a, b: rnp.sum(a ** b * 2), {}),
             (lambda a, b: a ** b, {"disable": {"fusion"}})]
    with LAUNCHES.recording() as seen:
        for fn, opts in steps:
            f = rp.function(fn, backend="cupy", options=opts)
            with pytest.raises(ValueError, match="negative integer powers") as info:
                f(x, e)
            assert any("raised by pow(" in n and "test_cupy_kernels.py" in n
                       for n in info.value.__notes__)
            np.testing.assert_array_equal(f(x, np.abs(e)), rp.function(fn)(x, np.abs(e)))
    fused = [s for s in seen.signatures.values() if s.body is not None]
    assert len(fused) == 2 and all(s.flag and "raw int32 err_flag" in s.in_params
                                   for s in fused)
    _compile_or_skip(seen.signatures)


def test_float32_denormals_are_flushed_to_zero_in_generated_kernels():
    """The GPU difference kept (guides/gpu.md): CuPy compiles every kernel with flush-to-zero,
    so a float32 denormal read or made by a fused group is 0, sign kept; float64 keeps them.
    The stand-in flushes as the GPU does, so a test that relies on float32 denormals fails
    here too."""
    tiny = np.finfo(np.float32).tiny
    x = np.array([tiny / 4, -tiny / 4, tiny, 1.0], np.float32)
    def fn(x):
        return x * 1.5 * 2.0

    with LAUNCHES.recording() as seen:
        got = np.asarray(rp.function(fn, backend="cupy")(x))
    assert seen.fused == 1
    assert rp.function(fn)(x)[0] != 0  # NumPy keeps the denormal
    np.testing.assert_array_equal(got, np.array([0.0, -0.0, tiny * 3, 3.0], np.float32))
    assert np.signbit(got[1])
    x64 = x.astype(np.float64) * 1e-270  # float64 denormals (below 2.2e-308)
    np.testing.assert_array_equal(rp.function(fn, backend="cupy")(x64), rp.function(fn)(x64))
