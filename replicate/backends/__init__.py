"""Backends turn a Graph into a callable ``run(list of host arrays) -> list of host arrays``.

The contract (one screen): a backend module provides

* ``name``: str
* ``compile(graph) -> Executable``, where
  ``Executable(inputs: list[np.ndarray]) -> list[np.ndarray]``

``numpy`` is the reference and always present.
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
