"""DLPack and other libraries' arrays: rp.Array.__dlpack__, rnp.from_dlpack, rnp.asarray and
compiled functions taking JAX / PyTorch arrays, in both modes."""

from __future__ import annotations

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp

jnp = pytest.importorskip("jax.numpy", reason="needs jax (the [jax] extra)")


def _torch():
    return pytest.importorskip("torch", reason="PyTorch is optional (the [bench] extra)")


def test_an_eager_array_goes_to_numpy_and_jax_without_a_copy():
    import jax

    x = rnp.asarray([1.0, 2.0, 3.0]) * 2
    assert x.__dlpack_device__() == (1, 0)
    view = np.from_dlpack(x)
    assert view.tolist() == [2.0, 4.0, 6.0] and np.shares_memory(view, x.numpy())
    assert jax.dlpack.from_dlpack(x).tolist() == [2.0, 4.0, 6.0]


def test_an_eager_array_goes_to_torch_without_a_copy():
    torch = _torch()
    x = rnp.asarray([1.0, 2.0]) * 3
    t = torch.from_dlpack(x)
    t[0] = 7.0  # zero-copy: the same memory
    assert x.tolist() == [7.0, 6.0]


def test_a_traced_value_refuses_dlpack_export():
    def f(x):
        np.from_dlpack(x * 2)
        return x

    with pytest.raises(rp.TracerConversionError, match="DLPack export"):
        rp.function(f)(np.ones(2))


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_jax_arrays_in_both_modes(mode):
    f = rp.function(lambda x: rnp.sum(rnp.asarray(x) * 2.0), mode=mode)
    assert float(f(jnp.arange(3.0))) == 6.0
    assert rnp.from_dlpack(jnp.ones(2)).tolist() == [1.0, 1.0]
    assert (rnp.asarray(jnp.ones(2, jnp.bfloat16)).dtype == rp.bfloat16)


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_torch_tensors_in_both_modes(mode):
    torch = _torch()
    f = rp.function(lambda x: x * 2.0, mode=mode)
    assert f(torch.arange(3.0)).tolist() == [0.0, 2.0, 4.0]
    assert rnp.asarray(torch.ones(2, dtype=torch.float64)).dtype == np.float64
    out = f(torch.ones(2))
    assert torch.from_dlpack(out).tolist() == [2.0, 2.0]  # and back, zero-copy
    with pytest.raises(rp.ReplicateError, match="require gradient"):
        rnp.asarray(torch.ones(2, requires_grad=True))


def test_a_replicator_takes_foreign_batches():
    hist = rp.Replicator(lambda ctx: iter([jnp.ones(2)] * 2), lambda x: {"s": x.sum()},
                         replicas_per_rank=2).run(2)
    assert [float(h["s"]) for h in hist] == [2.0, 2.0]


def test_from_dlpack_needs_dlpack():
    with pytest.raises(rp.ReplicateError, match="has no __dlpack__"):
        rnp.from_dlpack([1, 2])


def test_dlpack_export_takes_the_array_apis_keywords_and_no_others():
    import inspect

    a = rnp.asarray(np.arange(3.0))
    params = inspect.signature(type(a).__dlpack__).parameters
    assert [n for n, p in params.items() if p.kind is p.KEYWORD_ONLY] == [
        "stream", "max_version", "dl_device", "copy"]
    assert np.from_dlpack(a).tolist() == [0.0, 1.0, 2.0]
    assert a.__dlpack__(max_version=(1, 0)) is not None
    with pytest.raises(TypeError):
        a.__dlpack__(bogus=1)


def test_the_namespace_exports_only_its_own_names():
    import __future__

    exported = {n: getattr(rnp, n) for n in rnp.__all__}
    assert "annotations" not in exported
    assert not [n for n, v in exported.items() if isinstance(v, __future__._Feature)]
