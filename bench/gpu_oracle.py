"""The oracle on the GPU (a step of ``bench/gpu_check.sh``): the replicated training of
``tests/harness/parity.py``, which ``tests/backends/test_backend_parity.py`` runs (an MLP, Adam on
all-reduced gradients, every collective in the loss and outputs) with k replicas in one process,
on ``cupy`` and ``jax``, gives NumPy's outputs and parameters; exits non-zero on the first
difference.

    python bench/gpu_oracle.py 1 2 4
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
sys.path.insert(0, os.path.dirname(HERE))

import cupy_standin  # noqa: E402

cupy_standin.install()  # the stand-in only in the rehearsal (REPLICATE_CUPY_STANDIN=gpu-view)

from harness import parity as P  # noqa: E402


def main(ks):
    for k in ks:
        want_hist, want_params, _ = P.replicated_training("numpy", k=k)
        for backend in ("cupy", "jax"):
            hist, params, _ = P.replicated_training(backend, k=k)
            P.assert_nests_same(hist, want_hist, f"k={k} {backend} outputs")
            P.assert_nests_same(params, want_params, f"k={k} {backend} parameters")
            print(f"oracle k={k} {backend}: as numpy", flush=True)


if __name__ == "__main__":
    main([int(k) for k in sys.argv[1:]] or [1, 2, 4])
