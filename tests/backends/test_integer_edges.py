"""Integer edge cases where a backend must not give its own numbers (issue 18).

NumPy, the reference, raises "Integers to negative integer powers are not allowed." where XLA
and C give a number (XLA: 0 or garbage, silently). Every backend raises NumPy's ``ValueError``
there, naming the op and the user's line, and gives the reference's values otherwise. (The
integer ``//``, ``%``, ``abs`` and negation edges are cases of the op harness
(``tests/harness/ops_elementwise.py``) with the "edges" label, run on every backend by
``tests/backends/test_backend_parity.py``.)
"""

from __future__ import annotations

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from replicate.backends import available

BACKENDS = [pytest.param(b, marks=pytest.mark.skipif(
    b not in available(), reason=f"the {b} backend is not available (no {b} installed; for "
    "cupy: no GPU and the CuPy stand-in is off)")) for b in ("numpy", "jax", "cupy")]


def _steps():
    """A power alone, one in a reduction beside an array index (the JAX backend checks both
    in one program), and one in an int8 step."""
    return [lambda a, b: a ** b,
            lambda a, b: rnp.sum(a ** b * 2) + a[rnp.abs(b) % 3].sum(),
            lambda a, b: rnp.cast(a, "int8") ** rnp.cast(b, "int8") + 1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_integer_to_a_negative_integer_power_raises_numpys_error(backend):
    a, b = np.array([2, 3, -1, 1, 0], np.int32), np.array([3, 1, 2, -1, 0], np.int32)
    for k, fn in enumerate(_steps()):
        f = rp.function(fn, backend=backend)
        with pytest.raises(ValueError) as info:
            f(a, b)
        assert str(info.value) == "Integers to negative integer powers are not allowed."
        notes = getattr(info.value, "__notes__", [])
        assert any(n.startswith("  raised by pow(") and "test_integer_edges.py" in n
                   for n in notes), (k, notes)
        good = np.abs(b)
        want = rp.function(fn)(a, good)
        got = f(a, good)
        assert got.dtype == want.dtype and np.array_equal(got, want), (k, got, want)


def test_a_negative_power_known_when_traced_is_a_dtype_error_in_every_mode():
    """An exponent the trace knows (a Python int, a NumPy constant; every value in eager mode)
    fails before anything runs: ``DTypeError`` (a ``TypeError``), and a ``ValueError`` as
    NumPy's and the compiled step's (an exponent known at run time only): the NumPy habit
    ``except ValueError`` catches it in either mode."""
    x = np.array([2, 3], np.int64)
    for mode in ("graph", "eager"):
        with pytest.raises(rp.DTypeError, match="negative integer powers"):
            rp.function(lambda v: v ** -1, mode=mode)(x)
    with pytest.raises(rp.DTypeError, match="negative integer powers") as info:
        rp.function(lambda v, e: v ** e, mode="eager")(x, -x)
    assert isinstance(info.value, ValueError)
    for mode in ("graph", "eager"):  # the same program, an exponent from the data
        try:
            rp.function(lambda v, e: v ** e, mode=mode)(x, -x)
        except ValueError as e:
            assert "negative integer powers" in str(e), (mode, e)
        else:
            raise AssertionError(f"{mode}: no error")
