"""Backends turn a Graph into a callable ``run(list of host arrays) -> list of host arrays``.

The contract (one screen). A backend is a module with

* ``name``: str;
* ``passes``: the optimisation passes it wants, by name (``replicate.graph.passes.PIPELINE``);
  ``replicate.compiler.compile_graph`` runs them before lowering;
* ``lower(graph) -> run`` or ``-> replicate.compiler.Executable``, where
  ``run(inputs: list of host arrays) -> list of host arrays`` (anything ``np.asarray`` accepts),
  one per ``graph.inputs`` / ``graph.outputs``.

Nodes whose primitive has kind ``collective`` (communication) run on the host through the NumPy
table ``IMPL``; a backend hands them host arrays (a value passed between two host nodes may be
a handle, not an array: pass it through untouched).

``numpy`` is the reference and always present; ``null`` records what it would run, for structural
tests.
"""

from __future__ import annotations

from importlib import import_module

from ..errors import ReplicateError

_MODULES = {"numpy": "replicate.backends.numpy_backend"}


def get_backend(name: str):
    if name not in _MODULES:
        raise ReplicateError(f"unknown backend {name!r}; choose one of {sorted(_MODULES)}")
    return import_module(_MODULES[name])


def available() -> list[str]:
    return sorted(_MODULES)
