"""Weak scaling across two simulated hosts at 10 Gbit/s and 1 Gbit/s: replicate (plain, overlap,
bfloat16-compressed buckets) against PyTorch DDP (gloo) on the same hosts, in the same run; a
2 hosts x 2 processes correctness run of the two-level all-reduce; the all-reduce alone at two
sizes, from which ``scaleout_model.py`` is calibrated.

    sudo python bench/multihost.py            # needs root: the cluster of tests/cluster.py
    sudo python bench/multihost.py --quick
    sudo python bench/multihost.py --chain    # the two-level chain on 2 and 3 hosts x 2

``--chain``: the two-level all-reduce alone (``CHAIN_MB``), 2 and 3 hosts of 2 processes at
200 Mbit/s (link-bound), as it is (a middle host passes results back while partials still come
in) and with the chain as it was (``in_order_chain``: every partial up, then every result back).

Hosts: network, UTS, IPC and mount namespaces on one machine (``tests/cluster.py``), joined by
veths limited on both ends with ``tc tbf``; every rank's traffic goes over TCP (UCX) or gloo's
TCP through the links. The hosts share this machine's cores: each rank is pinned to its own
core, so a host is one core, and the other sessions' load is shared too (recorded with the
table). Model: the MLP 784-1024-1024-10 of ``step_time.py`` (7.4 MB of float32 gradients),
batch 256 per replica, SGD. Efficiency: 1-process step time (on one host) / 2-process step time
(one per host); each row runs 1 then 2 processes ``--pairs`` times back to back, the efficiency
is the median over the pairs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import _common as C  # noqa: E402
from _workers import ddp_mlp, replicate_mlp, timed_rounds  # noqa: E402
from step_time import MLP_SIZES, mlp_init  # noqa: E402

BATCH = 256
RATES = ("10gbit", "1gbit")
ROWS = {"replicate plain": {}, "replicate overlap": {"overlap": True},
        "replicate bf16-compressed": {"compress": "bfloat16"}, "PyTorch DDP (gloo)": None}
DDP = "PyTorch DDP (gloo)"


CHAIN_MB = 8


# -- the worker (one rank) ---------------------------------------------------------------------
def in_order_chain(self, rows, op, out):
    """The baseline row's chain (``hierarchy.Levels._chain`` before middle hosts interleaved):
    every partial up the chain, then every result back; the same sums in the same order."""
    import numpy as np

    from replicate.runtime.communication import hierarchy as H

    step = max(1, H.settings().network_chunk_bytes // out.itemsize)
    h, last, starts, sends = self.host, self.hosts - 1, range(0, out.size, step), []

    def recv(n, source, tag):
        buf = np.empty(n, out.dtype)
        self.cross.Recv(buf, source=source, tag=tag)
        return buf
    for lo in starts:
        piece = out[lo:lo + step]
        if h == 0:
            H.combine(rows[:, lo:lo + step], op, piece)
        else:
            piece[...] = recv(piece.size, h - 1, H._FORWARD)
            for row in rows:
                H.UFUNC[op](piece, row[lo:lo + step], out=piece)
        if h < last or h > 0:
            sends.append(self.cross.Isend(piece, dest=h + 1 if h < last else h - 1,
                                          tag=H._FORWARD if h < last else H._BACK))
    if h < last:
        for i, lo in enumerate(starts):
            piece = out[lo:lo + step]
            result = recv(piece.size, h + 1, H._BACK)
            sends[i].Wait()
            piece[...] = result
            if h > 0:
                sends.append(self.cross.Isend(piece, dest=h - 1, tag=H._BACK))
    self.MPI.Request.Waitall(sends)


def allreduce_runner(elements, in_order=False):
    import numpy as np

    from replicate.runtime.communication import hierarchy
    from replicate.runtime.communication.comm import world

    if in_order:
        hierarchy.Levels._chain = in_order_chain

    x = np.ones(elements, np.float32)

    def run(steps):
        for _ in range(steps):
            world().allreduce(x, "sum")
    return run


def worker(args):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    C.pin_cpus(1, first=rank % 2)
    C.set_torch_threads(1)
    sizes = (784, 128, 128, 10) if args.quick else MLP_SIZES
    params, _, _ = mlp_init(sizes, 1, seed=0)
    _, x, y = mlp_init(sizes, BATCH, seed=100 + rank)
    if args.row == DDP:
        run = ddp_mlp(comm, params, x, y, socket.gethostbyname(socket.gethostname()))
    elif args.row.startswith("allreduce"):
        run = allreduce_runner(int(args.row.split()[1]), in_order="in order" in args.row)
    else:
        run, variables = replicate_mlp(params, x, y, options=json.loads(args.options))
    run(2)  # warm-up (and the one trace)
    if args.check:  # the correctness run: a few steps, then the parameters' hash
        run(args.steps)
        digest = hashlib.sha256(b"".join(v.numpy().tobytes() for v in variables)).hexdigest()
        digests = comm.allgather(digest)
        if rank == 0:
            C.write_worker_json(args.json, {"digests": digests})
        return
    times = timed_rounds(comm, run, args.steps, args.rounds)
    if rank == 0:
        C.write_worker_json(args.json, {"median": statistics.median(times), "min": min(times),
                                        "max": max(times), "n": len(times)})
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except ImportError:
        pass


# -- the driver (root, outside the cluster) -----------------------------------------------------
def job(cluster, args, row, procs, ppn=1, extra=(), env=None):
    """One job on the cluster's first ``procs // ppn`` hosts; the worker's JSON, or None."""
    path = os.path.join(cluster.folder, f"worker-{procs}.json")
    hosts = ",".join(cluster.names[:max(1, procs // ppn)])
    cmd = cluster.enter(0, HERE) + [
        sys.executable, "-m", "replicate.launch", "-n", str(procs), "--hosts", hosts,
        "-ppn", str(ppn), os.path.abspath(__file__), "--worker", "--json", path, "--row", row,
        "--options", json.dumps(ROWS.get(row) or {}), "--steps", str(args.steps),
        "--rounds", str(args.rounds), *(["--quick"] if args.quick else []), *extra]
    C.record_load()
    env = dict(C.thread_env(1), PYTHONPATH=os.path.dirname(HERE), **(env or {}))  # this checkout
    proc = subprocess.run(cmd, env=cluster.env(env),
                          capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0 or not os.path.exists(path):
        print(f"[bench] {row}, {procs} processes failed:\n{proc.stdout[-2000:]}"
              f"{proc.stderr[-2000:]}", file=sys.stderr, flush=True)
        return None
    with open(path) as f:
        out = json.load(f)
    os.remove(path)
    return out


def scaling(cluster, args):
    """{rate: {row: {"t1", "t2", "efficiency", "pairs"}}}, and the all-reduce alone."""
    elements = sum(p.size for p in mlp_init(MLP_SIZES, 1, seed=0)[0])
    table = {}
    for rate in RATES:
        cluster.set_rate(rate)
        rows = {}
        for row in ROWS:
            pairs, t1s, t2s = [], [], []
            for _ in range(args.pairs):
                one, two = job(cluster, args, row, 1), job(cluster, args, row, 2)
                if one is None or two is None:
                    break
                t1s.append(one["median"])
                t2s.append(two["median"])
                pairs.append(one["median"] / two["median"])
            if pairs:
                rows[row] = {"t1": statistics.median(t1s), "t2": statistics.median(t2s),
                             "efficiency": statistics.median(pairs), "pairs": pairs}
            print(f"[bench] {rate} {row}: {rows.get(row)}", file=sys.stderr, flush=True)
        for n in (elements, elements // 2):
            got = job(cluster, args, f"allreduce {n}", 2)
            rows[f"allreduce {n}"] = got and {"bytes": 4 * n, "seconds": got["median"]}
        table[rate] = rows
    return table


def two_by_two(cluster, args):
    """The same 3 training steps on 2 hosts x 2 processes with the two-level all-reduce and with
    the flat one: the parameters' hashes (every rank, both runs) and each link's bytes."""
    cluster.set_rate("10gbit")
    out = {}
    for flag in ("1", "0"):
        before = cluster.link_bytes()
        got = job(cluster, args, "replicate plain", 4, ppn=2, extra=["--check"],
                  env={"REPLICATE_TWO_LEVEL": flag})
        out[flag] = {"digests": got and got["digests"],
                     "link_bytes": [a - b for a, b in zip(cluster.link_bytes(), before)]}
    digests = {d for run in out.values() for d in (run["digests"] or [None])}
    out["bitwise_equal"] = len(digests) == 1 and None not in digests
    return out


def chain(cluster, args):
    """{row: seconds per all-reduce}: the two-level chain on 2 and 3 hosts x 2 processes."""
    cluster.set_rate("200mbit")
    out, elements = {}, CHAIN_MB << 18
    for hosts in (2, 3):
        for how in ("", " in order"):
            got = job(cluster, args, f"allreduce {elements}{how}", 2 * hosts, ppn=2)
            out[f"{hosts} hosts x 2{how or ' (as it is)'}"] = got and got["median"]
            print(f"[bench] {hosts} hosts{how}: {got}", file=sys.stderr, flush=True)
    return out


def report_chain(times, command):
    cells = [[row, "n/a" if t is None else f"{t * 1e3:.0f}"] for row, t in times.items()]
    out = "\n".join([C.header(f"The two-level chain: an all-reduce of {CHAIN_MB} MB at 200 Mbit/s",
                              command), C.table(["hosts, chain", "ms per all-reduce"], cells)])
    print(out)
    return out


def report(table, check, command):
    cells, targets = [], []
    for rate, rows in table.items():
        ddp = rows.get(DDP, {}).get("efficiency")
        for row in ROWS:
            r = rows.get(row)
            if r is None:
                cells.append([rate, row, "n/a", "n/a", "n/a", "", ""])
                continue
            vs = "" if row == DDP or not ddp else f"{r['efficiency'] / ddp:.2f}x"
            cells.append([rate, row, f"{r['t1'] * 1e3:.0f}", f"{r['t2'] * 1e3:.0f}",
                          f"{r['efficiency']:.2f}", " / ".join(f"{p:.2f}" for p in r["pairs"]),
                          vs])
        best = max((rows[r]["efficiency"] for r in ROWS if r != DDP and r in rows), default=None)
        if best and ddp:
            targets.append(f"{rate}: best replicate row {best / ddp:.2f}x DDP's efficiency "
                           f"(target ≥ 1.2x: {'met' if best / ddp >= 1.2 else 'not met'})")
    ar = [f"{rate}: " + ", ".join(f"{v['bytes'] / 1e6:.1f} MB {v['seconds'] * 1e3:.1f} ms"
                                  for k, v in rows.items() if k.startswith("allreduce") and v)
          for rate, rows in table.items()]
    links = {k: v["link_bytes"] for k, v in check.items() if k in ("0", "1")}
    text = [C.header("Across two simulated hosts: weak scaling, 1 process per host",
                     command),
            C.table(["link", "row", "ms/step, 1 host", "ms/step, 2 hosts", "efficiency",
                     "per pair", "vs DDP"], cells), "",
            "Targets: " + "; ".join(targets), "",
            "The all-reduce alone (replicate's communicator, 2 hosts): " + "; ".join(ar), "",
            f"2 hosts x 2 processes, 3 training steps: parameters bitwise equal on every rank "
            f"with the two-level and the flat all-reduce: {check['bitwise_equal']}; bytes over "
            f"each host's link, two-level {links.get('1')}, flat {links.get('0')}."]
    out = "\n".join(text)
    print(out)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run (smaller MLP)")
    ap.add_argument("--steps", type=int, default=5, help="steps per timed round")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per job")
    ap.add_argument("--pairs", type=int, default=2, help="1- and 2-host jobs per row")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per job")
    ap.add_argument("--chain", action="store_true", help="the two-level chain on 2 and 3 hosts")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--check", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", help=argparse.SUPPRESS)
    ap.add_argument("--row", help=argparse.SUPPRESS)
    ap.add_argument("--options", default="{}", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    from cluster import Cluster, why_not

    reason = why_not()
    if reason:
        raise SystemExit(f"bench/multihost.py: {reason}")
    if args.quick:
        args.steps, args.rounds, args.pairs = 2, 1, 1
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # (the cluster is removed on exit)
    folder = os.path.join(C.RESULTS_DIR, ".multihost")
    os.makedirs(folder, exist_ok=True)
    if args.chain:
        try:
            with Cluster(3, folder) as cluster:
                times = chain(cluster, args)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        text = report_chain(times, "python bench/multihost.py --chain")
        C.save_json("multihost-chain", {"machine": C.machine(), "times": times, "markdown": text})
        return
    try:
        with Cluster(4, folder) as cluster:
            check = two_by_two(cluster, args)
            table = scaling(cluster, args)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    command = "python bench/multihost.py" + (" --quick" if args.quick else "")
    text = report(table, check, command)
    if not args.quick:
        C.save_json("multihost", {"machine": C.machine(), "scaling": table, "two_by_two": check,
                                  "markdown": text})


if __name__ == "__main__":
    main()
