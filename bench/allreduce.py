"""Gradient all-reduce over 2 processes: replicate's (bucketed) all-reduce vs MPI and gloo.

The gradients are a ResNet-50-shaped parameter list: 161 tensors, 25,557,032 float32
(97.5 MiB): conv1 + BN, 16 bottleneck blocks (three convs, three BNs each, plus a projection
conv + BN in the first block of each stage), the 1000-way classifier.

    python bench/allreduce.py            # starts itself under mpiexec -n 2
    python -m replicate.launch -n 2 bench/allreduce.py [--quick]

Rows (each process 1 thread; interleaved rounds, a barrier before every timed call, the slowest
rank's time, median over rounds):

* replicate: a ``Replicator`` step whose gradients arrive as the batch and are reduced by
  ``rp.all_reduce(grads, "sum")`` into Variables. To isolate communication the *compiled step*
  (``Replicator.executable()``) is called directly: it contains only the all-reduce (with the
  bucketing pass: the packing into flat buckets, the MPI calls and the unpacking), and skips the
  per-step Python bookkeeping of ``Replicator.run`` (input iteration, the allgather of the
  step's outputs), which is shown as a separate row;
* replicate's communicator alone on one flat buffer (its fixed-order, reproducible algorithm);
* mpi4py: one ``Allreduce`` per tensor; one flat ``Allreduce`` of all bytes (buffer already
  packed), and the same with the packing/unpacking counted;
* ``torch.distributed`` with gloo: per tensor, one flat tensor, and 25 MB buckets (as DDP).

Then a bucket-size sweep (``rp.CompileOptions(bucket_bytes=...)``, 1-128 MB and off) and a
message-size sweep of the flat ``Allreduce`` whose fit ``t = a + b * bytes`` gives the local
alpha and beta used by ``scaleout_model.py``.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402

MB = 2**20


def resnet50_shapes():
    """Parameter shapes of torchvision's ResNet-50 (161 tensors, 25,557,032 values)."""
    shapes = [(64, 3, 7, 7), (64,), (64,)]
    inplanes = 64
    for planes, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            shapes += [(planes, inplanes, 1, 1), (planes,), (planes,),
                       (planes, planes, 3, 3), (planes,), (planes,),
                       (planes * 4, planes, 1, 1), (planes * 4,), (planes * 4,)]
            if b == 0:
                shapes += [(planes * 4, inplanes, 1, 1), (planes * 4,), (planes * 4,)]
            inplanes = planes * 4
    return shapes + [(1000, 2048), (1000,)]


def make_grads(shapes, rank):
    import numpy as np

    rng = np.random.default_rng(rank)
    return [(rng.standard_normal(s) * 1e-3).astype(np.float32) for s in shapes]


# -- timing across ranks --------------------------------------------------------------------------
def time_rows(comm, builders, warmup, rounds):
    """{name: build() -> fn}; interleaved rounds; each timed call starts after a barrier and
    counts as the slowest rank's time. Returns [Row]."""
    from mpi4py import MPI

    ready, rows = {}, {}
    for name, build in builders.items():
        if isinstance(build, str):
            rows[name] = C.Row(name, None, build)
            continue
        error = None
        try:
            fn = build()
            for _ in range(warmup):
                fn()
        except Exception as e:  # noqa: BLE001
            error = C._reason(e)
        errors = comm.allgather(error)  # every rank must agree that the row runs
        if any(errors):
            rows[name] = C.Row(name, None, next(e for e in errors if e))
            continue
        ready[name] = fn
        rows[name] = C.Row(name, None)
    times = {n: [] for n in ready}
    for _ in range(rounds):
        for name, fn in ready.items():
            comm.Barrier()
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            times[name].append(comm.allreduce(dt, op=MPI.MAX))
    for name, ts in times.items():
        rows[name].timing = C.Timing(statistics.median(ts), min(ts), max(ts), len(ts))
    return [rows[n] for n in builders]


