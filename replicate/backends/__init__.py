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

_MODULES = {
    "numpy": "replicate.backends.numpy_backend",
    "jax": "replicate.backends.jax_backend",
    "null": "replicate.backends.null_backend",
    "cupy": "replicate.backends.cupy_backend",
}
# backend -> how to install what it needs, when not the extra of its own name
_EXTRAS = {"cupy": "pip install 'replicate[cuda12]' (CUDA 12 driver) or "
                   "'replicate[cuda13]' (CUDA 13)"}


def get_backend(name: str):
    """The backend module called ``name``; a clear error when what it needs is not installed.

    >>> get_backend("numpy").name
    'numpy'
    """
    if name not in _MODULES:
        raise ReplicateError(f"unknown backend {name!r}; choose one of {sorted(_MODULES)}")
    try:
        return import_module(_MODULES[name])
    except ImportError as e:
        if (e.name or "").startswith("replicate"):
            raise
        how = _EXTRAS.get(name, f"pip install 'replicate[{name}]'")
        raise ReplicateError(f"the {name!r} backend needs {e.name or 'a package'}, which is not "
                             f"installed: {how}") from e


def available() -> list[str]:
    """The backends that can be used here (their packages import); ``numpy`` always."""
    names = []
    for name in _MODULES:
        try:
            get_backend(name)
        except ReplicateError:
            continue
        names.append(name)
    return sorted(names)
