"""What a job exposes to another user of the machine, for tests/runtime/test_exposure.py.

    mpiexec -n 2 python exposure_mpi.py wait GO_FILE    (or through replicate.launch)
    mpiexec -n 2 python exposure_mpi.py takeover UID    (as root; never under the bootstrap)

``wait``: MPI up, each rank prints ``ready RANK PID LAUNCH_DIR`` and waits (at most 60 s) for
GO_FILE, then sums the ranks. ``takeover``: before MPI starts, user UID makes the job's MPICH
shared-memory file (its name from the job's PMI name, as hydra's pid and the clock give it to
whoever guesses) open to all, marked ready; then ``import replicate`` must stop the job before
the ranks exchange anything. A rank that gets through prints ``exchanged``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

MAKE = """
import os, struct, sys
fd = os.open(sys.argv[1], os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o666)
os.fchmod(fd, 0o666)
os.ftruncate(fd, int(sys.argv[2]))
os.pwrite(fd, struct.pack("<I", 0x12345678), 8)  # MPICH 5's 'root ready' flag
"""
SLAB = 2118784  # bytes of MPICH 5's shared memory for two ranks on a machine


def shm_name() -> str:
    """/dev/shm/mpich_shm_<FNV-1a of the PMI name>_0, asked of the process manager (PMI-1)."""
    sock = socket.socket(fileno=os.dup(int(os.environ["PMI_FD"])))
    sock.sendall(b"cmd=init pmi_version=1 pmi_subversion=1\n")
    sock.recv(4096)
    sock.sendall(b"cmd=get_my_kvsname\n")
    kvs = sock.recv(4096).decode().split("kvsname=")[1].split()[0]
    sock.detach()
    h = 2166136261
    for c in kvs.encode():
        h = ((h ^ c) * 16777619) & 0xFFFFFFFF
    return f"/dev/shm/mpich_shm_{h:x}_0"


def takeover(uid: str) -> None:
    path = shm_name()
    if os.environ.get("PMI_RANK") == "0":
        subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                        "/usr/bin/python3", "-c", MAKE, path, str(SLAB)], check=True)
        print("made", path, flush=True)
    deadline = time.monotonic() + 30
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    from replicate.runtime.communication.comm import world

    comm = world()
    total = comm.allgather_obj(comm.rank + 1)
    print("exchanged", comm.rank, total, flush=True)


def wait(go: str) -> None:
    from replicate.runtime.communication.comm import world

    comm = world()
    sys.stdout.write(f"ready {comm.rank} {os.getpid()} {os.environ.get('REPLICATE_LAUNCH_DIR')}\n")
    sys.stdout.flush()  # (one write: two ranks share the pipe)
    deadline = time.monotonic() + 60
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.05)
    print("sum", comm.rank, sum(comm.allgather_obj(comm.rank + 1)), flush=True)


if __name__ == "__main__":
    {"takeover": takeover, "wait": wait}[sys.argv[1]](sys.argv[2])
