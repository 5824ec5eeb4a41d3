"""NCCL on a GPU machine, structurally (run by ``bench/gpu_check.sh``; exits non-zero on any
failure, prints one line per check).

    python bench/gpu_nccl_check.py one            # 1 process: a 1-rank NCCL communicator
    mpiexec -n 2 python bench/gpu_nccl_check.py shared   # 2 ranks on one GPU

``one``: the NCCL transport (``replicate/runtime/communication/device_collectives.py``) over a
1-rank communicator: all-reduce (sum, max), all-gather and broadcast of device arrays give the
operand back bitwise, ordered on the device by events (a kernel after the wait reads the result).

``shared``: two ranks on one GPU. ``REPLICATE_TRANSPORT=nccl`` is refused on every rank with a
message naming the shared GPU ("Duplicate GPU detected") before NCCL is touched; the automatic
choice is host-staged MPI and trains as NumPy does; NCCL's own init of two ranks on one device
fails with ``NcclError`` (the script is run under ``timeout``: a hang fails the check).
"""

from __future__ import annotations

import os
import sys
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
sys.path.insert(0, os.path.dirname(HERE))

import cupy_standin  # noqa: E402

cupy_standin.install()  # the stand-in only in the rehearsal (REPLICATE_CUPY_STANDIN=gpu-view)


def one():
    import cupy
    import numpy as np

    from replicate.runtime.communication.comm import SelfComm
    from replicate.runtime.communication.device_collectives import NcclTransport
    from replicate.runtime.communication.gpu_transport import nccl_module

    nccl = nccl_module()
    if nccl is None:
        sys.exit("gpu_nccl_check: NCCL does not load (pip install 'replicate[cuda13]', which "
                 "brings nvidia-nccl-cu13, or [cuda12])")
    t = NcclTransport(SelfComm(), cupy, nccl)
    x = cupy.asarray(np.random.default_rng(0).standard_normal(1001).astype(np.float32))
    for op in ("sum", "max"):
        got = t.allreduce(x, op) * 1.0  # a kernel after the collective reads the result
        assert got.get().tobytes() == x.get().tobytes(), op
        got = t.wait(t.start(x, op)) * 1.0  # a bucket's: started, then waited for
        assert got.get().tobytes() == x.get().tobytes(), op
    gathered = t.allgather(x)
    assert gathered.shape == (1, 1001) and (gathered[0] == x).all()
    assert (t.broadcast(x, 0) == x).all()
    print(f"1-rank NCCL communicator (NCCL {nccl.get_version()}, GPU {t.comm.device_id()}): "
          "all-reduce, all-gather, broadcast as the operand", flush=True)


def shared():
    import numpy as np
    from harness import parity as P

    import replicate as rp
    from replicate.backends import cupy_comm
    from replicate.runtime.communication import gpu_transport

    rank = rp.process_index()
    os.environ[gpu_transport.ENV] = "nccl"
    try:
        P.replicated_training("cupy", steps=1)
    except rp.ReplicateError as e:
        assert "Duplicate GPU detected" in str(e) and "share GPU" in str(e), e
        print(f"rank {rank}: REPLICATE_TRANSPORT=nccl on one GPU refused: {e}", flush=True)
    else:
        sys.exit("gpu_nccl_check: two ranks on one GPU were not refused NCCL")
    del os.environ[gpu_transport.ENV]
    cupy_comm._TRANSPORT.clear()
    want = P.replicated_training("numpy", steps=2)[1]
    got = P.replicated_training("cupy", steps=2)[1]
    P.assert_nests_same(got, want, "host-staged parameters")
    assert gpu_transport.CHOSEN["kind"] == "host", gpu_transport.CHOSEN
    print(f"rank {rank}: automatic choice: {gpu_transport.CHOSEN}; trains as numpy", flush=True)
    nccl = gpu_transport.nccl_module()
    uid = nccl.get_unique_id() if rank == 0 else bytes(128)  # CuPy 14: bytes, and only bytes
    uid = np.asarray(rp.host.broadcast(np.frombuffer(uid, np.uint8))).tobytes()
    try:
        nccl.NcclCommunicator(2, uid, rank)
    except nccl.NcclError as e:
        print(f"rank {rank}: NCCL's own init of 2 ranks on one GPU fails cleanly: {e}",
              flush=True)
    else:
        sys.exit("gpu_nccl_check: NCCL accepted two ranks on one GPU")


if __name__ == "__main__":
    warnings.simplefilter("ignore", UserWarning)
    {"one": one, "shared": shared}[sys.argv[1]]()
