"""Every declared primitive has every rule-table entry it needs (and no table has stale entries).

The check is a plain function, ``missing_rules()``, so the test can also prove that it notices a
primitive declared without its rules.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from replicate.errors import MissingRuleError
from replicate.graph import primitives
from replicate.graph.primitives import REGISTRY
from replicate.graph.reference import IMPL
from replicate.graph.vjp_rules import VJP


def missing_rules() -> list[str]:
    """One message per missing entry: 'no <table> rule for <op>'."""
    problems = []
    for name, prim in sorted(REGISTRY.items()):
        if name not in IMPL:
            problems.append(f"no numpy rule for {name}")
        if prim.differentiable and name not in VJP:
            problems.append(f"no vjp rule for {name}")
    return problems


def stale_rules() -> list[str]:
    """Entries in a table for a primitive nobody declares (a typo, or a removed primitive)."""
    tables = {"numpy": IMPL, "vjp": VJP}
    return [f"{table} rule for undeclared primitive {name}"
            for table, rules in tables.items() for name in sorted(rules) if name not in REGISTRY]


def test_every_primitive_has_its_rules():
    assert missing_rules() == []


def test_no_rule_without_a_primitive():
    assert stale_rules() == []


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_primitive_entries(name):
    """One primitive's rules and flags agree with each other (what ``declare`` cannot check
    alone: its name, kind and shape rule are checked when it is made)."""
    prim = REGISTRY[name]
    assert callable(IMPL.get(name)), f"no numpy rule for {name}"
    if prim.differentiable:
        assert callable(VJP.get(name)), f"no vjp rule for {name}"
    assert prim.fuse in (None, "map", "reduce"), prim.fuse
    if prim.fuse == "reduce":
        assert prim.kind == primitives.REDUCTION, "only a reduction fuses as a reduce"
    if prim.cuda is not None:
        assert prim.fuse == "map", "a CUDA expression is for a fused map"
    if prim.placeholder:
        assert prim.kind == primitives.COLLECTIVE and prim.effect, \
            "a placeholder is a collective that must run"
    if prim.exchange:
        assert prim.host and prim.effect, "what talks to other processes runs on the host, always"


def test_registry_is_not_trivially_small():
    # guards against the table test passing vacuously (e.g. an import that empties REGISTRY)
    for name in ("add", "mul", "exp", "reduce_sum", "matmul", "einsum", "getitem", "select"):
        assert name in REGISTRY


# -- the check detects what it is meant to detect ---------------------------------------------
def new_problems(baseline) -> list[str]:
    """What ``missing_rules()`` reports beyond ``baseline`` (the real tables' own state is
    checked by ``test_every_primitive_has_its_rules``; these tests check the detector)."""
    return [p for p in missing_rules() if p not in baseline]


@pytest.fixture
def baseline():
    return set(missing_rules())


@pytest.fixture
def fake_primitive(monkeypatch, baseline):
    """Declare a differentiable elementwise primitive 'fake_unary' with no rules at all."""
    monkeypatch.setitem(REGISTRY, "fake_unary",
                        primitives.Primitive("fake_unary", primitives.ELEMENTWISE,
                                             lambda a, **_: a, True))
    return "fake_unary"


def test_check_detects_missing_impl_and_vjp(fake_primitive, baseline):
    assert new_problems(baseline) == ["no numpy rule for fake_unary",
                                      "no vjp rule for fake_unary"]


def test_check_detects_missing_vjp_only(fake_primitive, monkeypatch, baseline):
    monkeypatch.setitem(IMPL, fake_primitive, lambda x: x * 2)
    assert new_problems(baseline) == ["no vjp rule for fake_unary"]
    monkeypatch.setitem(VJP, fake_primitive, lambda g, out, needs, x: (g * 2,))
    assert new_problems(baseline) == []


def test_check_skips_vjp_for_non_differentiable(monkeypatch, baseline):
    monkeypatch.setitem(REGISTRY, "fake_flag",
                        primitives.Primitive("fake_flag", primitives.ELEMENTWISE,
                                             lambda a, **_: a, differentiable=False))
    assert new_problems(baseline) == ["no numpy rule for fake_flag"]
    monkeypatch.setitem(IMPL, "fake_flag", lambda x: x)
    assert new_problems(baseline) == []


def test_check_detects_stale_entry(monkeypatch):
    before = stale_rules()
    monkeypatch.setitem(VJP, "fake_stale", lambda g, out, needs, x: (g,))
    assert [p for p in stale_rules() if p not in before] == [
        "vjp rule for undeclared primitive fake_stale"]


def test_declare_adds_to_registry(monkeypatch):
    monkeypatch.setattr(primitives, "REGISTRY", dict(REGISTRY))
    primitives.declare("fake_declared", primitives.ELEMENTWISE, lambda a, **_: a)
    assert "fake_declared" in primitives.REGISTRY
    assert "fake_declared" not in REGISTRY  # the module-level table is untouched


# -- a missing rule fails at use with "no <table> rule for <op>" -------------------------------
def _fake(x):
    from replicate.graph.core import bind

    return bind("fake_unary", rnp.asarray(x))


def test_missing_impl_fails_clearly_in_eager_mode(fake_primitive):
    with pytest.raises(MissingRuleError, match="no numpy rule for fake_unary"):
        _fake(np.ones(3))


def test_missing_impl_fails_clearly_in_graph_mode(fake_primitive):
    with pytest.raises(MissingRuleError, match="no numpy rule for fake_unary"):
        rp.function(_fake)(np.ones(3))


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_missing_vjp_fails_clearly(fake_primitive, monkeypatch, mode):
    monkeypatch.setitem(IMPL, fake_primitive, lambda x: x * 2)

    def f(x):
        return rp.grad(_fake(x).sum(), x)

    with pytest.raises(MissingRuleError, match="no vjp rule for fake_unary"):
        rp.function(f, mode=mode)(np.ones(3))


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_removed_vjp_of_real_primitive_fails_clearly(monkeypatch, baseline, mode):
    monkeypatch.delitem(VJP, "tanh")
    assert new_problems(baseline) == ["no vjp rule for tanh"]
    with pytest.raises(MissingRuleError, match="no vjp rule for tanh"):
        rp.function(lambda x: rp.grad(rnp.tanh(x).sum(), x), mode=mode)(np.ones(3))


def test_unknown_primitive_fails_clearly():
    from replicate.graph.core import bind

    with pytest.raises(MissingRuleError, match="no primitive named 'not_a_primitive'"):
        bind("not_a_primitive", rnp.asarray(1.0))


# -- the JAX table: every primitive that runs on the device (all but the collectives) ------------
needs_jax = pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax not installed")


@needs_jax
def test_jax_table_has_every_device_primitive_and_nothing_else():
    from replicate.backends.jax_impl import JAX
    from replicate.backends.jax_impl import missing_rules as missing_jax

    assert missing_jax() == []
    assert [f"jax rule for undeclared primitive {n}" for n in sorted(JAX) if n not in REGISTRY] \
        == []
    assert not any(REGISTRY[n].host for n in JAX)  # communication runs on the host
    assert "local_reduce" in JAX  # the in-process combine is a device op (inside the jit)


@needs_jax
def test_jax_check_detects_a_missing_rule(fake_primitive):
    from replicate.backends.jax_impl import missing_rules as missing_jax

    assert missing_jax() == ["no jax rule for fake_unary"]
