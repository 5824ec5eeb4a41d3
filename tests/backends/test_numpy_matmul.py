"""The NumPy backend's matrix product of a stack by one matrix: one BLAS call over the stack's
rows when they fold into a matrix without a copy, NumPy's own stacked product otherwise — the
same values for every layout of the stack (contiguous, transposed leading axes, a strided view,
an empty stack), checked against ``np.matmul``."""

from __future__ import annotations

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from replicate.backends import numpy_backend

rng = np.random.default_rng(3)


def layouts():
    base = rng.standard_normal((4, 5, 6, 7))
    return {
        "contiguous": base,
        "leading axes swapped": base.transpose(1, 0, 2, 3),
        "every other row": base[:, :, ::2],
        "a column slice": base[..., :5],
        "empty stack": base[:0],
    }


@pytest.mark.parametrize("layout", list(layouts()))
def test_the_folded_product_is_numpys(layout):
    a = layouts()[layout]
    b = rng.standard_normal((a.shape[-1], 3))
    out = np.empty(a.shape[:-1] + (3,))
    got = numpy_backend._matmul(a, b, out)
    assert got is out
    np.testing.assert_array_equal(out, np.matmul(a, b))


@pytest.mark.parametrize("layout", list(layouts()))
def test_in_a_compiled_step(layout):
    """Through the compiled step, where the operand may be a view the memory plan made."""
    a = np.ascontiguousarray(layouts()[layout])
    b = rng.standard_normal((a.shape[-1], 3))
    f = rp.function(lambda a, b: rnp.matmul(rnp.transpose(a, (1, 0, 2, 3)), b) * 2.0)
    np.testing.assert_allclose(np.asarray(f(a, b)), np.matmul(a.transpose(1, 0, 2, 3), b) * 2,
                               rtol=1e-13)


@pytest.mark.parametrize("layout", list(layouts()))
def test_the_reference_row_eager_mode_runs_is_numpys(layout):
    from replicate.graph.reference import IMPL

    a = layouts()[layout]
    b = rng.standard_normal((a.shape[-1], 3))
    np.testing.assert_array_equal(IMPL["matmul"](a, b), np.matmul(a, b))
    x = rp.function(lambda a, b: rnp.matmul(a, b), mode="eager")(a, b)
    np.testing.assert_array_equal(np.asarray(x), np.matmul(a, b))