# -- replicate ------------------------------------------------------------------------------------
def replicate_allreduce(grads, options=None):
    """A Replicator whose step all-reduces ``grads`` into Variables; returns (replicator,
    direct call of its compiled step)."""
    import numpy as np

    import replicate as rp

    out_vars = [rp.Variable(np.zeros_like(g), name=f"g{i}") for i, g in enumerate(grads)]

    def input_fn(ctx):
        while True:
            yield grads

    def step_fn(batch):
        reduced = rp.all_reduce(list(batch), "sum")
        for v, g in zip(out_vars, reduced):
            v.assign(g)
        return {}

    rep = rp.Replicator(input_fn, step_fn, replicas_per_rank=1, options=options)
    rep.run(steps=1)  # trace, compile, broadcast the variables
    exe = rep.executable()
    graph = rep.compiled_graph()
    variables = graph.meta["variables"]

    def direct():
        outs = exe([*grads, *[v.value for v in variables]])
        return outs

    result = direct()
    expected = _check_sum(grads)
    got = float(sum(np.asarray(o, np.float64).sum() for o in result[-len(grads):]))
    if not np.isclose(got, expected, rtol=1e-3):
        raise RuntimeError(f"replicate all-reduce result is wrong: sum {got} vs {expected}")
    return rep, direct


_EXPECTED = {}


def _check_sum(grads):
    """The sum over all ranks of all gradient values (what the reduced buffers must add to)."""
    import numpy as np
    from mpi4py import MPI

    key = id(grads)
    if key not in _EXPECTED:
        local = float(sum(np.asarray(g, np.float64).sum() for g in grads))
        _EXPECTED[key] = MPI.COMM_WORLD.allreduce(local, op=MPI.SUM)
    return _EXPECTED[key]


def count_comm(rep):
    """How many cross-process all-reduces the compiled step launches (blocking ``mpi_allreduce``
    or ``comm_start`` on the communication thread), and their sizes in bytes."""
    try:
        nodes = rep.executable().graph.nodes
    except Exception:  # noqa: BLE001
        nodes = rep.compiled_graph().nodes
    sizes = []
    for n in nodes:
        if n.prim in ("mpi_allreduce", "comm_start"):
            x = n.inputs[0]
            sizes.append(int(x.size * x.dtype.itemsize))
    return len(sizes), sizes


# -- peers ----------------------------------------------------------------------------------------
def mpi_rows(comm, grads):
    import numpy as np
    from mpi4py import MPI

    recvs = [np.empty_like(g) for g in grads]
    total = sum(g.size for g in grads)
    flat_send = np.concatenate([g.ravel() for g in grads])
    flat_recv = np.empty_like(flat_send)
    offsets = np.cumsum([0] + [g.size for g in grads])

    def per_tensor():
        for s, r in zip(grads, recvs):
            comm.Allreduce(s, r, op=MPI.SUM)

    def flat():
        comm.Allreduce(flat_send, flat_recv, op=MPI.SUM)

    def flat_packed():
        np.concatenate([g.ravel() for g in grads], out=flat_send)
        comm.Allreduce(flat_send, flat_recv, op=MPI.SUM)
        return [flat_recv[a:b].reshape(g.shape) for a, b, g in
                zip(offsets[:-1], offsets[1:], grads)]

    assert flat_send.size == total
    return per_tensor, flat, flat_packed, flat_send


def replicate_comm_flat(flat_send):
    from replicate.runtime.communication.comm import world

    w = world()
    return lambda: w.allreduce(flat_send, "sum")


def torch_init(comm):
    import torch.distributed as dist

    if dist.is_initialized():
        return dist
    port = None
    if comm.Get_rank() == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = comm.bcast(port, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=comm.Get_rank(), world_size=comm.Get_size())
    return dist


def gloo_rows(comm, grads):
    import torch

    torch.set_num_threads(1)
    dist = torch_init(comm)
    tensors = [torch.from_numpy(g.copy()) for g in grads]
    flat = torch.cat([t.reshape(-1) for t in tensors])
    buckets, current, size = [], [], 0
    for t in reversed(tensors):  # DDP fills buckets in reverse order (as the backward does)
        current.append(t)
        size += t.numel() * 4
        if size >= 25 * MB:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    flat_buckets = [torch.cat([t.reshape(-1) for t in b]) for b in buckets]

    def per_tensor():
        for t in tensors:
            dist.all_reduce(t)

    def one_flat():
        dist.all_reduce(flat)

    def bucketed():
        for b, fb in zip(buckets, flat_buckets):
            torch.cat([t.reshape(-1) for t in b], out=fb)
            dist.all_reduce(fb)

    # values double with each in-place sum; rescale between calls is not needed for the ~20
    # calls made here (1e-3 * 2**20 stays far from overflow)
    return per_tensor, one_flat, bucketed, len(buckets)


