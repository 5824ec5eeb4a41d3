"""A script run by a plain ``mpiexec -n N python startup_plain.py [fail]`` (no bootstrap): with
``fail``, rank 1 exits before it imports replicate, so rank 0 waits in MPI's start-up until the
bounded wait (``runtime/job/startup.py``) ends it. For tests/runtime/test_restart.py."""

import os
import sys

if os.environ.get("PMI_RANK") == "1" and "fail" in sys.argv:
    sys.exit(3)  # before `import replicate`: nothing of the library runs on this rank

import replicate as rp  # noqa: E402 - MPI starts here

print(f"rank {rp.runtime.communication.comm.world().rank} up", flush=True)
