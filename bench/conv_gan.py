"""A small conv GAN step, 2 processes: replicate (graph NumPy / JAX backends, eager) vs PyTorch DDP.

Model (28x28 single-channel images; scikit-learn's 8x8 digits upsampled to 28x28 by nearest
neighbour, scaled to [-1, 1]; random images where scikit-learn is missing — the timings do not
depend on the pixels):

* generator: noise 32 -> Linear 3136 -> reshape (64, 7, 7) -> BatchNorm (cross-replica) + ReLU
  -> ConvTranspose2d(64->32, k4, s2, p1) -> BatchNorm (cross-replica) + ReLU
  -> ConvTranspose2d(32->1, k4, s2, p1) -> tanh;
* discriminator: Conv2d(1->32, k4, s2, p1) -> leaky ReLU(0.2) -> Conv2d(32->64, k4, s2, p1)
  -> leaky ReLU(0.2) -> flatten -> Linear 3136 -> 1 logit.

One step: one generator forward; one discriminator update on the real and the (detached) fake
images in one forward (concatenated, non-saturating BCE loss), then one generator update through
the updated discriminator (its weights not differentiated); two Adam optimisers (lr 2e-4, betas
0.5/0.999); both gradients averaged over every replica. Every row starts from the same weights
and sees the same global batch of 128 (a pool of 4 global batches, cycled), so the first step's
losses agree across rows (up to rounding; a row without cross-replica BatchNorm differs).

Rows, run with ``mpiexec -n 2`` (``python -m replicate.launch``), every process pinned to its
own core, 1 thread (BLAS, OpenMP, XLA, torch):

* replicate graph mode, NumPy and JAX backends: 2 processes x 2 replicas, batch 32 per replica;
* replicate eager mode: one replica per process, so 2 processes x 1 replica, batch 64;
* PyTorch DDP (gloo): 2 processes, batch 64 per process, ``torch.set_num_threads(1)``;
  ``torch.nn.SyncBatchNorm`` where it runs (it needs a GPU in torch 2.x: then plain
  ``BatchNorm2d``, each process normalising with its own 64 images, and the table says so).

Every row runs as a fresh 2-process job (a failing row must not take the others with it), in
``--passes`` passes over the rows (rows alternating, so a change in other jobs' load falls on
every row). Figures per row:

* first step: from just before the Replicator (or the DDP wrappers and optimisers) is built to
  the end of the first ``run(1)`` (construction, tracing, the passes, XLA compiling, the first
  step; a barrier before, the slowest rank); median over the passes. Imports (jax, torch) and
  the model's layers are outside it;
* steady step: warm-up steps, then rounds of ``--steps`` steps, a barrier before and after each
  round, the slowest rank's time; median over every round of every pass; the ratio to DDP's;
* JAX backend: the compiled step's segments (``rep.executable().kernels``): ``jit[...]``
  segments and host steps (communication).

    python bench/conv_gan.py            # about 4 minutes on an idle 2-core machine
    python bench/conv_gan.py --quick    # smoke run (few steps, no JSON)
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
from _workers import init_gloo  # noqa: E402

NOISE, GLOBAL_BATCH, PROCS, POOL = 32, 128, 2, 4
LR, BETAS, SLOPE = 2e-4, (0.5, 0.999), 0.2
# row -> (replicas per process, batch per replica)
ROWS = {
    "replicate graph numpy": (2, 32),
    "replicate graph jax": (2, 32),
    "replicate eager (numpy)": (1, 64),
    "PyTorch DDP (gloo)": (1, 64),
}
DDP = "PyTorch DDP (gloo)"


# -- data and weights (the same for every row) -----------------------------------------------------
def images():
    """(n, 1, 28, 28) float32 in [-1, 1]."""
    import numpy as np

    try:
        from sklearn.datasets import load_digits

        x = load_digits().images.astype(np.float32)  # (1797, 8, 8), values 0..16
        idx = (np.arange(28) * 8) // 28
        x = x[:, idx][:, :, idx] / 8.0 - 1.0
    except ImportError:
        x = np.random.default_rng(0).uniform(-1, 1, (1797, 28, 28)).astype(np.float32)
    return x[:, None]


def global_pool(seed=0):
    """POOL global batches, each a list of 4 slots of 32 (real, z): slot i is replica i's batch
    with 4 replicas, and slots 2r, 2r+1 concatenated are process r's with 2 processes x 1."""
    import numpy as np

    data = images()
    rng = np.random.default_rng(seed)
    slots = GLOBAL_BATCH // 32
    return [[(data[rng.integers(0, len(data), 32)],
              rng.standard_normal((32, NOISE)).astype(np.float32)) for _ in range(slots)]
            for _ in range(POOL)]


