"""Checkpoints: variables, step and metadata in a ``.npz`` that NumPy alone can read.

Written atomically by rank 0 (temporary file in the same folder, fsync, rename), so a crash mid-
write never leaves a half-written checkpoint under the final name; ``save`` returns on every rank
only once the file is in place (a rank may read it straight away), and a failed write is the same
``CheckpointError`` naming the path on every rank. On restore rank 0 reads the file and broadcasts
it, so every rank ends in the same state even without a shared file system.

Each array's SHA-256 (of its dtype, shape and bytes) is stored in the ``info`` entry; ``load``
checks them, so a truncated or corrupted file is a ``CheckpointError``, never silently wrong
state. Given a pattern with ``{step}`` (as ``rp.callbacks.Checkpoint`` writes),
``restore``/``Replicator.restore`` take the newest checkpoint that is intact and warn about each
newer one that is not.

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

import fcntl
import hashlib
import json
import os
import tempfile
import time
import warnings

import numpy as np

from ... import profile
from ...dtypes import as_dtype, bfloat16
from ...errors import (
    CheckpointError,
    ReplicateError,
    class_name,
    error_of_class,
    source_line,
    user_frame,
)
from ...sharding import load_whole, whole_values
from ...state import Variable
from ..checks import sync_check
from ..communication.agree import RESTORE, SAVE, agree
from ..communication.comm import world
from . import owners, runs
from .archive import Archive
from .runs import step_files


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


@profile.spanned("checkpoint save", "checkpoint")
def save(path: str, state, step: int = 0, meta: dict | None = None, comm=None,
         verify: bool = True, run: str | None = None) -> None:
    """Write ``state`` (a nest of Variables), ``step`` and JSON-able ``meta`` to ``path``.

    Call it on every rank: rank 0 writes once every rank has come here (none still reads what an
    earlier save left under this name), and every rank returns once the file is in place under
    its final name (so any rank may read it at once), or raises the same ``CheckpointError``
    naming ``path`` when the write failed. With ``verify`` (the default) the ranks first compare
    their copies of the state's variables (``runtime/checks/sync_check.py``): if they differ,
    every rank raises ``rp.DivergenceError`` and nothing is written — a checkpoint holds one value
    that every rank had, never rank 0's copy of diverged state. ``run``: the run id the file
    names (``runs.py``; ``rp.callbacks.Checkpoint`` gives it)."""
    comm = comm or world()
    try:
        variables = named_variables(state)
    except ReplicateError:  # not a nest of Variables: rank 0's write says so, below
        variables = {}
    fetched = []
    if comm.size > 1:  # (MPI's bcast may return on rank 0 before the others receive)
        _agree(comm, SAVE, f"checkpoint.save({path!r})")
        # model parallelism: the Variables that live on another device, from there
        fetched = owners.gather(variables.values())
        if verify:
            sync_check.verify(comm, list(variables.values()), step,
                              f"before writing checkpoint {path!r}")
        else:
            comm.allgather_obj(None)
    replicas = {**_every_replica(comm, variables), **whole_values(comm, variables)}
    error = None
    if comm.rank == 0:
        try:
            _write(path, state, step, meta, replicas, run)
        except ReplicateError as e:  # (state is not a nest of Variables, ...)
            error = e
        except Exception as e:  # noqa: BLE001 - reported on every rank below
            error = CheckpointError(f"cannot write checkpoint {path!r}: {type(e).__name__}: {e}")
            error.__cause__ = e
    owners.release(fetched)  # (their devices keep them: the memory stays split)
    if comm.size > 1:  # every rank waits for the writer's verdict: (error class, message) or None
        verdict = comm.bcast_obj(None if error is None else (class_name(error), str(error)), 0)
        if comm.rank != 0 and verdict is not None:
            error = error_of_class(*verdict)
    if error is not None:
        error.consistent = True  # every rank raises it
        raise error


def _agree(comm, kind, call: str) -> None:
    """Every rank makes this call: a rank making another one (or none) is named, with both
    calls' lines, instead of the two exchanges meeting as an MPI error."""
    where = source_line(user_frame())
    agree(comm, kind, describe=lambda: f"{call} at {where}")


