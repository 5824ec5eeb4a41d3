"""The CuPy backend's scatter-add (the gradient of every gather) is deterministic and NumPy's:
``cupy_scatter.py`` sorts the updates' positions stably and sums each position's run in order,
where ``cupyx.scatter_add``'s atomics add in no set order (the CuPy stand-in applies them last
to first, so a result that relies on the order shows). Checked bitwise against the NumPy
reference through the stand-in; the segment-sum kernel compiled with NVRTC and its C run on the
host. Nothing is read back to the host between the sort and the sums (no synchronisation)."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from test_cupy_kernels import _compile_or_skip

import replicate as rp
from replicate.backends import available
from replicate.backends.cuda_launches import LAUNCHES

pytestmark = pytest.mark.skipif("cupy" not in available(), reason=(
    "the cupy backend is not available: no GPU, and the CuPy stand-in is off"))
ORDERED = np.array([1.0, 1e8, -1e8, 3.0, 0.5, 2.0**-30], np.float32)  # order changes the sum
ORDERED16 = np.array([2.0**-10, 6e4, -6e4, 3.0, 0.5, 2.0**-14], np.float16)  # (in float32)


def _grads(index, shape, dtype=np.float32, axis=0):
    """d/dw sum(w[index] * up), ``up`` varying along the gathered value's ``axis`` (where the
    repeated indices are) so that each element's sum depends on the order of its updates."""
    w = rp.Variable(np.zeros(shape, dtype), name="w")
    gathered = np.zeros(shape)[index].shape
    along = [1] * len(gathered)
    along[axis] = gathered[axis]
    ordered = ORDERED16 if dtype == np.float16 else ORDERED
    up = np.broadcast_to(np.resize(ordered, gathered[axis]).reshape(along), gathered)

    def step(up):
        return rp.grad((w[index] * up).sum(), w)
    return [np.asarray(rp.function(step, backend=b)(up.astype(dtype)))
            for b in ("numpy", "cupy", "cupy")]


@pytest.mark.parametrize("case", ["embedding", "pairs", "slice_and_array", "float16"])
def test_gather_gradients_are_numpys_bits_every_run(case):
    args = {
        "embedding": (np.array([1, 1, 1, 4, -1, 0, 3]), (6, 3), np.float32, 0),
        "pairs": ((np.array([0, 0, 0, 2, 2]), np.array([1, 1, 1, 1, 0])), (3, 2), np.float32, 0),
        "slice_and_array": ((slice(None), np.array([2, 2, 2, 0])), (2, 3), np.float32, 1),
        "float16": (np.array([2, 2, 2, 0]), (3, 2), np.float16, 0),
    }[case]
    want, got, again = _grads(*args)
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), (got, want)
    assert again.tobytes() == got.tobytes()


def test_the_segment_sum_kernel_compiles():
    with LAUNCHES.recording() as seen:
        _grads(np.array([1, 1, 0]), (2, 2))
    launched = seen.named("replicate_segment_sum")
    assert launched
    _compile_or_skip(launched)


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler (g++) installed")
def test_the_segment_sum_c_adds_each_run_in_order_from_zero(tmp_path):
    """The kernel's C, one thread per sorted update (a loop here, ``_ind.size()`` the count),
    run on the host: each run's first thread writes its sum, ``np.add.at``'s bit for bit; the
    other threads write nothing."""
    from replicate.backends.cupy_scatter import segment_sum

    vals = np.resize(ORDERED, 11)
    pos = np.array([0, 0, 0, 2, 5, 5, 5, 5, 5, 6, 6])  # sorted; 1, 3 and 4 get nothing
    _, _, operation, _ = segment_sum(np.float32)
    source = (
        "#include <cstdio>\nint main() {\n"
        f"  const float vals[] = {{{', '.join(float(v).hex() for v in vals)}}};\n"
        f"  const long long pos[] = {{{', '.join(map(str, pos))}}};\n"
        "  float out[7]; for (int j = 0; j < 7; ++j) out[j] = -1.0f;  // untouched: -1\n"
        f"  struct {{ long long size() const {{ return {pos.size}; }} }} _ind;\n"
        f"  for (long long i = 0; i < {pos.size}; ++i) {{\n"
        f"    const long long p = pos[i];\n    {operation}\n  }}\n"
        "  for (int j = 0; j < 7; ++j) printf(\"%a\\n\", (double)out[j]);\n}\n")
    (tmp_path / "s.cpp").write_text(source)
    built = subprocess.run(["g++", "-O2", "-o", "s", "s.cpp"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    out = subprocess.run(["./s"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    want = np.full(7, -1.0, np.float32)
    want[np.unique(pos)] = 0
    np.add.at(want, pos, vals)
    got = np.array([float.fromhex(v) for v in out.stdout.split()], np.float32)
    assert got.tobytes() == want.tobytes()
