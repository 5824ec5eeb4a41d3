"""The communicator's reductions under MPI: every path (gathered, MPI's own Allreduce for two
processes, the all-to-all split, pieces of ``_CHUNK_BYTES``) must give bitwise the rank-ordered
combination of every rank's buffer, on every rank; so must an unpacked bucket's parts. Exits
non-zero on the first difference.

    mpiexec -n 2 python tests/runtime/programs/comm_mpi.py
"""

from __future__ import annotations

import numpy as np

from replicate.runtime.communication import comm as C
from replicate.runtime.communication.overlap import PACK_BELOW, reduce_parts


def expected(gathered, op):
    out = gathered[0].copy()
    for row in gathered[1:]:
        out = out + row if op == "sum" else (np.maximum if op == "max" else np.minimum)(out, row)
    return out


def main():
    w = C.world()
    assert w.size >= 2, "run under mpiexec -n 2"
    C._CHUNK_BYTES = 64 << 10  # several pieces even for the moderate sizes below
    failures = []
    for dtype in ("float32", "float64", "int64", "float16"):
        for n in (7, 4096 * w.size - 1, 4096 * w.size, 40_000, 100_003):
            rng = np.random.default_rng(1000 * w.rank + n)
            x = (rng.standard_normal(n) * 10 ** rng.uniform(-3, 3, n)).astype(dtype)
            if dtype.startswith("float"):
                x[::97] = -x[::97] * 1e-7
            g = w.allgather(x)
            for op in ("sum", "max", "min"):
                want = expected(g, op).astype(dtype)
                paths = {"allreduce": w.allreduce(x, op),
                         "split": w._chunked(x, w._allreduce_split, op),
                         "split in place": w._chunked(x.copy(), w._allreduce_split, op, True)}
                if op == "sum" and w.size == 2 and np.dtype(dtype) in C._NATIVE_DTYPES:
                    paths["native"] = w._chunked(x, w._allreduce_native, op)
                    paths["native in place"] = w._chunked(x.copy(), w._allreduce_native, op, True)
                scratch = x.copy()
                got = paths["allreduce in place"] = w.allreduce(scratch, op, inplace=True)
                if x.size >= w.size * C._SPLIT_MIN and not np.shares_memory(got, scratch):
                    failures.append(f"in place {op} {dtype} n={n}: not written over its input")
                for name, got in paths.items():
                    if got.dtype != want.dtype or got.tobytes() != want.tobytes():
                        failures.append(f"{name} {op} {dtype} n={n}")
                    everyone = w.allgather(got)
                    if any(r.tobytes() != got.tobytes() for r in everyone):
                        failures.append(f"{name} {op} {dtype} n={n}: ranks differ")
    # a 2-D buffer keeps its shape
    y = np.arange(3 * 50_000, dtype=np.float32).reshape(3, 50_000) * (w.rank + 1)
    s = w.allreduce(y, "sum")
    if s.shape != y.shape or not np.array_equal(s, y * (w.size + 1) * w.size / 2 / (w.rank + 1)):
        failures.append("2-D sum")
    # a 0-d value keeps its shape (np.ascontiguousarray would make it 1-d)
    z = np.float64(w.rank + 1.5)
    if w.allreduce(z, "sum").shape != () or w.allreduce(z, "max") != w.size + 0.5 \
            or w.allgather(z).shape != (w.size,):
        failures.append("0-d allreduce/allgather shape")
    # an unpacked bucket (overlap.reduce_parts: the JAX backend's gradient parts): every part
    # bitwise as the packed bucket of them, written over itself, on every rank
    shapes = [(3,), (257, 5), (1,), (PACK_BELOW // 4 + 3,), (40_000,), (2, 300_000)]
    for dtype in ("float32", "float64"):
        for op in ("sum", "max"):
            rng = np.random.default_rng(7 + w.rank)
            parts = [rng.standard_normal(s).astype(dtype) for s in shapes]
            want = w.allreduce(np.concatenate([p.reshape(-1) for p in parts]), op)
            where = [p.ctypes.data for p in parts]
            got = reduce_parts(w, parts, op)
            flat = np.concatenate([p.reshape(-1) for p in got])
            if got is not parts or [p.ctypes.data for p in got] != where:
                failures.append(f"parts {op} {dtype}: not reduced over themselves")
            if flat.tobytes() != want.tobytes():
                failures.append(f"parts {op} {dtype}: differ from the packed bucket")
    if failures:
        raise SystemExit("bitwise differences: " + "; ".join(failures))
    if w.rank == 0:
        print("ok")


if __name__ == "__main__":
    main()