# -- alpha/beta fit -------------------------------------------------------------------------------
def size_sweep(comm, quick):
    """(bytes, median s, min s) per message size, and the fit t = a + b * bytes on the minima
    (other jobs' load only ever adds time; the minimum is the closest to what the transport
    itself costs)."""
    import numpy as np
    from mpi4py import MPI

    sizes = [2**k for k in range(12, 25 if quick else 28, 2)]  # 4 KB .. 64 MB
    points = []
    for nbytes in sizes:
        send = np.ones(nbytes // 4, np.float32)
        recv = np.empty_like(send)
        reps = 30 if nbytes <= MB else 8
        for _ in range(2):
            comm.Allreduce(send, recv, op=MPI.SUM)
        ts = []
        for _ in range(reps):
            comm.Barrier()
            t0 = time.perf_counter()
            comm.Allreduce(send, recv, op=MPI.SUM)
            ts.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
        points.append((nbytes, statistics.median(ts), min(ts)))
    x = np.array([p[0] for p in points], float)
    y = np.array([p[2] for p in points], float)
    b, a = np.polyfit(x, y, 1, w=1.0 / y)  # relative weighting: small sizes count
    return points, max(a, 0.0), b


# -- main -----------------------------------------------------------------------------------------
def worker(args):
    """One part of the benchmark in its own MPI job: ``peers`` (MPI, gloo, the size sweep) or
    ``replicate`` (its rows, the bucket sweep, and MPI reference rows timed alongside), so an
    error in replicate — whose Replicator aborts the whole job — cannot take the peers with it."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    if comm.Get_size() < 2:
        raise SystemExit("allreduce.py needs 2 processes: python bench/allreduce.py starts them")
    C.set_torch_threads(1)
    rank = comm.Get_rank()
    shapes = resnet50_shapes()
    if args.quick:
        shapes = [tuple(max(1, d // 4) for d in s) for s in shapes]
    grads = make_grads(shapes, rank)
    warmup, rounds = C.quick_counts(args.quick, 2, args.rounds)
    per_tensor, flat, flat_packed, flat_send = mpi_rows(comm, grads)
    out = {"total_values": int(sum(g.size for g in grads)), "tensors": len(grads)}
    if args.part == "peers":
        builders = {
            "mpi4py Allreduce per tensor (161 calls)": lambda: per_tensor,
            "mpi4py Allreduce, one flat buffer": lambda: flat,
            "mpi4py Allreduce, flat incl. pack/unpack": lambda: flat_packed,
        }
        gloo = {}

        def gloo_build(i):
            def build():
                if not gloo:
                    gloo["rows"] = gloo_rows(comm, grads)
                return gloo["rows"][i]
            return build
        builders["torch.distributed gloo, per tensor"] = gloo_build(0)
        builders["torch.distributed gloo, one flat tensor"] = gloo_build(1)
        builders["torch.distributed gloo, 25 MB buckets (as DDP)"] = gloo_build(2)
        out["rows"] = [r.as_dict() for r in time_rows(comm, builders, warmup, rounds)]
        out["gloo_buckets"] = gloo["rows"][3] if gloo else None
        out["size_sweep"], out["fit_a"], out["fit_b"] = size_sweep(comm, args.quick)
        _close_torch()
    else:
        import replicate as rp

        info = {}

        def rep_default():
            rep, direct = replicate_allreduce(grads)
            info["default"] = count_comm(rep)
            info["rep"] = rep
            return direct
        builders = {
            "replicate all_reduce (compiled step, default options)": rep_default,
            "replicate Replicator.run step (same step + bookkeeping)":
                lambda: (lambda rep=info["rep"]: rep.run(steps=1)),
            "replicate communicator alone, one flat buffer": lambda: replicate_comm_flat(
                flat_send),
            "mpi4py Allreduce, one flat buffer (reference)": lambda: flat,
        }
        out["rows"] = [r.as_dict() for r in time_rows(comm, builders, warmup, rounds)]
        out["default_comm"], out["default_sizes"] = info.get("default", (None, []))
        sweep_mb = [0, 1, 2, 4, 8, 16, 25, 32, 64, 128] if not args.quick else [0, 1, 25]
        sweep_info, sweep_builders = {}, {}
        for mb in sweep_mb:
            def build(mb=mb):
                rep, direct = replicate_allreduce(grads, rp.CompileOptions(bucket_bytes=mb * MB))
                sweep_info[mb] = count_comm(rep)
                return direct
            sweep_builders[f"{mb}"] = build
        sweep_builders["flat"] = lambda: flat
        out["sweep"] = [r.as_dict() for r in time_rows(comm, sweep_builders, 1,
                                                       max(3, rounds // 2))]
        out["sweep_comm"] = {str(k): v[0] for k, v in sweep_info.items()}
        out["sweep_sizes"] = {str(k): v[1] for k, v in sweep_info.items()}
        out["passes"] = _pipeline()
    if rank == 0:
        C.write_worker_json(args.json, out)


def _close_torch():
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except ImportError:
        pass


def _pipeline():
    try:
        from replicate.compiler import PIPELINE

        return list(PIPELINE)
    except Exception:  # noqa: BLE001
        return []


def report(peers, rep, command, quick):
    """peers, rep: the two parts' JSON (rep may hold only an "error")."""
    nbytes = peers["total_values"] * 4
    prow = C.rows_from(peers["rows"])
    pby = {r.name: r for r in prow}
    flat = pby["mpi4py Allreduce, one flat buffer"].timing
    per = pby["mpi4py Allreduce per tensor (161 calls)"].timing
    rrows = C.rows_from(rep.get("rows", []))
    rby = {r.name: r for r in rrows}
    rflat = rby.get("mpi4py Allreduce, one flat buffer (reference)")
    rflat = rflat.timing if rflat else None

    def line(r, ref):
        t = r.timing
        return [r.name, t.ms() if t else "n/a", f"{t.min * 1e3:.1f}" if t else "",
                f"{nbytes / t.median / 1e9:.2f}" if t else "", C.ratio(t, ref), C.note(r)]
    cells = [line(r, rflat) for r in rrows]
    if "error" in rep:
        cells.append(["replicate all_reduce", "n/a", "", "", "n/a", rep["error"]])
    cells += [line(r, flat) for r in prow]
    passes = ", ".join(rep.get("passes", [])) or "n/a"
    text = [C.header("Gradient all-reduce, 2 processes x 1 thread", command),
            f"{peers['tensors']} tensors, {peers['total_values']:,} float32 "
            f"({nbytes / MB:.1f} MiB){' (quick: shapes / 4)' if quick else ''}. replicate's "
            f"default compiled step launches {rep.get('default_comm', 'n/a')} cross-process "
            f"all-reduce(s) (sizes in MiB: "
            f"{', '.join(f'{b / MB:.1f}' for b in rep.get('default_sizes', [])) or 'n/a'}); "
            f"pass pipeline: {passes}. The replicate rows and the first reference row are "
            "timed in one MPI job (ratios against that reference), the peers in another "
            "(ratios against their own flat row).\n",
            C.table(["implementation", "median ms", "min ms", "algorithm GB/s (bytes/time)",
                     "vs flat Allreduce", "note"], cells), ""]
    r_t = rby.get("replicate all_reduce (compiled step, default options)")
    r_t = r_t.timing if r_t else None
    targets = []
    if r_t and rflat:
        q = r_t.median / rflat.median
        targets.append(f"replicate ≤ 1.0x flat Allreduce: {q:.2f}x — "
                       f"{'met' if q <= 1.0 else 'not met'}")
        gl = [pby[n].timing for n in pby if n.startswith("torch.distributed gloo")
              and pby[n].timing]
        if gl and flat:
            # across the two jobs: compare through each job's flat reference
            g = min(x.median for x in gl) / flat.median / q
            targets.append(f"≥ 5x faster than gloo (best gloo row): {g:.2f}x — "
                           f"{'met' if g >= 5 else 'not met'}")
        if per and flat:
            p = per.median / flat.median / q
            targets.append(f"≥ 3x faster than per-tensor Allreduce: {p:.2f}x — "
                           f"{'met' if p >= 3 else 'not met'}")
    else:
        targets.append("n/a (no replicate timing)")
    text.append("Targets: " + "; ".join(targets) + "\n")
    if rep.get("sweep"):
        sweep = C.rows_from(rep["sweep"])
        sflat = next(r.timing for r in sweep if r.name == "flat")
        cells = []
        for r in sweep:
            if r.name == "flat":
                continue
            mb = int(r.name)
            cells.append([f"{mb} MB" if mb else "0 (bucketing off)",
                          r.timing.ms() if r.timing else "n/a",
                          rep["sweep_comm"].get(r.name, "n/a"), C.ratio(r.timing, sflat),
                          r.note])
        cells.append(["mpi4py flat Allreduce (reference)", sflat.ms() if sflat else "n/a", 1,
                      "1.00x", ""])
        text += ["### Bucket-size sweep (`rp.CompileOptions(bucket_bytes=...)`, compiled step)\n",
                 C.table(["bucket_bytes", "median ms", "all-reduces per step", "vs flat",
                          "note"], cells), ""]
    pts = peers["size_sweep"]
    a, b = peers["fit_a"], peers["fit_b"]
    text += ["### Flat `Allreduce` message-size sweep (for the alpha-beta fit)\n",
             C.table(["bytes", "median µs", "min µs", "GB/s (min)"],
                     [[f"{n:,}", f"{t * 1e6:.1f}", f"{m * 1e6:.1f}", f"{n / m / 1e9:.2f}"]
                      for n, t, m in pts]),
             f"\nFit on the minima, t = a + b·bytes: a = {a * 1e6:.1f} µs, "
             f"1/b = {1 / b / 1e9:.2f} GB/s. With "
             f"2 ranks a ring all-reduce costs 2·alpha + bytes·beta, so alpha = "
             f"{a / 2 * 1e6:.1f} µs and 1/beta = {1 / b / 1e9:.2f} GB/s "
             "(shared memory on this machine).\n"]
    out = "\n".join(text)
    print(out)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: shapes / 4, few repeats")
    ap.add_argument("--rounds", type=int, default=15, help="timed rounds per row")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per part")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--part", default="peers", help=argparse.SUPPRESS)
    ap.add_argument("--json", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    return launch(args)


def launch(args):
    import json
    import subprocess

    os.makedirs(C.RESULTS_DIR, exist_ok=True)
    res = {}
    for part in ("replicate", "peers"):
        path = os.path.join(C.RESULTS_DIR, f".worker-allreduce-{part}.json")
        cmd = [sys.executable, "-m", "replicate.launch", "-n", "2", os.path.abspath(__file__),
               "--worker", "--part", part, "--json", path, "--rounds", str(args.rounds)]
        if args.quick:
            cmd.append("--quick")
        C.record_load()
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, env=C.thread_env(1), capture_output=True, text=True,
                                  timeout=args.timeout)
            ok = proc.returncode == 0 and os.path.exists(path)
            why = "" if ok else C.failure_reason(proc.stdout + proc.stderr)
        except subprocess.TimeoutExpired:
            ok, why = False, f"timed out after {args.timeout} s"
        print(f"[bench] allreduce.py: part {part} {'done' if ok else 'FAILED: ' + why} in "
              f"{time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        if ok:
            with open(path) as f:
                res[part] = json.load(f)
            os.remove(path)
        elif part == "peers":
            raise SystemExit(f"the peers' part failed: {why}")
        else:
            res[part] = {"error": why}
    command = "python bench/allreduce.py" + (" --quick" if args.quick else "")
    text = report(res["peers"], res["replicate"], command, args.quick)
    if not args.quick:
        C.save_json("allreduce", {"machine": C.machine(), **res, "markdown": text})


if __name__ == "__main__":
    main()
