"""``rnp`` as an Array API namespace: ``__array_namespace__``, the array attributes the standard
names, the dtype queries, the inspection namespace (bench/array_api.sh runs the outside suite)."""

from __future__ import annotations

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp


def test_arrays_name_their_namespace():
    x = rnp.asarray([[1.0, 2.0]])
    assert x.__array_namespace__() is rnp and x.__array_namespace__("2023.12") is rnp
    assert rnp.__array_api_version__ == "2023.12"
    assert x.device == "cpu" and x.to_device("cpu") is x and x.mT.shape == (2, 1)
    with pytest.raises(rp.PlacementError, match="cpu"):
        x.to_device("cuda:0")
    assert rp.function(lambda v: v.mT)(np.ones((2, 3))).shape == (3, 2)


def test_dtype_objects_and_queries():
    assert [rnp.int8, rnp.uint16, rnp.uint64, rnp.bool] == [np.int8, np.uint16, np.uint64,
                                                              np.bool_]
    assert "bool" not in rnp.__all__  # a star import keeps Python's bool
    f = rnp.finfo(rnp.asarray([1.0], "float32"))
    assert isinstance(f.eps, float) and f.eps == float(np.finfo(np.float32).eps)
    assert f.bits == 32 and f.dtype == np.float32 and rnp.finfo("bfloat16").eps == 2.0 ** -7
    assert rnp.iinfo(rnp.int16).max == 32767
    assert rnp.isdtype(rnp.bool, (rnp.bool,)) and rnp.isdtype(np.int8, ("integral", "bool"))
    assert not rnp.isdtype(np.float32, "integral") and rnp.isdtype("bfloat16", "real floating")
    with pytest.raises(ValueError, match="unknown kind"):
        rnp.isdtype(np.float32, "floating")


def test_inspection_namespace():
    info = rnp.__array_namespace_info__()
    assert info.devices() == ["cpu"] and info.default_device() == "cpu"
    assert info.default_dtypes()["real floating"] == rnp.zeros(1).dtype
    assert set(info.dtypes(kind="integral")) == {"int8", "int16", "int32", "int64", "uint8",
                                                 "uint16", "uint32", "uint64"}
    assert list(info.dtypes(kind=("bool", "real floating"))) == ["bool", "float32", "float64"]


def test_moveaxis_takes_sequences_as_numpy():
    x = np.zeros((2, 3, 4, 5))
    for src, dst in [((0, 1), (2, 0)), ((), ()), ((3,), (0,)), (-1, 1)]:
        assert rnp.moveaxis(x, src, dst).shape == np.moveaxis(x, src, dst).shape
    with pytest.raises(rp.ReplicateError, match="pair up"):
        rnp.moveaxis(x, (0, 1), (1,))