def _every_replica(comm, variables: dict) -> dict:
    """{path: (R, ...)}: every replica's value of each per-replica variable, in global replica
    order (one exchange; a variable no step has used yet keeps its one starting value,
    ``(1, ...)``, saved as such)."""
    names = [name for name, var in variables.items() if var.per_replica and not var._fresh]
    if not names:
        return {}
    rows = comm.allgather_obj([variables[n].value for n in names]) if comm.size > 1 else \
        [[variables[n].value for n in names]]
    return {name: np.concatenate([row[i] for row in rows]) for i, name in enumerate(names)}


def _write(path, state, step, meta, replicas: dict, run=None) -> None:
    """Rank 0's part of ``save``: a temporary file in the same folder (locked while written, so
    ``clean_stale`` knows a dead writer's), fsync, rename, fsync of the folder."""
    variables = named_variables(state)
    arrays = {f"var/{name}": np.asarray(replicas.get(name, var.value))
              for name, var in variables.items()}
    # per replica: how many replicas' values it holds (0: the one starting value of a variable
    # no step had used)
    per_replica = {f"var/{name}": (len(replicas[name]) if name in replicas else 0)
                   for name, var in variables.items() if var.per_replica}
    # .npy has no bfloat16: its bits are stored as uint16 and the info names the dtype
    # (np.load(path)["var/w"].view(ml_dtypes.bfloat16))
    dtypes = {key: "bfloat16" for key, value in arrays.items() if value.dtype == bfloat16}
    for key in dtypes:
        arrays[key] = arrays[key].view(np.uint16)
    info = {"step": int(step), "meta": meta or {}, "format": 2, "dtypes": dtypes,
            "per_replica": per_replica,
            "sha256": {key: digest(value) for key, value in arrays.items()}}
    if run is not None:
        info["run"] = run
    arrays["info"] = np.frombuffer(json.dumps(info).encode(), dtype=np.uint8)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    clean_stale(folder)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".npz", dir=folder)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # (released when the file is closed, or the writer dies)
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


STALE_AFTER = 60.0  # seconds: a temporary file younger than this may not be locked yet


