"""The backend contract.

A backend is a module with

* ``name``: str;
* ``passes``: the optimisation passes it wants, by name (``replicate.compiler.PIPELINE``);
  ``replicate.compiler`` runs them, in pipeline order, before lowering;
* ``lower(graph) -> Executable`` (or a plain ``run`` callable), where
  ``run(inputs: list of host arrays) -> list of host arrays`` (anything ``np.asarray`` accepts),
  one per ``graph.inputs`` / ``graph.outputs``;
* optionally ``fusion_accepts(members) -> bool``: whether it runs a group the fusion pass would
  form as one kernel (without it, every group is accepted).

Nodes whose primitive is flagged ``host`` (communication) run on the host through the reference
table ``replicate.graph.reference.IMPL``; a backend hands them host arrays (a value passed
between two host nodes may be a handle, not an array: pass it through untouched).
"""

from __future__ import annotations


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
