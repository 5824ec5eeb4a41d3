"""Failures at the edges of a job, as a user's script meets them (tests/runtime/test_startup.py).

    mpiexec -n 2 python -m replicate startup_mpi.py CASE [--rank R] [--token T]
    python -m replicate.launch -n 3 startup_mpi.py CASE ...

Every case but ``ok`` and ``config-fields`` must end the whole job fast, non-zero, with a message
naming the rank and what happened. ``--rank``: the rank that misbehaves (default 1).
"""

import os
import sys

CASE = sys.argv[1]
RANK = int(sys.argv[sys.argv.index("--rank") + 1]) if "--rank" in sys.argv else 1
ME = int(os.environ.get("PMI_RANK", "0"))

if CASE == "raise-before-import" and ME == RANK:  # before any replicate (or mpi4py) import
    raise RuntimeError(f"rank {ME} broke before importing replicate")  # MARK before-import

if CASE == "raise-after-mpi4py":
    from mpi4py import MPI  # the user's own MPI import

    if MPI.COMM_WORLD.Get_rank() == RANK:
        raise RuntimeError(f"rank {ME} broke after its own mpi4py import")  # MARK after-mpi4py

import argparse  # noqa: E402

import numpy as np  # noqa: E402

import replicate as rp  # noqa: E402
import replicate.numpy as rnp  # noqa: E402


def say(text):
    """One line in one write (several ranks share the terminal: print writes the end apart)."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


parser = argparse.ArgumentParser()
parser.add_argument("case")
parser.add_argument("--rank", type=int, default=1)
parser.add_argument("--token", default="")
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--data", default="")
if CASE == "argparse-error" and ME == RANK:
    sys.argv.append("--steps=six")  # a typo in one rank's arguments: argparse exits with 2
args = parser.parse_args()
rank = rp.runtime.communication.comm.world().rank
assert rank == ME
say(f"rank {rank} mpich-shm-mapped: {' '.join(rp.runtime.job.mpi_shm.mapped())}")

if CASE == "lines":  # print's pieces (5 writes a line under PYTHONUNBUFFERED) from every rank
    for i in range(2000):
        print("line", rank, i)
    sys.exit(0)

if CASE == "pmi-order":  # the launcher's link is released before hydra's PMI connection
    def sockets():
        out = {}
        for fd in os.listdir("/proc/self/fd"):
            try:
                out.setdefault(os.readlink(f"/proc/self/fd/{fd}"), []).append(int(fd))
            except OSError:
                pass
        return out
    held = sockets()
    pmi = held[os.readlink(f"/proc/self/fd/{os.environ['PMI_FD']}")]
    link = held[os.readlink(f"/proc/self/fd/{rp.runtime.job.status._LINK[0]}")]
    good = len(link) == 1 and max(pmi) < link[0]
    say(f"rank {rank} pmi-order {'ok' if good else 'WRONG'}: pmi {sorted(pmi)} link {link}")
    sys.exit(0)

if CASE == "raise-after-import" and rank == RANK:
    raise ValueError(f"rank {rank} broke before its Replicator")  # MARK after-import

if CASE == "missing-file":
    path = args.data if rank != RANK else args.data + ".missing"
    data = np.load(path)  # MARK missing-file


def input_fn(ctx):
    i = 0
    while True:
        i += 1
        bad = CASE == "index" and rank == RANK and i == 3  # an id past the table's 10 rows
        yield np.full(4, 20.0 if bad else float(i), np.float32)


w = rp.Variable(np.zeros(4, np.float32), name="w")
table = rp.Variable(np.arange(40, dtype=np.float32).reshape(10, 4), name="table")


def step_fn(x):
    w.assign(w + rp.all_reduce(x, "mean"))
    return {"s": rnp.sum(x)}


def index_step_fn(x):
    ids = rnp.asarray(np.array([0, 1, 2])) + rnp.cast(rnp.max(x), np.int64)
    rows = table[ids]  # MARK index
    w.assign(w + rp.all_reduce(rnp.sum(rows, axis=0), "mean"))
    return {"s": rnp.sum(rows)}


def leave(replicator, step, outputs):
    """A callback: the misbehaving rank leaves at step 3."""
    if step == 3 and rank == RANK:
        if CASE == "sys-exit-0":
            sys.exit(0)  # MARK sys-exit
        if CASE == "os-exit-0":
            os._exit(0)  # MARK os-exit
        if CASE == "c-exit-0":
            import ctypes

            ctypes.CDLL(None)._exit(0)  # exit() below Python: no hook can see it


CONFIG_FIELDS = {  # field -> (Replicator keyword, value on every rank, value on RANK)
    "mode": ("mode", "graph", "eager"),
    "backend": ("backend", "numpy", "jax"),
    "replicas_per_rank": ("replicas_per_rank", 1, 2),
    "outputs": ("outputs", "mean", "per_replica"),
    "options": ("options", {"bucket_bytes": 1 << 20}, {"bucket_bytes": 1 << 10}),
    "check_finite": ("check_finite", False, True),
    "check_sync": ("check_sync", True, 5),
    "collective_timeout": ("collective_timeout", 300, 120),
}


def config_kwargs(field):
    key, common, odd = CONFIG_FIELDS[field]
    return {key: odd if rank == RANK else common}


if CASE == "config-fields":  # every field in turn: each a ConfigMismatchError on every rank
    for field in [*CONFIG_FIELDS, "variables", "bucket_exchange"]:
        extra = None
        if field == "variables" and rank == RANK:
            extra = rp.Variable(np.zeros((3, 2)), name="extra")  # a model with one more Variable
        kwargs = {} if field in ("variables", "bucket_exchange") else config_kwargs(field)
        if field == "bucket_exchange":  # a JAX process whose step is cut into segments (a GPU)
            from replicate.backends import jax_backend
            jax_backend.UNPACK_BUCKETS = rank != RANK
            kwargs = {"backend": "jax"}
        try:
            rp.Replicator(input_fn, step_fn, **kwargs)
        except rp.ConfigMismatchError as e:
            say(f"rank {rank} field {field}: {e}".replace("\n", " | "))
        else:
            say(f"rank {rank} field {field}: NOT DETECTED")
        if field == "bucket_exchange":
            jax_backend.UNPACK_BUCKETS = True
        del extra
    rp.Replicator(input_fn, step_fn)  # and alike again: no error
    say(f"rank {rank} config-fields done")
    sys.exit(0)

if CASE.startswith("config-"):  # one field differs, the error is not caught: the job ends
    rp.Replicator(input_fn, step_fn, **config_kwargs(CASE[len("config-"):]))  # MARK config
    sys.exit(0)

if CASE == "slow-start" and rank == RANK:  # slow is not dead: minutes of loading are fine
    import time

    time.sleep(3.0)
replicator = rp.Replicator(input_fn, index_step_fn if CASE == "index" else step_fn)
if CASE == "restore-one-rank":
    rp.checkpoint.save(args.data, [w], step=0)
    if rank == RANK:
        replicator.restore(args.data, [w])  # MARK restore
history = replicator.run(args.steps, callbacks=[leave])  # MARK run
say(f"rank {rank} finished {len(history)} steps")