def clean_stale(folder: str) -> list[str]:
    """Remove the temporary files (``.tmp-*.npz``) that writers killed mid-save left in
    ``folder``: plain files of this user, older than ``STALE_AFTER``, that no live writer holds
    locked (the lock goes with the writer's process). The paths removed; never raises."""
    removed = []
    try:
        names = [n for n in os.listdir(folder) if n.startswith(".tmp-") and n.endswith(".npz")]
    except OSError:
        return removed
    for name in names:
        path = os.path.join(folder, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if st.st_uid != os.geteuid() or not os.path.isfile(path) or \
                    time.time() - st.st_mtime < STALE_AFTER:
                continue
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # (OSError: a live writer's)
            if os.stat(path, follow_symlinks=False).st_ino == st.st_ino:
                os.unlink(path)
                removed.append(path)
        except OSError:
            continue
        finally:
            os.close(fd)
    return removed


def digest(a: np.ndarray) -> str:
    """SHA-256 of an array's dtype, shape and bytes."""
    h = hashlib.sha256(f"{a.dtype.str}{a.shape}".encode())
    h.update(np.ascontiguousarray(a).reshape(-1).view(np.uint8).data)
    return h.hexdigest()


def load(path: str, names=None) -> tuple[dict, dict]:
    """Read a checkpoint and verify its checksums: ({path: array}, info with 'step' and 'meta');
    ``names``: only those arrays are read (the others are not touched).

    Every missing, truncated, corrupt or malformed file is a ``CheckpointError``
    (``archive.py``: what is checked before anything is read)."""
    with Archive(path) as archive:
        info = archive.info()
        keys = set(archive.members) - {"info"}
        sums = info.get("sha256")
        if sums is not None and set(sums) != keys:  # (format 1 files have none)
            raise CheckpointError(f"checkpoint {path!r} is corrupt: its arrays "
                                  f"{sorted(keys ^ set(sums))} do not match its index")
        wanted = keys if names is None else keys & {f"var/{n}" for n in names}
        arrays = {}
        for key in sorted(wanted):
            arrays[key] = archive.array(key)
            if sums is not None and digest(arrays[key]) != sums[key]:
                raise CheckpointError(f"checkpoint {path!r} is corrupt: checksum mismatch in "
                                      f"{key[4:]!r}")
    for key, name in info.get("dtypes", {}).items():
        if key in arrays:
            arrays[key] = arrays[key].view(as_dtype(name))
    return {k[4:]: v for k, v in arrays.items() if k.startswith("var/")}, info


def load_latest(pattern: str, names=None) -> tuple[dict, dict, str, list[str]]:
    """The newest intact checkpoint a ``{step}`` pattern names: (arrays, info, path, skipped),
    ``skipped`` saying why each newer file was passed over; ``names`` as for ``load``."""
    candidates = step_files(pattern)
    if not candidates:
        raise CheckpointError(f"no checkpoint matches {pattern!r}")
    skipped = []
    for _, path in candidates:
        try:
            arrays, info = load(path, names)
        except CheckpointError as e:
            skipped.append(str(e))
            continue
        return arrays, info, path, skipped
    raise CheckpointError(f"no intact checkpoint matches {pattern!r}:\n  " + "\n  ".join(skipped))


def restore(path: str, state, comm=None, missing_ok: bool = False) -> dict | None:
    """Load ``path`` into the Variables of ``state`` on every rank; return its info dict (with
    ``"path"``: the file used).

    ``path`` may be a pattern with ``{step}``: the newest intact file is used, with a warning for
    each newer one that is truncated or corrupt. ``missing_ok``: a pattern that no file matches
    yet returns None and leaves ``state`` as it is (files that all fail to load still raise)."""
    comm = comm or world()
    if comm.size > 1:
        _agree(comm, RESTORE, f"checkpoint restore({path!r})")
    payload = None
    if comm.rank == 0:
        try:
            names = list(named_variables(state))
            if "{" in path and missing_ok and not step_files(path):
                payload = None
            elif "{" in path:
                payload = load_latest(path, names)
            else:
                payload = (*load(path, names), path, [])
        except Exception as e:  # noqa: BLE001 - reported on every rank below
            payload = e if isinstance(e, ReplicateError) else CheckpointError(
                f"cannot read checkpoint {path!r}: {e}")
    payload = comm.bcast_obj(payload, 0)
    if payload is None:
        return None
    if isinstance(payload, Exception):
        payload.consistent = True  # every rank raises it
        raise payload
    arrays, info, used, skipped = payload
    runs.restored(used, info.get("run"))
    for reason in skipped:
        warnings.warn(f"{reason}; using the previous checkpoint instead", stacklevel=2)
    variables = named_variables(state)
    missing = sorted(set(variables) - set(arrays))
    problems = [f"lacks {missing}"] if missing else []
    saved_replicas = {key[4:]: n for key, n in info.get("per_replica", {}).items()}
    for name, var in variables.items():
        value = arrays.get(name)
        if value is None:
            continue
        if var.per_replica != (name in saved_replicas):
            problems.append(f"{name} is {'not ' if var.per_replica else ''}per replica in the "
                            f"checkpoint, the variable is{'' if var.per_replica else ' not'}")
            continue
        shape = value.shape[1:] if var.per_replica else value.shape
        if (shape, value.dtype) != (var.shape, var.dtype):
            problems.append(f"{name} is {value.dtype}{shape}, the variable is "
                            f"{var.dtype}{var.shape}")
        elif saved_replicas.get(name):
            problems.extend(_replica_problem(name, var, saved_replicas[name], comm.size))
    if problems:
        error = CheckpointError(f"checkpoint {used!r} does not fit the state: "
                                + "; ".join(problems))
        error.consistent = True  # every rank has the same file and the same state
        raise error
    for name, var in variables.items():
        value = np.array(arrays[name])
        if not var.per_replica:
            load_whole(var, value)  # (sharded optimiser state: this process's slice)
        elif saved_replicas[name] == 0:  # the starting value of every replica
            var.restart(value[0])
        else:  # this rank's replicas' rows
            k = saved_replicas[name] // comm.size
            var.load(value[comm.rank * k:(comm.rank + 1) * k])
    return dict(info, path=used)


def _replica_problem(name, var, saved: int, ranks: int) -> list:
    """Why a checkpoint holding ``saved`` replicas' values of ``var`` cannot go to this job's
    replicas (``[]`` when it can): each replica gets its own value back, never another's."""
    k = None if var._fresh else var.value.shape[0]
    if saved % ranks == 0 and (k is None or k * ranks == saved):
        return []
    mine = f"{k} per process × {ranks} processes" if k else f"{ranks} processes"
    return [f"{name} holds the values of {saved} replicas, this job has {mine}: per-replica "
            "values restore only into the same number of replicas"]
