"""A negative class label or embedding id is an ``IndexError`` in every mode and backend, as in
PyTorch — never an index from the end (NumPy's indexing, which the library's gathers followed:
a label of -1 picked the last class and the loss came out a plausible number). The index
arrays of these gathers are marked ``NONNEGATIVE`` (``graph/index_bounds.py``) and each
backend's bounds check honours the mark: NumPy's rule, the host check of labels handed in, the
JAX backend's ``checkify`` and the CuPy backend's flag for labels made in the step.
``rnp.take`` and indexing keep NumPy's meaning of a negative index."""

from __future__ import annotations

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from conftest import column
from replicate.graph.index_bounds import NONNEGATIVE, index_axes

COUNT_FROM_0 = "count from 0: a negative one is an error"
MODES = ["eager", "numpy", "jax", "cupy"]
IDS = [column(m) for m in MODES]
LOGITS = np.log(np.array([[0.1, 0.2, 0.7], [0.3, 0.3, 0.4]]))


def compiled(step, mode):
    if mode == "eager":
        return rp.function(step, mode="eager")
    return rp.function(step, backend=mode)


def losses():
    """(name, step(logits, labels) -> per-example loss) of every loss that gathers labels."""
    return {
        "softmax_cross_entropy": lambda lg, y: rp.nn.softmax_cross_entropy(lg, y),
        "nll_loss": lambda lg, y: rp.nn.nll_loss(rp.nn.log_softmax(lg), y),
        "Categorical.log_prob": lambda lg, y: -rp.distributions.Categorical(lg).log_prob(y),
    }


@pytest.mark.parametrize("mode", MODES, ids=IDS)
@pytest.mark.parametrize("loss", sorted(losses()))
@pytest.mark.parametrize("made", ["handed in", "made in the step"])
def test_a_negative_label_is_an_index_error(mode, loss, made):
    fn = losses()[loss]
    if made == "handed in":
        step = fn
    else:  # (not a graph input: the JAX and CuPy backends check it on the device)
        def step(lg, y):
            return fn(lg, rnp.where(y >= 0, y * 1, y))
    f = compiled(step, mode)
    good = np.asarray(f(LOGITS, np.array([2, 0])))
    np.testing.assert_allclose(good, [-np.log(0.7), -np.log(0.3)], rtol=1e-12)
    with pytest.raises(IndexError, match=COUNT_FROM_0) as e:
        f(LOGITS, np.array([2, -1]))
    assert str(e.value).startswith("index -1 is out of bounds for axis "), e.value
    with pytest.raises(IndexError, match="index 3 is out of bounds"):
        f(LOGITS, np.array([3, 0]))


@pytest.mark.parametrize("mode", MODES, ids=IDS)
def test_nll_loss_still_ignores_its_ignore_index(mode):
    f = compiled(lambda lg, y: rp.nn.nll_loss(lg, y, "sum"), mode)
    assert float(f(np.log(np.full((2, 3), 0.5)), np.array([-100, 1]))) == \
        pytest.approx(np.log(2))
    with pytest.raises(IndexError, match="index -99 is out of bounds for axis 1 with size 3"):
        f(LOGITS, np.array([-99, 1]))
    with pytest.raises(IndexError, match=COUNT_FROM_0):
        f(LOGITS, np.array([-100, -1]))


@pytest.mark.parametrize("mode", MODES, ids=IDS)
def test_a_negative_embedding_id_is_an_index_error(mode):
    emb = rp.nn.Embedding(5, 2, rng=np.random.default_rng(0))
    f = compiled(lambda ids: rnp.sum(emb(ids) * 2.0, axis=-1), mode)
    table = np.asarray(emb.weight.read().numpy() if hasattr(emb.weight.read(), "numpy")
                       else emb.weight.read())
    np.testing.assert_allclose(np.asarray(f(np.array([4, 0]))), table[[4, 0]].sum(-1) * 2,
                               rtol=1e-6)
    with pytest.raises(IndexError, match=COUNT_FROM_0) as e:
        f(np.array([[0, 1], [2, -5]]))
    assert str(e.value).startswith("index -5 is out of bounds for axis 0 with size 5")


@pytest.mark.parametrize("mode", MODES, ids=IDS)
def test_the_gradient_of_a_checked_gather_is_the_plain_ones(mode):
    """The mark changes no value: the loss and its gradient with labels in range are those of
    the unmarked gather, bit for bit."""
    def loss(nonnegative):
        def step(lg, y):
            def total(x):
                picked = rnp.take_along_axis(rp.nn.log_softmax(x), rnp.expand_dims(y, -1), -1,
                                             nonnegative=nonnegative)
                return -rnp.sum(picked)
            return rp.value_and_grad(total)(lg)
        return step

    y = np.array([2, 1])
    marked = [np.asarray(v) for v in compiled(loss(True), mode)(LOGITS, y)]
    plain = [np.asarray(v) for v in compiled(loss(False), mode)(LOGITS, y)]
    for a, b in zip(marked, plain):
        np.testing.assert_array_equal(a, b)
    assert np.abs(marked[1]).max() > 0.1


@pytest.mark.parametrize("mode", MODES, ids=IDS)
def test_numpy_indexing_keeps_counting_from_the_end(mode):
    f = compiled(lambda t, i: rnp.take(t, i, axis=0) + t[i], mode)
    t = np.arange(10.0).reshape(5, 2)
    np.testing.assert_array_equal(np.asarray(f(t, np.array([-1, 0]))), 2 * t[[-1, 0]])
    g = compiled(lambda t, i: rnp.take(t, i, axis=0, nonnegative=True), mode)
    with pytest.raises(IndexError, match=COUNT_FROM_0):
        g(t, np.array([-1, 0]))


def test_a_replicated_step_with_a_negative_label_stops_with_the_index_error():
    model = rp.nn.Linear(3, 3, rng=np.random.default_rng(0))
    batches = [(np.ones((2, 3), np.float32), np.array([0, 1])),
               (np.ones((2, 3), np.float32), np.array([0, -1]))]

    def step(batch):
        x, y = batch
        return {"loss": rnp.mean(rp.nn.softmax_cross_entropy(model(x), y))}

    rep = rp.Replicator(lambda ctx: iter(batches), step)
    with pytest.raises(IndexError, match=COUNT_FROM_0):
        rep.run()
    assert rep.step == 1


def test_the_mark_sets_the_lowest_index_of_its_axis_only():
    index = (("slice", None, None, None), ("array", 0, NONNEGATIVE), ("array", 1))
    arrays = [np.array([0]), np.array([0])]
    assert [(ax, n, low) for ax, _, n, low in index_axes((4, 5, 6), index, arrays)] == \
        [(1, 5, 0), (2, 6, -6)]
