"""``rp.custom_vjp`` (issue 15, custom gradients): the user's ``bwd`` is used in eager and graph
mode, under grad-of-grad, inside a Replicator step; misuse is a clear error."""

from __future__ import annotations

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp


def compiled(fn, mode):
    """``fn`` as run in ``mode``: eager, graph (NumPy backend) or jax (JAX backend)."""
    if mode == "eager":
        return lambda x: fn(rnp.asarray(x))
    return rp.function(fn, backend="numpy" if mode == "graph" else "jax")


@rp.custom_vjp
def softplus(x):
    return rnp.log(1.0 + rnp.exp(x))


def _softplus_fwd(x):
    return softplus(x), x  # JAX's idiom: fwd calls the function itself


def _softplus_bwd(x, g):
    return (g * rnp.where(x > 0, 1.0 / (1.0 + rnp.exp(-x)), rnp.exp(x) / (1.0 + rnp.exp(x))),)


softplus.defvjp(_softplus_fwd, _softplus_bwd)


@pytest.mark.parametrize("mode", ["eager", "graph", "jax"])
def test_the_users_rule_replaces_the_derived_gradient(mode):
    """At x = 100 (float32) the derived gradient exp(x)/(1+exp(x)) is inf/inf = NaN."""
    def step(x):
        return rp.grad(rnp.sum(softplus(x)), x)

    x = np.array([-3.0, 0.0, 100.0], np.float32)
    got = np.asarray(compiled(step, mode)(x))
    np.testing.assert_allclose(got, 1.0 / (1.0 + np.exp(-x.astype(np.float64))), rtol=1e-6)


@rp.custom_vjp
def cube(x):
    return x * x * x


cube.defvjp(lambda x: (cube(x), x), lambda x, g: (g * 3.0 * x * x,))


@pytest.mark.parametrize("mode", ["eager", "graph", "jax"])
def test_grad_of_grad_goes_through_a_differentiable_bwd(mode):
    def second(x):
        return rp.grad(rp.grad(cube(x), x), x)

    assert float(compiled(second, mode)(np.float64(2.0))) == 12.0


@rp.custom_vjp
def scaled(x, y, factor):
    return x * y * factor, x - y


def _scaled_fwd(x, y, factor):
    return scaled(x, y, factor), (x, y, factor)


def _scaled_bwd(res, g):
    x, y, factor = res
    g_prod, g_diff = g
    return g_prod * y * factor + g_diff, None, None  # no gradient for y (on purpose) or factor


scaled.defvjp(_scaled_fwd, _scaled_bwd)


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_several_arguments_and_outputs(mode):
    """Two outputs, a None cotangent, a Python number among the arguments, a Variable as an
    argument."""
    w = rp.Variable(np.array([1.0, 2.0]), name="w")

    def step(x):
        prod, diff = scaled(x, w, 3.0)
        loss = rnp.sum(prod) + 2.0 * rnp.sum(diff)
        return rp.grad(loss, [x, w])

    fn = step if mode == "eager" else rp.function(step)
    x = np.array([5.0, 7.0])
    gx, gw = fn(rnp.asarray(x)) if mode == "eager" else fn(x)
    np.testing.assert_allclose(np.asarray(gx), np.array([1.0, 2.0]) * 3.0 + 2.0)
    np.testing.assert_allclose(np.asarray(gw), 0.0)  # bwd said None: no gradient


@pytest.mark.parametrize("mode,k", [("graph", 2), ("eager", 1)])
def test_inside_a_replicator_step(mode, k):
    w = rp.Variable(np.array([0.5, -0.5]), name="w")

    def input_fn(ctx):
        while True:
            yield np.array([100.0, -100.0]) * (ctx.replica_id + 1)

    def step_fn(x):
        loss = rnp.sum(softplus(x * w))
        g = rp.all_reduce(rp.grad(loss, w), "mean")
        w.assign(w - 0.1 * g)
        return {"g": g}

    hist = rp.Replicator(input_fn, step_fn, mode=mode, replicas_per_rank=k).run(2)
    assert all(np.isfinite(h["g"]).all() for h in hist)
    # step 1: d/dw softplus(x w) = x sigmoid(x w); sigmoid(50) = 1, sigmoid(50) = 1 (x = -100)
    expected = np.mean([np.array([100.0, -100.0]) * (r + 1) for r in range(k)], axis=0)
    np.testing.assert_allclose(hist[0]["g"], expected, rtol=1e-6)