def local_batches(pool, replica, k):
    """The batches of global replica ``replica`` when each process runs ``k`` replicas."""
    import numpy as np

    per = (GLOBAL_BATCH // 32) // (PROCS * k)  # slots per replica
    out = []
    for glob in pool:
        part = glob[replica * per:(replica + 1) * per]
        out.append((np.concatenate([p[0] for p in part]), np.concatenate([p[1] for p in part])))
    return out


def build_replicate(seed=0):
    import numpy as np

    import replicate as rp
    import replicate.numpy as rnp

    rng = np.random.default_rng(seed)
    leaky = lambda x: rp.nn.leaky_relu(x, SLOPE)  # noqa: E731
    gen = rp.nn.Sequential(
        rp.nn.Linear(NOISE, 64 * 7 * 7, rng=rng),
        lambda x: rnp.reshape(x, (x.shape[0], 64, 7, 7)),
        rp.nn.BatchNorm(64, cross_replica=True), rp.nn.relu,
        rp.nn.ConvTranspose2d(64, 32, 4, stride=2, padding=1, rng=rng),
        rp.nn.BatchNorm(32, cross_replica=True), rp.nn.relu,
        rp.nn.ConvTranspose2d(32, 1, 4, stride=2, padding=1, rng=rng), rp.nn.tanh)
    disc = rp.nn.Sequential(
        rp.nn.Conv2d(1, 32, 4, stride=2, padding=1, rng=rng), leaky,
        rp.nn.Conv2d(32, 64, 4, stride=2, padding=1, rng=rng), leaky,
        rp.nn.Flatten(), rp.nn.Linear(64 * 7 * 7, 1, rng=rng))
    return gen, disc


def replicate_step(gen, disc, batch):
    import numpy as np

    import replicate as rp
    import replicate.numpy as rnp

    g_opt = rp.wrap_optimizer(rp.optim.Adam(gen.parameters(), lr=LR, b1=BETAS[0], b2=BETAS[1]))
    d_opt = rp.wrap_optimizer(rp.optim.Adam(disc.parameters(), lr=LR, b1=BETAS[0], b2=BETAS[1]))
    bce = rp.nn.sigmoid_binary_cross_entropy
    targets = np.concatenate([np.ones((batch, 1), np.float32), np.zeros((batch, 1), np.float32)])

    def step_fn(b):
        real, z = b
        fake = gen(z)
        logits = disc(rnp.concatenate([real, rnp.stop_gradient(fake)], axis=0))
        d_loss = bce(logits, targets).mean()
        d_opt.apply(rp.grad(d_loss, disc.parameters()))
        g_loss = bce(disc(fake), 1.0).mean()  # non-saturating
        g_opt.apply(rp.grad(g_loss, gen.parameters()))
        return {"d_loss": d_loss, "g_loss": g_loss}

    return step_fn


def replicate_runner(comm, row, pool):
    """(build, run): build() makes the Replicator, run(steps) -> (d_loss, g_loss) of the last."""
    import replicate as rp
    from replicate.backends import get_backend

    k, batch = ROWS[row]
    mode = "eager" if "eager" in row else "graph"
    backend = row.split()[-1].strip("()")
    get_backend(backend)  # import the backend (jax) outside the timed first step
    gen, disc = build_replicate()
    step_fn = replicate_step(gen, disc, batch)
    state = {}

    def input_fn(ctx):
        batches = local_batches(pool, ctx.replica_id, k)
        i = 0
        while True:
            yield batches[i % len(batches)]
            i += 1

    def build():
        state["rep"] = rp.Replicator(input_fn, step_fn, mode=mode, backend=backend,
                                     replicas_per_rank=k)
        return state["rep"]

    def run(steps):
        h = state["rep"].run(steps=steps)
        return float(h[-1]["d_loss"]), float(h[-1]["g_loss"])

    return build, run


def torch_models(sync_bn):
    """The generator and discriminator with replicate's initial weights."""
    import torch
    from torch import nn

    gen_r, disc_r = build_replicate()

    def bn(n):
        return nn.SyncBatchNorm(n) if sync_bn else nn.BatchNorm2d(n)

    gen = nn.Sequential(nn.Linear(NOISE, 64 * 7 * 7), nn.Unflatten(1, (64, 7, 7)), bn(64),
                        nn.ReLU(), nn.ConvTranspose2d(64, 32, 4, 2, 1), bn(32), nn.ReLU(),
                        nn.ConvTranspose2d(32, 1, 4, 2, 1), nn.Tanh())
    disc = nn.Sequential(nn.Conv2d(1, 32, 4, 2, 1), nn.LeakyReLU(SLOPE),
                         nn.Conv2d(32, 64, 4, 2, 1), nn.LeakyReLU(SLOPE), nn.Flatten(),
                         nn.Linear(64 * 7 * 7, 1))
    for tm, rm in ((gen, gen_r), (disc, disc_r)):
        params = {name: v.numpy() for name, v in rm.parameters().items()}
        with torch.no_grad():
            for name, p in tm.named_parameters():
                value = params[name]
                if isinstance(tm[int(name.split(".")[0])], nn.Linear) and name.endswith("weight"):
                    value = value.T  # replicate's Linear weight is (in, out)
                p.copy_(torch.from_numpy(value.copy()))
    return gen, disc


def sync_bn_works() -> str:
    """'' when torch.nn.SyncBatchNorm runs here (forward and backward), else why not."""
    import torch

    try:
        m = torch.nn.SyncBatchNorm(2)
        m(torch.ones(2, 2, 1, 1, requires_grad=True)).sum().backward()
    except Exception as e:  # noqa: BLE001
        return C._reason(e)
    return ""


def ddp_runner(comm, pool):
    import torch
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    init_gloo(comm)
    why = sync_bn_works()
    gen, disc = torch_models(sync_bn=not why)
    batches = [(torch.from_numpy(r), torch.from_numpy(z))
               for r, z in local_batches(pool, comm.Get_rank(), 1)]
    _, batch = ROWS[DDP]
    targets = torch.cat([torch.ones(batch, 1), torch.zeros(batch, 1)])
    ones = torch.ones(batch, 1)
    bce = torch.nn.BCEWithLogitsLoss()
    state = {"i": 0}

    def build():
        g = DistributedDataParallel(gen)
        d = DistributedDataParallel(disc)
        state.update(g=g, d=d, d_params=list(disc.parameters()),
                     g_opt=torch.optim.Adam(g.parameters(), lr=LR, betas=BETAS),
                     d_opt=torch.optim.Adam(d.parameters(), lr=LR, betas=BETAS))

    def run(steps):
        g, d, g_opt, d_opt = state["g"], state["d"], state["g_opt"], state["d_opt"]
        for _ in range(steps):
            real, z = batches[state["i"] % len(batches)]
            state["i"] += 1
            fake = g(z)
            d_loss = bce(d(torch.cat([real, fake.detach()])), targets)
            d_opt.zero_grad(set_to_none=True)
            d_loss.backward()
            d_opt.step()
            for p in state["d_params"]:  # the generator's update differentiates no D weight
                p.requires_grad_(False)
            g_loss = bce(d.module(fake), ones)  # not through DDP: no D gradient to reduce
            g_opt.zero_grad(set_to_none=True)
            g_loss.backward()
            g_opt.step()
            for p in state["d_params"]:
                p.requires_grad_(True)
        return (comm.allreduce(float(d_loss.detach())) / comm.Get_size(),
                comm.allreduce(float(g_loss.detach())) / comm.Get_size())

    note = "" if not why else "plain BatchNorm2d (per process, 64 images): SyncBatchNorm " \
        f"does not run here ({why})"
    return build, run, note


# -- one row: a worker job of 2 processes --------------------------------------------------------
def make_runner(comm, row, pool):
    if row == DDP:
        return ddp_runner(comm, pool)
    return (*replicate_runner(comm, row, pool), "")


def worker(args):
    """One row in a fresh 2-process job: its first step, warm-up, ``--rounds`` timed rounds.
    (One row per job: a failing row must not take the others with it, as the Replicator ends
    the whole MPI job on an error; and the eager row's memory would not leave room for more.)"""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    C.pin_cpus(1, first=rank)  # XLA's CPU runtime uses every core it may, whatever its flags say
    C.set_torch_threads(1)
    build, run, note = make_runner(comm, args.row, global_pool())
    comm.Barrier()
    t0 = time.perf_counter()
    rep = build()
    t1 = time.perf_counter()
    losses = run(1)
    t2 = time.perf_counter()
    out = {"name": args.row, "note": note, "first_step_s": comm.allreduce(t2 - t0, op=MPI.MAX),
           "build_s": comm.allreduce(t1 - t0, op=MPI.MAX), "first_d_loss": losses[0],
           "first_g_loss": losses[1], "rounds": []}
    if rep is not None and rep.mode == "graph":
        kernels = rep.executable().kernels
        out["kernels"] = len(kernels)
        out["jit_segments"] = sum(1 for k in kernels if k.startswith("jit"))
        out["host_steps"] = dict(collections.Counter(k for k in kernels if k.startswith("host")))
        out["trace_count"] = rep.trace_count
    run(args.warmup)
    for _ in range(args.rounds):
        comm.Barrier()
        t0 = time.perf_counter()
        run(args.steps)
        comm.Barrier()
        out["rounds"].append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX) / args.steps)
    if rank == 0:
        C.write_worker_json(args.json, out)
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except ImportError:
        pass


