"""Graph-to-graph passes, each its own module, run by ``replicate.compiler``'s one loop.

Every pass is a ``Pass``: ``run(graph, ctx) -> graph`` with a ``StepContext`` (where the step
runs; the backend and its ``CompileOptions``). Two lists, in the order they run:

* ``STEP_PASSES`` (``step_passes.py``): what makes a traced step this process's step — the
  checks, the collective rewrite, model parallelism's passes, the schedule, the merge of the
  replicas' updates;
* ``PIPELINE``: the optimisation passes a backend may ask for by name (``backend.passes``);
  a backend may answer what they ask of it (``fusion_accepts``) and add passes of its own after
  them (``backend.own_passes``: the NumPy backend's memory plan).
"""

from .bucketing import bucketing
from .const_fold import const_fold
from .cse import cse
from .dce import dce
from .fusion import fuse
from .replicate_collectives import replicate_collectives
from .step_passes import STEP_PASSES, Pass, StepContext
from .widen import widen

PIPELINE = {p.name: p for p in (
    Pass("const_fold", lambda g, c: const_fold(g)),
    Pass("cse", lambda g, c: cse(g)),
    Pass("dce", lambda g, c: dce(g)),
    Pass("bucketing", lambda g, c: bucketing(g, c.options.bucket_bytes, c.options.compress,
                                             c.options.overlap)),
    Pass("widen", lambda g, c: widen(g)),
    Pass("fusion", lambda g, c: fuse(g, getattr(c.backend, "fusion_accepts", None))),
)}

__all__ = ["PIPELINE", "STEP_PASSES", "Pass", "StepContext", "bucketing", "const_fold", "cse",
           "dce", "fuse", "replicate_collectives", "widen"]
