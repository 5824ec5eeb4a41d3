"""Checkpoints: variables, step and metadata in a ``.npz`` that NumPy alone can read.

Written atomically by rank 0 (temporary file in the same folder, fsync, rename), so a crash mid-
write never leaves a half-written checkpoint under the final name. On restore rank 0 reads the file
and broadcasts it, so every rank ends in the same state even without a shared file system.

State is a nest (dicts/lists) of ``Variable``s, e.g. ``{"model": model.variables(),
"opt": opt.variables()}``; array keys in the file are the nest paths (``var/model/0.weight``).

>>> import numpy as np, os, tempfile, replicate as rp
>>> w = rp.Variable(np.arange(3.0), name="w")
>>> path = os.path.join(tempfile.mkdtemp(), "ck.npz")
>>> rp.checkpoint.save(path, {"w": w}, step=7)
>>> w.assign(np.zeros(3))
>>> rp.checkpoint.restore(path, {"w": w})["step"], w.numpy().tolist()
(7, [0.0, 1.0, 2.0])
"""

from __future__ import annotations

import json
import os
import tempfile

import numpy as np

from ..errors import ReplicateError
from ..state import Variable
from .comm import world


def _paths(nest, prefix=""):
    if isinstance(nest, dict):
        for key in sorted(nest):
            yield from _paths(nest[key], f"{prefix}{key}/")
    elif isinstance(nest, (list, tuple)):
        for i, v in enumerate(nest):
            yield from _paths(v, f"{prefix}{i}/")
    elif isinstance(nest, Variable):
        yield prefix.rstrip("/"), nest
    else:
        raise ReplicateError(f"checkpoint state must be a nest of Variables, found "
                             f"{type(nest).__name__} at {prefix!r}")


def named_variables(state) -> dict:
    """{path: Variable} for a nest of variables (an object with .variables() is expanded)."""
    if hasattr(state, "variables") and callable(state.variables):
        state = state.variables()
    out = {}
    for path, var in _paths(state):
        if path in out:
            raise ReplicateError(f"checkpoint: duplicate path {path!r}")
        out[path] = var
    return out


def _umask() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it; put it straight back
    os.umask(mask)
    return mask


def save(path: str, state, step: int = 0, meta: dict | None = None, comm=None) -> None:
    """Write ``state`` (a nest of Variables), ``step`` and JSON-able ``meta`` to ``path``."""
    comm = comm or world()
    if comm.rank != 0:
        return
    arrays = {f"var/{name}": var.value for name, var in named_variables(state).items()}
    info = {"step": int(step), "meta": meta or {}, "format": 1}
    arrays["info"] = np.frombuffer(json.dumps(info).encode(), dtype=np.uint8)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".npz", dir=folder)
    try:
        if hasattr(os, "fchmod"):  # mkstemp makes it 0600; give it a plain file's mode
            os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load(path: str) -> tuple[dict, dict]:
    """Read a checkpoint: ({path: array}, info with 'step' and 'meta')."""
    with np.load(path) as data:
        arrays = {k[4:]: data[k] for k in data.files if k.startswith("var/")}
        info = json.loads(bytes(data["info"]).decode())
    return arrays, info


def restore(path: str, state, comm=None) -> dict:
    """Load ``path`` into the Variables of ``state`` on every rank; return its info dict."""
    comm = comm or world()
    payload = None
    if comm.rank == 0:
        try:
            payload = load(path)
        except Exception as e:  # noqa: BLE001 - reported on every rank below
            payload = ReplicateError(f"cannot read checkpoint {path!r}: {e}")
    payload = comm.bcast_obj(payload, 0)
    if isinstance(payload, Exception):
        raise payload
    arrays, info = payload
    variables = named_variables(state)
    missing = sorted(set(variables) - set(arrays))
    if missing:
        raise ReplicateError(f"checkpoint {path!r} lacks {missing}")
    for name, var in variables.items():
        value = arrays[name]
        if value.shape != var.value.shape or value.dtype != var.value.dtype:
            raise ReplicateError(f"checkpoint {path!r}: {name} is {value.dtype}{value.shape}, "
                                 f"the variable is {var.value.dtype}{var.value.shape}")
        var.value = np.array(value)
        var._eager = None
    return info
