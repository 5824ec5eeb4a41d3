"""Sharded optimiser state: memory and step time on 2 processes, replicate against PyTorch.

Model: an MLP 2048-4096-4096-4096-2048 (50.3 M float32 parameters), mean squared error, Adam,
batch 16 per process, each process one replica, one thread. Rows, each run under ``mpiexec -n 2``
on its own (a fresh pair of processes, so peak RSS is the row's own):

* replicate, ``wrap_optimizer(Adam)`` (graph mode, NumPy backend) — every process holds all
  optimiser state;
* replicate, ``wrap_optimizer(Adam, shard=True)`` — ZeRO-1/2: each its half (gradients
  reduce-scattered and parameters all-gathered in 25 MB buckets); and the same with
  ``bucket_bytes=0`` (one reduce-scatter and one all-gather per tensor);
* PyTorch DDP + Adam (gloo), the unsharded peer;
* PyTorch ``ZeroRedundancyOptimizer(Adam)`` + DDP (gloo);
* PyTorch FSDP2 (``fully_shard``, gloo on CPU).

Columns: optimiser-state bytes on rank 0 (replicate: ``rp.memory_report()``; PyTorch: the
tensors in ``optimizer.state``, their local shards), peak RSS per process (``ru_maxrss``, the
larger of the two), median step time (a barrier before and after each round of steps; the
slower rank). Ratios against the unsharded row of the same library, in the same run.

    python bench/memory.py            # about 5 minutes on 2 cores
    python bench/memory.py --quick    # a small MLP, a smoke run
    python bench/memory.py --rows replicate --repeat 3   # replicate's rows only, alternating
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
from _workers import timed_rounds  # noqa: E402

SIZES = (2048, 4096, 4096, 4096, 2048)
QUICK = (64, 256, 256, 64)
BATCH, LR = 16, 1e-4
ROWS = ("replicate", "replicate shard=True", "replicate shard=True, unbucketed",
        "PyTorch DDP + Adam (gloo)",
        "PyTorch ZeroRedundancyOptimizer (gloo)", "PyTorch FSDP2 (gloo)")


def init(sizes, rank):
    import numpy as np

    rng = np.random.default_rng(0)  # the same weights on every rank
    params = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        params += [(rng.standard_normal((a, b), np.float32) / np.sqrt(a)).astype(np.float32),
                   np.zeros(b, np.float32)]
    data = np.random.default_rng(100 + rank)  # each process its own batch
    x = data.standard_normal((BATCH, sizes[0]), np.float32)
    y = data.standard_normal((BATCH, sizes[-1]), np.float32)
    return params, x, y


def replicate_row(params, x, y, shard, options=None):
    import replicate as rp
    import replicate.numpy as rnp

    ws = [rp.Variable(p, name=f"p{i}") for i, p in enumerate(params)]
    opt = rp.wrap_optimizer(rp.optim.Adam(ws, lr=LR), shard=shard)

    def input_fn(ctx):
        while True:
            yield x, y

    def step_fn(batch):
        xb, yb = batch
        h = xb
        for i in range(0, len(ws), 2):
            h = h @ ws[i] + ws[i + 1]
            if i + 2 < len(ws):
                h = rnp.maximum(h, 0.0)
        loss = rnp.mean((h - yb) ** 2)
        opt.apply(rp.grad(loss, ws))
        return {"loss": loss}

    rep = rp.Replicator(input_fn, step_fn, check_sync=False, options=options)
    return (lambda steps: rep.run(steps=steps)), lambda: rp.memory_report(opt)[
        "optimizer_state"]


def torch_model(params):
    import torch

    layers = []
    for i in range(0, len(params), 2):
        lin = torch.nn.Linear(*params[i].shape)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(params[i].T.copy()))
            lin.bias.copy_(torch.from_numpy(params[i + 1]))
        layers += [lin, torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def torch_state_bytes(opt) -> int:
    total = 0
    for state in getattr(opt, "optim", opt).state.values():  # (ZeRO: its local optimiser)
        for t in state.values():
            if hasattr(t, "to_local"):  # FSDP2: a DTensor, this rank's shard
                t = t.to_local()
            if hasattr(t, "nbytes"):
                total += t.nbytes
    return int(total)


def torch_row(comm, params, x, y, kind):
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        port = None
        if comm.Get_rank() == 0:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        port = comm.bcast(port, root=0)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                rank=comm.Get_rank(), world_size=comm.Get_size())
    model = torch_model(params)
    if kind == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (comm.Get_size(),))
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.Adam(model.parameters(), lr=LR)
    else:
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model)
        if kind == "zero":
            from torch.distributed.optim import ZeroRedundancyOptimizer

            opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                          lr=LR)
        else:
            opt = torch.optim.Adam(model.parameters(), lr=LR)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    def run(steps):
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(xt), yt)
            loss.backward()
            opt.step()
        return float(loss.detach())
    return run, lambda: torch_state_bytes(opt)


def worker(args):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    C.pin_cpus(1, first=rank)
    C.set_torch_threads(1)
    params, x, y = init(QUICK if args.quick else SIZES, rank)
    row = args.row
    out = {"name": row, "note": ""}
    try:
        if row.startswith("replicate"):
            run, state = replicate_row(params, x, y, shard="shard" in row, options=dict(
                bucket_bytes=0) if "unbucketed" in row else None)
        else:
            kind = "fsdp2" if "FSDP2" in row else "zero" if "Zero" in row else "ddp"
            run, state = torch_row(comm, params, x, y, kind)
        del params
        run(2)  # warm-up (and the one trace)
        times = timed_rounds(comm, run, args.steps, args.rounds)
        out["step_s"] = statistics.median(times)
        out["state_bytes"] = comm.gather(state(), root=0)
    except Exception as e:  # noqa: BLE001 - the row says why, the others still run
        out["note"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    out["peak_rss_mib"] = comm.gather(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                                      root=0)
    if rank == 0:
        C.write_worker_json(args.json, out)
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except ImportError:
        pass


def launch(args):
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    args.load = os.getloadavg()[0]
    results = []
    rows = [r for r in ROWS if not args.rows or any(w in r for w in args.rows.split(","))]
    for row in rows * args.repeat:  # (rows alternating: ABC ABC ...)
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            path = f.name
        cmd = [mpiexec, "-n", "2", sys.executable, os.path.abspath(__file__), "--worker",
               "--row", row, "--json", path, "--steps", str(args.steps), "--rounds",
               str(args.rounds)] + (["--quick"] if args.quick else [])
        env = dict(os.environ, **{v: "1" for v in C.THREAD_VARS})
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
        try:
            with open(path) as f:
                results.append(json.load(f))
        except (OSError, json.JSONDecodeError):
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            results.append({"name": row, "note": f"failed: {tail[0][:160]}"})
        os.unlink(path)
        print(f"{row}: {results[-1]}", file=sys.stderr, flush=True)
    report(results, args)


def report(results, args):
    by = {}
    for r in results:  # (a row run again: the median of its steps, every one in the note)
        if r["name"] in by and "step_s" in r and "step_s" in by[r["name"]]:
            first = by[r["name"]]
            first["steps_s"] = first.get("steps_s", [first["step_s"]]) + [r["step_s"]]
            first["step_s"] = statistics.median(first["steps_s"])
            first["note"] = "steps " + " / ".join(f"{t * 1e3:.0f}" for t in first["steps_s"])
        else:
            by[r["name"]] = r
    names = [n for n in ROWS if n in by]

    def ratio(name, base, key):
        a, b = by.get(name, {}), by.get(base, {})
        if key not in a or key not in b:
            return "–"
        va = a[key][0] if isinstance(a[key], list) else a[key]
        vb = b[key][0] if isinstance(b[key], list) else b[key]
        return f"{va / vb:.2f}×"

    base = {name: ("replicate" if name.startswith("replicate") else "PyTorch DDP + Adam (gloo)")
            for name in names}
    m = C.machine()
    print(f"\n{m['cpu']}, {m['cores']} cores, Python {m['python']}, {m['date']}; load "
          f"(1-min average) before the rows: {args.load:.1f}, after: {os.getloadavg()[0]:.1f}\n")
    print("| row | optimiser state, rank 0 (MiB) | vs unsharded | peak RSS per process (MiB) "
          "| step (ms) | vs unsharded | note |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        r = by[name]
        state = r.get("state_bytes")
        rss = r.get("peak_rss_mib")
        print(f"| {name} | {state[0] / 2**20:.1f} |" if state else f"| {name} | – |",
              ratio(name, base[name], "state_bytes"), "|",
              " / ".join(f"{m:.0f}" for m in rss) if rss else "–", "|",
              f"{r['step_s'] * 1e3:.0f}" if "step_s" in r else "–", "|",
              ratio(name, base[name], "step_s"), "|", r.get("note", ""), "|")
    os.makedirs(C.RESULTS_DIR, exist_ok=True)
    with open(os.path.join(C.RESULTS_DIR, "memory.json" if not args.rows else
                           f"memory-{args.rows.replace(',', '-')}.json"), "w") as f:
        json.dump({"load_before": args.load, "load_after": os.getloadavg()[0],
                   "args": vars(args), "rows": results}, f, indent=1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--row", default=ROWS[0])
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rows", default="", help="only the rows naming one of these "
                    "(comma-separated), e.g. replicate")
    ap.add_argument("--repeat", type=int, default=1, help="run the rows this many times, "
                    "alternating (step: the median)")
    args = ap.parse_args(argv)
    if args.worker:
        worker(args)
    else:
        launch(args)


if __name__ == "__main__":
    main()
