"""From a traced graph to something that runs: the backend's passes, then its lowering.

``compile_graph(graph, backend, options)`` runs the optimisation passes the backend asks for (in
pipeline order), checks the graph after each one when ``REPLICATE_VALIDATE=1`` (the tests set
it), prints it after each one when ``REPLICATE_DEBUG=passes``, and hands the result to the
backend's ``lower``.

>>> import numpy as np, replicate as rp, replicate.numpy as rnp
>>> f = rp.function(lambda x: rnp.tanh(x * 2.0 + 1.0).sum())
>>> float(f(np.zeros(3)))
2.2847...
>>> f.executable(np.zeros(3)).kernels  # one kernel: mul, add, tanh and the sum
['fused[mul,add,tanh,reduce_sum]']
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .errors import ReplicateError
from .graph.passes import PIPELINE
from .graph.validate import validate


@dataclass(frozen=True)
class CompileOptions:
    """Knobs of the optimisation pipeline.

    ``bucket_bytes``: gradient all-reduces are packed into flat buffers of at most this size
    (default 25 MB; 0 turns bucketing off). ``compress``: ``None``, ``"float16"`` or
    ``"bfloat16"`` — the dtype bucketed float32 buffers travel in. ``overlap``: start each
    bucket's communication as soon as its gradients exist and wait for it only where its result
    is needed (a communication thread carries it). ``disable``: names of passes to skip.
    """

    bucket_bytes: int = 25 * 2**20
    compress: str | None = None
    overlap: bool = True
    disable: frozenset = field(default_factory=frozenset)

    def __post_init__(self):
        if self.bucket_bytes < 0:
            raise ReplicateError(f"bucket_bytes must be >= 0, got {self.bucket_bytes}")
        if self.compress not in (None, "float16", "bfloat16"):
            raise ReplicateError(f"compress must be None, 'float16' or 'bfloat16', got "
                                 f"{self.compress!r}")
        unknown = set(self.disable) - set(PIPELINE)
        if unknown:
            raise ReplicateError(f"unknown passes {sorted(unknown)}; passes: {list(PIPELINE)}")
        object.__setattr__(self, "disable", frozenset(self.disable))


class Executable:
    """A compiled graph: ``exe(inputs) -> outputs`` (lists of host arrays).

    ``graph`` is the optimised graph the backend lowered; ``kernels`` lists what the backend
    launches per call (one entry per fused group or library call), for inspection and tests.
    """

    def __init__(self, graph, run, kernels=()):
        self.graph = graph
        self.run = run
        self.kernels = list(kernels)

    def __call__(self, inputs):
        return self.run(inputs)


def debug_enabled(flag: str) -> bool:
    return flag in os.environ.get("REPLICATE_DEBUG", "").split(",")


def optimize(graph, passes, options: CompileOptions | None = None):
    """Run the named passes (in pipeline order) over ``graph``."""
    options = options or CompileOptions()
    checking = os.environ.get("REPLICATE_VALIDATE") == "1"
    for name, run_pass in PIPELINE.items():
        if name not in passes or name in options.disable:
            continue
        graph = run_pass(graph, options)
        if checking:
            validate(graph)
        if debug_enabled("passes"):
            print(f"# after pass {name}\n{graph}\n", flush=True)
    return graph


def compile_graph(graph, backend, options: CompileOptions | None = None) -> Executable:
    """Optimise ``graph`` for ``backend`` (a backend module) and lower it."""
    graph = optimize(graph, backend.passes, options)
    lowered = backend.lower(graph)
    if isinstance(lowered, Executable):
        return lowered
    return Executable(graph, lowered)