def run_job(args, row, p):
    """One worker job: its JSON, or the reason it failed (a string)."""
    C.record_load()
    path = os.path.join(C.RESULTS_DIR, ".worker-conv-gan.json")
    cmd = [sys.executable, "-m", "replicate.launch", "-n", str(PROCS), os.path.abspath(__file__),
           "--worker", "--json", path, "--row", row, "--steps", str(args.steps),
           "--rounds", str(args.rounds), "--warmup", str(args.warmup)]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=C.thread_env(1), capture_output=True, text=True,
                              timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return f"timed out after {args.timeout} s"
    print(f"[bench] conv_gan.py: pass {p + 1}/{args.passes}, {row}: "
          f"{time.perf_counter() - t0:.0f} s{'' if proc.returncode == 0 else ' (failed)'}",
          file=sys.stderr, flush=True)
    if proc.returncode != 0 or not os.path.exists(path):
        if os.environ.get("BENCH_DEBUG"):
            print(proc.stdout + proc.stderr, file=sys.stderr)
        return C.failure_reason(proc.stdout + proc.stderr)
    with open(path) as f:
        out = json.load(f)
    os.remove(path)
    return out


def launch(args):
    """``--passes`` passes over the rows, each row a fresh job per pass (rows alternate, so a
    change in other jobs' load falls on every row); a row that fails is not run again."""
    os.makedirs(C.RESULTS_DIR, exist_ok=True)
    jobs = {row: [] for row in ROWS}
    failed = {row: C.backend_unavailable(row.split()[-1]) for row in ROWS
              if row.startswith("replicate graph")}
    failed = {row: why for row, why in failed.items() if why}
    for p in range(args.passes):
        for row in ROWS:
            if row in failed:
                continue
            got = run_job(args, row, p)
            if isinstance(got, str):
                failed[row] = got
            else:
                jobs[row].append(got)
    results = []
    for row, runs in jobs.items():
        if not runs:
            results.append({"name": row, "timing": None, "note": failed.get(row, ""),
                            "extra": None})
            continue
        ts = [t for r in runs for t in r["rounds"]]
        extra = {k: v for k, v in runs[0].items() if k not in ("name", "note", "rounds")}
        extra["first_step_s"] = statistics.median(r["first_step_s"] for r in runs)
        extra["first_step_samples"] = [r["first_step_s"] for r in runs]
        extra["build_s"] = statistics.median(r["build_s"] for r in runs)
        extra["rounds"] = ts
        note = runs[0]["note"]
        if row in failed:
            note = "; ".join(x for x in (note, f"a later pass failed: {failed[row]}") if x)
        results.append({"name": row, "note": note, "extra": extra,
                        "timing": asdict(C.Timing(statistics.median(ts), min(ts), max(ts),
                                                  len(ts)))})
    return results


