"""Graph-to-graph passes, each its own module, run in this order by ``replicate.compiler``.

Every pass is ``pass(graph, options) -> graph``; a backend names the ones it wants.
"""

from .cse import cse
from .dce import dce

PIPELINE = {
    "dce": lambda g, o: dce(g),
    "cse": lambda g, o: cse(g),
}

__all__ = ["PIPELINE", "cse", "dce"]
