"""Default random seeds never collide (issue 13).

``rp.nn.Dropout()`` and ``rnp.random.Generator()`` without a seed used to take seed 0, so two
default layers drew identical masks. Now the n-th generator created without a seed takes the n-th
default seed of the process: every default stream differs, the same program gives the same
streams in every run (and on every rank), explicit seeds keep their streams, and
``rnp.random.seed(base)`` restarts the count.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from conftest import ROOT, run

MODES = ["graph", "eager"]


class TwoDropouts(rp.nn.Module):
    def __init__(self, seeds=(None, None)):
        super().__init__()
        self.a = rp.nn.Dropout(0.5, seed=seeds[0])
        self.b = rp.nn.Dropout(0.5, seed=seeds[1])

    def forward(self, x):
        return self.a(x), self.b(x)


def masks(model, mode, n=256, steps=2):
    """The keep-masks of both layers over ``steps`` calls of one compiled step."""
    step = rp.function(model, mode=mode)
    out = [step(np.ones(n, np.float32)) for _ in range(steps)]
    return [(ya != 0, yb != 0) for ya, yb in out]


@pytest.mark.parametrize("mode", MODES)
def test_two_default_dropouts_in_one_model_draw_different_masks(mode):
    for a, b in masks(TwoDropouts(), mode):
        assert not np.array_equal(a, b)
        assert 0.3 < a.mean() < 0.7 and 0.3 < b.mean() < 0.7


@pytest.mark.parametrize("mode", MODES)
def test_explicit_equal_seeds_give_equal_masks(mode):
    for a, b in masks(TwoDropouts(seeds=(7, 7)), mode):
        np.testing.assert_array_equal(a, b)
    first = masks(TwoDropouts(seeds=(7, 8)), mode)
    again = masks(TwoDropouts(seeds=(7, 8)), mode)
    for (a1, b1), (a2, b2) in zip(first, again):
        np.testing.assert_array_equal(a1, a2)
        np.testing.assert_array_equal(b1, b2)
        assert not np.array_equal(a1, b1)


def test_explicit_seeds_keep_their_streams():
    """An explicit seed gives the same stream whatever was created before it."""
    a = rnp.random.Generator(seed=3).uniform((8,)).numpy()
    for _ in range(3):
        rnp.random.Generator()
    b = rnp.random.Generator(seed=3).uniform((8,)).numpy()
    np.testing.assert_array_equal(a, b)


def test_two_default_generators_differ_and_differ_from_small_explicit_seeds():
    gens = [rnp.random.Generator() for _ in range(4)]
    seeds = [g.seed for g in gens]
    assert len(set(seeds)) == 4
    draws = [g.uniform((16,)).numpy() for g in gens]
    explicit = [rnp.random.Generator(seed=s).uniform((16,)).numpy() for s in range(4)]
    everything = draws + explicit
    for i in range(len(everything)):
        for j in range(i):
            assert not np.array_equal(everything[i], everything[j]), (i, j)


def test_seed_restarts_the_default_count():
    rnp.random.seed(5)
    first = [rnp.random.Generator().uniform((8,)).numpy() for _ in range(2)]
    rnp.random.seed(5)
    again = [rnp.random.Generator().uniform((8,)).numpy() for _ in range(2)]
    rnp.random.seed(6)
    other = rnp.random.Generator().uniform((8,)).numpy()
    for f, a in zip(first, again):
        np.testing.assert_array_equal(f, a)
    assert not np.array_equal(first[0], first[1])
    assert not np.array_equal(first[0], other)


PROGRAM = """
import sys
import numpy as np
sys.path.insert(0, {root!r})
import replicate as rp
import replicate.numpy as rnp

first, second = rp.nn.Dropout(0.5), rp.nn.Dropout(0.5)
gen = rnp.random.Generator()
x = np.ones(64, np.float32)
for mode in ("graph", "eager"):
    a = rp.function(first, mode=mode)(x) != 0
    b = rp.function(second, mode=mode)(x) != 0
    print(mode, "".join(map(str, a.astype(int))), "".join(map(str, b.astype(int))))
print("gen", gen.uniform((4,)).numpy().tobytes().hex())
"""


def test_a_program_run_twice_draws_the_same_masks():
    code = PROGRAM.format(root=ROOT)
    outs = [run([sys.executable, "-c", code], check=True, job=False).stdout for _ in range(2)]
    assert outs[0] == outs[1], outs
    lines = outs[0].split("\n")
    for line in lines[:2]:
        _, a, b = line.split()
        assert a != b  # and within the program the two layers differ


def test_default_dropout_differs_per_replica():
    k, n = 2, 2000
    drop = rp.nn.Dropout(0.5)

    def input_fn(ctx):
        while True:
            yield np.ones(n, np.float32)

    rep = rp.Replicator(input_fn, lambda x: {"y": drop(x)}, replicas_per_rank=k,
                        outputs="per_replica")
    hist = rep.run(steps=2)
    for h in hist:
        m0, m1 = h["y"][0] != 0, h["y"][1] != 0
        assert not np.array_equal(m0, m1)
        assert abs(m0.mean() - 0.5) < 0.1 and abs(m1.mean() - 0.5) < 0.1
    assert not np.array_equal(hist[0]["y"][0], hist[1]["y"][0])
