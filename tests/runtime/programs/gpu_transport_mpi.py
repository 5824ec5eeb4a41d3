"""The cupy backend's transports under ``mpiexec -n 2`` on the CuPy stand-in (run by
``tests/backends/test_device_state.py``; prints one line per check, exits non-zero on the first
failure).

For each transport the replicated training of ``harness/parity.py`` (every collective, gradient
buckets reduced while the backward pass goes on) must give NumPy's losses and parameters:

* ``REPLICATE_STANDIN_DEVICES=2``: each rank on its own GPU -> NCCL (the stand-in's NCCL over
  MPI); nothing is staged through the host, so a step copies up only its batch;
* ``REPLICATE_TRANSPORT=cuda-aware-mpi`` (asked for: this MPI is not CUDA-aware, but the
  stand-in's device memory is host memory): MPI on the arrays' device pointers;
* one GPU for both ranks -> host-staged MPI, the reason saying they share it;
* the stand-in NCCL as strict as CuPy's: a ``Stream`` object where its ``intptr_t stream`` is
  wanted is a ``TypeError``, a stream of another device than the communicator's an NCCL error;
* ``REPLICATE_TRANSPORT=nccl`` with both ranks on one GPU -> a clear error on every rank, and
  the (stand-in) NCCL itself refusing such an init;
* over each transport, a sharded step (``wrap_optimizer(shard=True)``: bucketed reduce-scatters
  and all-gathers started on the transport, clipping, two replicas per process) trains to the
  unsharded NumPy step's parameters and state, bitwise.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # tests/: conftest installs the stand-in
sys.path.insert(0, HERE)  # (shard_mpi: the sharded training)
os.environ["REPLICATE_STANDIN_DEVICES"] = "2"

import cupy_standin  # noqa: E402
from harness import parity as P  # noqa: E402

import conftest  # noqa: E402, F401
import replicate as rp  # noqa: E402
from replicate.backends import cupy_comm, cupy_device  # noqa: E402
from replicate.runtime.communication import gpu_transport  # noqa: E402

OPTIONS = {"bucket_bytes": 200, "overlap": True}


def fresh(transport=None, devices=None):
    """A new transport choice (a process chooses once; these checks choose several times)."""
    cupy_comm._TRANSPORT.clear()
    os.environ.pop(gpu_transport.ENV, None)
    if transport:
        os.environ[gpu_transport.ENV] = transport
    if devices:
        os.environ["REPLICATE_STANDIN_DEVICES"] = str(devices)
        cupy_device.place()


RESULTS = {}  # transport -> parameters (bitwise the same whichever carries the reductions)


def parity(label, kind):
    want_hist, want_params, _ = P.replicated_training("numpy", options=OPTIONS)
    before = dict(cupy_device.DEVICE.transfers)
    hist, params, rep = P.replicated_training("cupy", options=OPTIONS)
    moved = cupy_device.DEVICE.transfers["to_device"] - before["to_device"]
    P.assert_nests_same(hist, want_hist, f"{label}: outputs")
    P.assert_nests_same(params, want_params, f"{label}: parameters")
    assert gpu_transport.CHOSEN["kind"] == kind, gpu_transport.CHOSEN
    prims = {n.prim for n in rep.executable().graph.nodes}
    assert {"comm_start", "comm_wait", "mpi_allgather"} <= prims, prims
    RESULTS[kind] = b"".join(params[k].tobytes() for k in sorted(params))
    print(f"rank {rep.rank}: {label} as numpy over {kind} "
          f"({gpu_transport.CHOSEN['reason']}; {moved} bytes up)", flush=True)
    return moved


def sharded(label, kind):
    import numpy as np
    import shard_mpi as S

    cfg = dict(opt="adamw", k=2, wrap=dict(max_grad_norm=0.05), options=OPTIONS)
    want = S.whole_state(*S.train(cfg, False))
    got = S.whole_state(*S.train(dict(cfg, backend="cupy"), True))
    assert gpu_transport.CHOSEN["kind"] == kind, gpu_transport.CHOSEN
    for k in want:
        assert np.array_equal(got[k], want[k]), (label, k, np.max(np.abs(got[k] - want[k])))
    print(f"rank {rp.process_index()}: {label} sharded as numpy over {kind}", flush=True)


def integer_arguments_only(rank):
    """The NCCL transport's communicator refuses the stream object and another GPU's stream."""
    import cupy

    nccl, t = cupy.cuda.nccl, cupy_comm._TRANSPORT[0]
    x = cupy.zeros(4, cupy.uint8)
    with cupy.cuda.Device(1 - rank):
        elsewhere = cupy.cuda.Stream()
    for stream, error in ((t.stream, TypeError), (elsewhere.ptr, nccl.NcclError)):
        try:
            t.comm.bcast(x.data.ptr, x.nbytes, nccl.NCCL_UINT8, 0, stream)
        except error:
            continue
        raise AssertionError(f"the stand-in NCCL took stream {stream!r}")
    t.comm.bcast(x.data.ptr, x.nbytes, nccl.NCCL_UINT8, 0, t.stream.ptr)
    print(f"rank {rank}: the stand-in NCCL takes integers only, a stream of its GPU", flush=True)


def main():
    rank = rp.process_index()
    fresh(devices=2)
    assert cupy_standin._CUDA.STATE.device == rank  # local rank % device count
    nccl_bytes = parity("own GPUs", "nccl")
    sharded("own GPUs", "nccl")
    integer_arguments_only(rank)
    fresh("cuda-aware-mpi")
    parity("CUDA-aware MPI", "cuda-aware-mpi")
    sharded("CUDA-aware MPI", "cuda-aware-mpi")
    fresh(devices=1)
    host_bytes = parity("one shared GPU", "host")
    sharded("one shared GPU", "host")
    assert "share GPU" in gpu_transport.CHOSEN["reason"], gpu_transport.CHOSEN
    assert host_bytes > nccl_bytes, (host_bytes, nccl_bytes)  # NCCL stages nothing
    assert len(set(RESULTS.values())) == 1, "the transports' parameters differ in their bits"
    fresh("nccl")
    try:
        P.replicated_training("cupy", options=OPTIONS)
    except rp.ReplicateError as e:
        assert "Duplicate GPU detected" in str(e) and "REPLICATE_TRANSPORT=host" in str(e), e
        print(f"rank {rank}: forced NCCL on one GPU refused: {str(e)[:60]}", flush=True)
    else:
        raise AssertionError("NCCL on one shared GPU was not refused")
    nccl = cupy_standin._CUDA.make_cuda()[1]
    try:
        nccl.NcclCommunicator(2, bytes(128), rank)  # both ranks on GPU 0 now
    except nccl.NcclError as e:
        assert "INVALID_USAGE" in str(e), e
        print(f"rank {rank}: the stand-in NCCL refuses too ({e})", flush=True)
    else:
        raise AssertionError("the stand-in NCCL accepted two ranks on one GPU")


if __name__ == "__main__":
    main()
