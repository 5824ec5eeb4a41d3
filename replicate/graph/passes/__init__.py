"""Graph-to-graph passes, each its own module; ``replicate.compiler`` runs them in this order.

Every pass is ``pass(graph, options, backend=None) -> graph``; a backend names the ones it wants
and may answer what they ask of it (``fusion_accepts``). The collective rewrite
(``replicate_collectives``) and the merge of the replicas' updates come first in every pipeline;
the backend's own passes (the NumPy backend's ``memory`` planning) come last.
"""

from .bucketing import bucketing
from .const_fold import const_fold
from .cse import cse
from .dce import dce
from .fusion import fuse
from .replicate_collectives import replicate_collectives
from .widen import widen

PIPELINE = {
    "const_fold": lambda g, o, backend=None: const_fold(g),
    "cse": lambda g, o, backend=None: cse(g),
    "dce": lambda g, o, backend=None: dce(g),
    "bucketing": lambda g, o, backend=None: bucketing(g, o.bucket_bytes, o.compress, o.overlap),
    "widen": lambda g, o, backend=None: widen(g),
    "fusion": lambda g, o, backend=None: fuse(g, getattr(backend, "fusion_accepts", None)),
}

__all__ = ["PIPELINE", "bucketing", "const_fold", "cse", "dce", "fuse", "replicate_collectives",
           "widen"]
