"""Write, per rank, the thread count of every loaded BLAS once the communicator is up, for
tests/backends/test_blas_threads.py (to OUT.rank<r>.json):

    MKL_NUM_THREADS=1 mpiexec -n 2 python tests/runtime/programs/blas_threads.py OUT
"""

import json
import sys

import numpy as np  # noqa: F401  (loads NumPy's BLAS before the communicator starts)
from threadpoolctl import threadpool_info

from replicate.runtime.communication.comm import world


def main(out):
    comm = world()
    blas = [{"internal_api": lib["internal_api"], "num_threads": lib["num_threads"]}
            for lib in threadpool_info() if lib["user_api"] == "blas"]
    with open(f"{out}.rank{comm.rank}.json", "w") as f:
        json.dump({"size": comm.size, "blas": blas}, f)


if __name__ == "__main__":
    main(sys.argv[1])
