"""A runtime error inside a compiled step names the op and the user's line that made it, on every
backend, as eager mode's traceback does (issue 14, item 4); and an out-of-range index is never
a silently clamped value (XLA clamps gathers: the JAX backend checks them)."""

from __future__ import annotations

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from replicate.backends import available
from replicate.graph.index_check import index_bounds_error

BACKENDS = ["numpy", "jax", pytest.param("cupy", marks=pytest.mark.skipif(
    "cupy" not in available(), reason="needs CuPy and an NVIDIA GPU (CuPy wraps an out-of-range "
    "index around: the backend checks)"))]


def embedding_step():
    emb = rp.nn.Embedding(10, 4)

    def step(ids):
        h = emb(ids)  # MARK lookup
        return rnp.tanh(h * 2.0).sum()

    return step


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_of_range_index_in_a_compiled_step_names_the_line(backend):
    f = rp.function(embedding_step(), backend=backend)
    assert np.isfinite(f(np.array([1, 2, 9])))
    with pytest.raises(IndexError, match="index -1 is out of bounds"):  # (PyTorch's rule: an id
        f(np.array([1, 2, -1]))                                           # is not from the end)
    with pytest.raises(IndexError, match="12 is out of bounds") as e:
        f(np.array([1, 2, 12]))
    report = "\n".join(getattr(e.value, "__notes__", [])) + str(e.value)
    assert "getitem(f32[10,4], i64[3])" in report and "MARK lookup" in report, report


def test_out_of_range_index_in_eager_mode_is_an_index_error():
    f = rp.function(embedding_step(), mode="eager")
    with pytest.raises(IndexError, match="12 is out of bounds"):
        f(np.array([1, 2, 12]))
    with pytest.raises(rp.IndexOutOfRangeError):
        f(np.array([1, 2, -11]))


def test_out_of_range_index_in_a_replicator_graph_step_names_the_line():
    step = embedding_step()
    rep = rp.Replicator(lambda ctx: iter([np.array([1, 2]), np.array([3, 40])]),
                        lambda ids: {"y": step(ids)}, replicas_per_rank=2)
    with pytest.raises(IndexError) as e:
        rep.run()
    assert "MARK lookup" in "\n".join(getattr(e.value, "__notes__", [])) + str(e.value)
    assert rep.step == 1


def test_index_bounds_error_finds_the_axis_of_each_index_array():
    """The check the CuPy backend runs before indexing (CuPy wraps out-of-range indices)."""
    ix = (("ellipsis",), ("array", 0))
    assert index_bounds_error((2, 3, 5), ix, [np.array([4, -5])]) is None
    assert index_bounds_error((2, 3, 5), ix, [np.array([0, 5])]) == \
        "index 5 is out of bounds for axis 2 with size 5"
    ix = (("int", 1), ("none",), ("array", 0), ("array", 1))
    mine = index_bounds_error((2, 3, 5), ix, [np.array([2]), np.array([-6])])
    with pytest.raises(IndexError) as numpys:
        np.zeros((2, 3, 5))[1, None, np.array([2]), np.array([-6])]
    assert mine == str(numpys.value) == "index -6 is out of bounds for axis 2 with size 5"
