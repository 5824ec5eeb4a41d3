"""The two-level all-reduce (``replicate/runtime/communication/hierarchy.py``) on several hosts
of several processes each, for tests/runtime/test_multihost.py:

    python -m replicate.launch -n 4 -f hostfile -ppn 2 levels_mpi.py            # every check
    python -m replicate.launch -n 4 -f hostfile -ppn 2 levels_mpi.py --bytes 32  # traffic only

Every check: rank 0 prints ``levels: H hosts x L`` (or ``levels: none``); every reduction —
small, odd sizes, in pieces of both levels, in place, sum/max/min, four dtypes — is bitwise the
rank-ordered combination and the flat path's, on every rank; with ``network_compress`` the
result is the rank-ordered combination rounded where a partial leaves a host; five training
steps (plain, and overlapped in several buckets) give bitwise the flat path's parameters.
Exits non-zero on the first difference, else rank 0 prints ``ok``. ``--bytes MB``: two
all-reduces of MB megabytes, nothing else (the test reads the links' byte counters around it).
"""

from __future__ import annotations

import argparse

import numpy as np

from replicate.dtypes import bfloat16
from replicate.runtime.communication import comm as C
from replicate.runtime.communication import hierarchy


def fold(rows, op):
    out = rows[0].copy()
    for row in rows[1:]:
        out = hierarchy.UFUNC[op](out, row)
    return out


def compressed(rows, op, hosts, wire):
    """The rank-ordered combination, rounded to ``wire`` after each host's rows."""
    per = len(rows) // hosts
    p = None
    for h in range(hosts):
        mine = list(rows[h * per:(h + 1) * per])
        p = fold(mine if p is None else [p] + mine, op).astype(wire).astype(rows.dtype)
    return p


def check(w, failures):
    hierarchy.configure(local_chunk_bytes=256 << 10, network_chunk_bytes=24 << 10)
    for dtype in ("float32", "float64", "int64", "float16"):
        for n in (7, 4096 * w.size, 100_003, 300_001):
            rng = np.random.default_rng(1000 * w.rank + n)
            x = (rng.standard_normal(n) * 10 ** rng.uniform(-3, 3, n)).astype(dtype)
            if dtype.startswith("float"):
                x[::97] = -x[::97] * 1e-7
            g = w.allgather(x)
            for op in ("sum", "max", "min"):
                want = fold(g, op).astype(dtype)
                paths = {"allreduce": w.allreduce(x, op),
                         "in place": w.allreduce(x.copy(), op, inplace=True),
                         "flat": w._chunked(x, w._allreduce_split, op)}
                for name, got in paths.items():
                    if got.dtype != want.dtype or got.tobytes() != want.tobytes():
                        failures.append(f"{name} {op} {dtype} n={n}")
                    if any(r.tobytes() != got.tobytes() for r in w.allgather(got)):
                        failures.append(f"{name} {op} {dtype} n={n}: ranks differ")
    for wire in ("bfloat16", "float16"):
        hierarchy.configure(network_compress=wire)
        rng = np.random.default_rng(5 + w.rank)
        x = rng.standard_normal(200_003).astype(np.float32)
        got, g = w.allreduce(x, "sum"), w.allgather(x)
        hierarchy.configure(network_compress=None)
        want = compressed(g, "sum", w.levels.hosts, bfloat16 if wire == "bfloat16" else wire)
        if got.tobytes() != want.tobytes():
            failures.append(f"network_compress={wire}")
        if got.tobytes() == fold(g, "sum").tobytes():
            failures.append(f"network_compress={wire}: nothing was compressed")


def train(options):
    """Five SGD steps of a 64-512-10 MLP (38 k parameters: above the gathered path), one
    replica per process; the parameters' bytes."""
    import replicate as rp

    rng = np.random.default_rng(0)
    model = rp.nn.Sequential(rp.nn.Linear(64, 512, rng=rng), rp.nn.relu,
                             rp.nn.Linear(512, 10, rng=rng))
    opt = rp.wrap_optimizer(rp.optim.SGD(model.parameters(), lr=0.1))
    data = np.random.default_rng(C.world().rank)
    x, y = data.standard_normal((32, 64)).astype(np.float32), data.integers(0, 10, 32)

    def step_fn(batch):
        loss = rp.nn.softmax_cross_entropy(model(batch[0]), batch[1]).mean()
        opt.apply(rp.grad(loss, model.parameters()))
        return {"loss": loss}

    rp.Replicator(lambda ctx: iter(lambda: (x, y), None), step_fn, options=options).run(5)
    return b"".join(v.numpy().tobytes() for v in model.parameters().values())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bytes", type=int, default=0, help="only two all-reduces of this many MB")
    a = ap.parse_args()
    w = C.world()
    if w.rank == 0:
        lv = w.levels
        print(f"levels: {lv.hosts} hosts x {lv.local_size}" if lv else "levels: none", flush=True)
    if a.bytes:
        x = np.full(a.bytes << 18, 1.0 + w.rank, np.float32)
        for _ in range(2):
            y = w.allreduce(x, "sum")
        assert np.all(y == sum(1.0 + r for r in range(w.size))), y[:4]
        return
    failures = []
    if w.levels is not None:
        check(w, failures)
        for options in ({}, {"overlap": True, "bucket_bytes": 80_000}):
            hierarchy.configure(two_level=False)
            flat = train(options)
            hierarchy.configure(two_level=True)
            if train(options) != flat:
                failures.append(f"training with {options}: two levels differ from the flat path")
    if failures:
        raise SystemExit("bitwise differences: " + "; ".join(failures))
    if w.rank == 0:
        print("ok")


if __name__ == "__main__":
    main()
