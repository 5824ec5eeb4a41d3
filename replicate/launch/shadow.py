"""A folder named ``replicate`` in the current folder (a clone's own folder, seen from its
parent) hides the installed package: Python imports it as an empty namespace package, and the
script fails later with ``module 'replicate' has no attribute 'nn'``. The command-line entries
(``python -m replicate``, ``python -m replicate.launch``) check first and say so."""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the real package


def shadowing_folders() -> list[str]:
    """The folders Python took for ``replicate`` instead of the package (none: all is well)."""
    module = sys.modules.get("replicate")
    if module is None or getattr(module, "__file__", None):
        return []
    return [os.path.abspath(p) for p in getattr(module, "__path__", [])]


def check(command: str) -> None:
    """Exit with a message naming the folder and the fixes when the package is shadowed."""
    folders = shadowing_folders()
    if not folders:
        return
    shown = ", ".join(folders)
    sys.stderr.write(
        f"{command}: the folder {shown} hides the replicate package ({HERE}): it has no "
        "__init__.py, so Python imports it as an empty namespace package (the current folder "
        "comes first on sys.path) and `import replicate` in the script gets it.\n"
        "  Fix: run from another folder (`cd` into the clone, or anywhere else, and give the "
        "script's path), or rename that folder.\n")
    raise SystemExit(2)