def report(results, command, args):
    rows = C.rows_from(results)
    ddp = next((r.timing for r in rows if r.name == DDP), None)
    cells, footnotes = [], []
    for r in rows:
        e = r.extra or {}
        k, b = ROWS[r.name]
        layout = f"{PROCS} x {k}, batch {b}"
        notes = []
        if r.note:
            footnotes.append(f"{r.name}: {r.note}")
            notes.append(f"[{len(footnotes)}]")
        if r.timing is None:
            cells.append([r.name, layout, "n/a", "n/a", "n/a", "", "", "; ".join(notes)])
            continue
        segs = ""
        if r.name.endswith("jax") and "jit_segments" in e:
            segs = f"{e['jit_segments']} jit + {sum(e['host_steps'].values())} host"
        elif "kernels" in e:
            segs = f"{e['kernels']} kernels"
        if "noisy" in C.note(C.Row(r.name, r.timing)):
            notes.append(C.note(C.Row(r.name, r.timing)))
        if "eager" in r.name:
            notes.append("eager: 1 replica per process")
        first = e["first_step_samples"]
        cells.append([r.name, layout, f"{e['first_step_s']:.2f} ({min(first):.2f}-"
                      f"{max(first):.2f})" if len(first) > 1 else f"{first[0]:.2f}",
                      f"{r.timing.median * 1e3:.1f} ({r.timing.min * 1e3:.1f})",
                      C.ratio(r.timing, ddp), segs,
                      f"{e['first_d_loss']:.4f} / {e['first_g_loss']:.4f}", "; ".join(notes)])
    title = ("Conv GAN step, 2 processes x 1 thread, global batch 128 (28x28x1, Adam x 2, "
             "cross-replica BatchNorm)" + (" — quick run" if args.quick else ""))
    text = [C.header(title, command),
            C.table(["implementation", "processes x replicas, batch/replica",
                     "first step s median (range)", "steady ms/step median (min)", "vs DDP",
                     "compiled step", "step-1 d_loss / g_loss", "note"], cells), ""]
    text.append(
        f"Each row ran as a fresh 2-process job in each of {args.passes} passes (rows "
        "alternating). First step: construction + trace + compile + step 1, slowest rank, "
        f"median over the passes. Steady: {args.rounds} rounds of {args.steps} steps per job "
        f"after {args.warmup} warm-up steps, slowest rank, median over every round. Eager mode "
        "runs one replica per process, so its row (and DDP's) is 2 x 1 with batch 64: the same "
        "global batch of 128. Compiled step: the backend's kernels (NumPy) or jit segments and "
        "host steps (JAX; host steps are communication), from `rep.executable().kernels`. The "
        "step-1 losses agree where the rows compute the same step.")
    for i, f in enumerate(footnotes, 1):
        text.append(f"\n[{i}] {f}")
    out = "\n".join(text) + "\n"
    print(out)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: few steps, no JSON")
    ap.add_argument("--steps", type=int, default=10, help="steps per timed round")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per row and pass")
    ap.add_argument("--warmup", type=int, default=3, help="warm-up steps after the first")
    ap.add_argument("--passes", type=int, default=3, help="jobs per row, rows alternating")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--row", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--timeout", type=int, default=400, help="seconds per row")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.rounds, args.warmup, args.passes = 2, 2, 1, 1
    if args.worker:
        return worker(args)
    t0 = time.perf_counter()
    results = launch(args)
    command = "python bench/conv_gan.py" + (" --quick" if args.quick else "")
    text = report(results, command, args)
    print(f"[bench] conv_gan.py: {time.perf_counter() - t0:.0f} s in all", file=sys.stderr)
    if not args.quick:
        C.save_json("conv_gan", {"machine": C.machine(), "versions": C.versions(),
                                 "results": results, "markdown": text})


if __name__ == "__main__":
    main()