def test_misuse_is_a_clear_error():
    @rp.custom_vjp
    def f(x):
        return x * 2.0

    with pytest.raises(rp.ReplicateError, match=r"no gradient rule; call f.defvjp\(fwd, bwd\)"):
        f(rnp.asarray(1.0))
    f.defvjp(lambda x: (f(x), None), lambda res, g: g)  # not a tuple
    x = rnp.asarray(1.0)
    with pytest.raises(rp.ReplicateError, match="bwd must return a tuple with one cotangent per "
                                               "positional argument"):
        rp.grad(f(x), x)
    f.defvjp(lambda x: (f(x), None), lambda res, g: (rnp.ones(3),))
    with pytest.raises(rp.ShapeError, match="cotangent of shape \\(3,\\) for an argument of "
                                           "shape \\(\\)"):
        rp.grad(f(x), x)
    f.defvjp(lambda x: f(x), lambda res, g: (g,))
    with pytest.raises(rp.ReplicateError, match="fwd must return \\(output, residuals\\)"):
        f(x)
    with pytest.raises(rp.ReplicateError, match="pass the arguments by position"):
        f(x=x)


def test_stop_gradient_is_public():
    x = rnp.asarray(3.0)
    assert float(rp.grad(x * rp.stop_gradient(x), x)) == 3.0


@pytest.mark.mpi
@pytest.mark.parametrize("mode,k", [("graph", 2), ("eager", 1)])
def test_across_two_processes(mode, k):
    from conftest import have_mpi, mpirun, report

    if not have_mpi():
        pytest.skip("needs mpi4py and mpiexec (mpich wheel)")
    result = mpirun("custom_vjp_mpi.py", mode, str(k), check=True)
    replicas = 2 * k  # replica r's slopes (0.5, 4) (r + 1), each clipped to at most 1
    g = np.mean([np.minimum(np.array([0.5, 4.0]) * (r + 1), 1.0) for r in range(replicas)], 0)
    for rank in (0, 1):
        assert f"rank {rank} g {g.tolist()} w {(1.0 - g).tolist()}" in result.stdout, \
            report(result)


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_a_variable_returned_unchanged_by_fwd_still_takes_the_rule(mode):
    """fwd = identity on a Variable argument: the output must still pass through the rule (it
    once came back as the Variable itself and the gradient bypassed bwd, silently)."""
    @rp.custom_vjp
    def clip_gradient(x):
        return x

    clip_gradient.defvjp(lambda x: (x, None), lambda res, g: (rnp.clip(g, -1.0, 1.0),))
    w = rp.Variable(np.array([1.0, 1.0]), name="w")

    def step(x):
        return rp.grad(rnp.sum(clip_gradient(w) * x), w)

    got = compiled(step, mode)(np.array([0.5, 4.0]))
    np.testing.assert_allclose(np.asarray(got), [0.5, 1.0])


@rp.custom_vjp
def pair(x):
    return x, 2.0 * x


def _clip_by_global_norm_bwd(res, g):
    """Not linear in g: the cotangents of both outputs clipped together to norm 1."""
    g_a, g_b = g
    norm = rnp.sqrt(rnp.sum(g_a * g_a) + rnp.sum(g_b * g_b))
    scale = rnp.minimum(1.0, 1.0 / norm)
    return (scale * (g_a + 2.0 * g_b),)


pair.defvjp(lambda x: (pair(x), None), _clip_by_global_norm_bwd)


@pytest.mark.parametrize("mode", ["eager", "graph", "jax"])
@pytest.mark.parametrize("use", ["both", "second"])
def test_bwd_sees_every_outputs_cotangent_at_once(mode, use):
    """bwd runs once with both outputs' cotangents (JAX's contract). Called once per output
    with the other zeroed and summed, it gave 3.0 instead of 2.2 here: a silent wrong number."""
    def step(x):
        a, b = pair(x)
        loss = 4.0 * rnp.sum(b) + (3.0 * rnp.sum(a) if use == "both" else 0.0)
        return rp.grad(loss, x)

    got = float(compiled(step, mode)(np.float64(1.0)))
    # both: g = (3, 4), norm 5, scale 0.2 -> 0.2 (3 + 8) = 2.2; second only: g = (0, 4) -> 2.0
    assert got == pytest.approx(2.2 if use == "both" else 2.0, rel=1e-12)


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_a_variable_read_inside_fwd_but_not_passed_is_an_error(mode):
    """A PyTorch habit: the custom function uses the model's weight from the enclosing scope.
    Its gradient cannot flow through bwd; it would be silently zero, so it is an error."""
    w = rp.Variable(np.array([2.0, 3.0]), name="w")
    step_count = rp.Variable(np.zeros((), np.int64), name="count")  # no gradient: allowed

    @rp.custom_vjp
    def scale(x):
        return x * w + rnp.cast(step_count, np.float64)

    scale.defvjp(lambda x: (scale(x), None), lambda res, g: (g * 2.0,))

    def step(x):
        return rp.grad(rnp.sum(scale(x)), w)

    with pytest.raises(rp.ReplicateError, match="fwd reads the Variable\\(s\\) 'w' without "
                                               "taking them as arguments"):
        compiled(step, mode)(np.array([1.0, 1.0]))
