"""Graph-to-graph passes, each its own module, run in this order by ``replicate.compiler``.

Every pass is ``pass(graph, options) -> graph``; a backend names the ones it wants.
"""

from .bucketing import bucketing
from .const_fold import const_fold
from .cse import cse
from .dce import dce
from .fusion import fuse
from .memory import memory

PIPELINE = {
    "const_fold": lambda g, o: const_fold(g),
    "cse": lambda g, o: cse(g),
    "dce": lambda g, o: dce(g),
    "bucketing": lambda g, o: bucketing(g, o.bucket_bytes, o.compress, o.overlap),
    "fusion": lambda g, o: fuse(g),
    "memory": lambda g, o: memory(g),
}

__all__ = ["PIPELINE", "bucketing", "const_fold", "cse", "dce", "fuse", "memory"]
