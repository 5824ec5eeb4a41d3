"""The null backend: compiles like the NumPy backend, runs nothing, records what it would launch.

Structural tests use it to look at the optimised graph (kernels, buckets, communication) of steps
that could not run here — say, a two-process graph inside one process. ``run`` returns zeros of
the output shapes and appends the kernel list of the call to ``Executable.calls``.

>>> import numpy as np, replicate as rp, replicate.numpy as rnp
>>> f = rp.function(lambda x: (x * 2.0 + 1.0).sum(), backend="null")
>>> f(np.ones(4)), f.executable(np.ones(4)).calls
(array(0.), [['fused[mul,add,reduce_sum]']])
"""

from __future__ import annotations

import numpy as np

from ..graph.primitives import REGISTRY
from .base import Executable
from .numpy_backend import kernels, own_passes, passes, writes_out

name = "null"
__all__ = ["lower", "name", "own_passes", "passes", "writes_out"]


def lower(graph):
    launched = kernels(graph)
    comm = [n.prim for n in graph.nodes if REGISTRY[n.prim].exchange]
    outputs = [(o.shape, o.dtype) for o in graph.outputs]

    def run(inputs):
        if len(inputs) != len(graph.inputs):
            raise ValueError(f"expected {len(graph.inputs)} inputs, got {len(inputs)}")
        exe.calls.append(list(launched))
        return [np.zeros(shape, dtype) for shape, dtype in outputs]

    exe = Executable(graph, run, launched)
    exe.calls = []
    exe.communication = comm
    return exe
