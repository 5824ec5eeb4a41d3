#!/usr/bin/env bash
# The GPU check of issue 18, on one machine with an NVIDIA GPU (sized for one H100: < 8 min),
# no network needed (install first: pip install -e '.[test,bench,cuda13]', or cuda12).
#
#   bash bench/gpu_check.sh 2>&1 | tee gpu_check.log
#
# 1. versions (driver, CUDA runtime, CuPy, NVRTC, JAX and its devices, PyTorch);
# 2. parity on the GPU: the op harness (forward, gradients, gradients of gradients), the float16
#    harness, the whole MLP / conv / WGAN-GP steps, every generated kernel (the sweep), on
#    `cupy` and `jax` against the NumPy reference;
# 3. the oracle on the GPU: k = 1, 2, 4 replicas in one process (cupy and jax vs numpy), and
#    2 ranks sharing the GPU (host-staged MPI) under mpiexec;
# 4. device residency: variables stay on the GPU between steps, a steady-state step copies up
#    only its batch and down only its outputs (tests/test_device_state.py, on the GPU);
# 5. NCCL structurally: a 1-rank communicator through the NCCL transport; 2 ranks on the one GPU:
#    REPLICATE_TRANSPORT=nccl refused with a clear message, the automatic choice host-staged,
#    NCCL's own init failing cleanly (bench/gpu_nccl_check.py);
# 6. benchmarks: the 8-op elementwise chain on 16 M float32 vs cupy.fuse, jax.jit, CuPy op by op
#    and the device copy bandwidth; the MLP and conv steps vs PyTorch eager / torch.compile and
#    jax.jit, with kernels and host<->device bytes per step.
#
# It fails (exit 1) when there is no GPU, when CuPy or JAX does not see it, or when any test
# skips instead of running on it: the CuPy stand-in of the tests is turned off here.
set -euo pipefail
cd "$(dirname "$0")/.."
export REPLICATE_CUPY_STANDIN=0          # the real CuPy on the real GPU, never the stand-in
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # (as replicate.launch.gpu_environment sets them)
export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_gpu_deterministic_ops=true"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
start=$(date +%s)
step() { echo; echo "=== $* ($(( $(date +%s) - start )) s)"; }

step "versions"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
python - <<'EOF'
import platform, sys
import numpy, cupy
n = cupy.cuda.runtime.getDeviceCount()  # raises without a driver: the check fails here
if n < 1:
    sys.exit("gpu_check: CuPy sees no GPU")
props = cupy.cuda.runtime.getDeviceProperties(0)
print(f"python {platform.python_version()}, numpy {numpy.__version__}")
print(f"device {props['name'].decode()}, driver {cupy.cuda.runtime.driverGetVersion()}, "
      f"CUDA runtime {cupy.cuda.runtime.runtimeGetVersion()}, CuPy {cupy.__version__}, "
      f"NVRTC {cupy.cuda.nvrtc.getVersion()}")
import jax
gpus = [d for d in jax.devices() if d.platform == "gpu"]
print(f"jax {jax.__version__}: {jax.devices()}")
if not gpus:
    sys.exit("gpu_check: JAX sees no GPU (install jax[cuda12] or jax[cuda13])")
try:
    import torch
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, available "
          f"{torch.cuda.is_available()}")
except ImportError:
    print("torch not installed (the step benchmark's PyTorch rows will say so)")
from replicate.backends import available
assert "cupy" in available(), "the cupy backend is not available"
EOF

run_pytest() {  # pytest that fails when anything skipped: on a GPU machine nothing may skip
  local log
  log=$(mktemp)
  set +e
  python -m pytest -q -p no:cacheprovider -rs "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  set -e
  if grep -E "^SKIPPED" "$log" | grep -v "a GPU is here" | grep -v "nvcc" | grep -v "g++"; then
    echo "gpu_check: tests skipped on a GPU machine (above): failing"; exit 1
  fi
  [ "$rc" -eq 0 ] || { echo "gpu_check: pytest failed ($rc)"; exit 1; }
}

step "parity: op harness, whole steps, generated kernels (cupy and jax vs numpy)"
run_pytest tests/test_backend_parity.py tests/test_cuda_codegen.py tests/test_cupy_kernels.py \
  tests/test_step_errors.py -k "cupy or jax or kernel or sweep or finding or epilogue or \
parameter or float16 or constants or logistic or negative or helpers"
step "deterministic scatter-add: gather gradients are NumPy's bits, twice"
run_pytest tests/test_cupy_scatter.py
step "parity: float16 op harness on cupy and jax"
run_pytest tests/test_ops_low_precision.py -k "cupy or jax"

step "oracle: k = 1, 2, 4 replicas in one process on the GPU (cupy, jax vs numpy)"
python - <<'EOF'
import sys
sys.path.insert(0, "tests")
import test_backend_parity as P
for k in (1, 2, 4):
    want_hist, want_params, _ = P.replicated_training("numpy", k=k)
    for backend in ("cupy", "jax"):
        hist, params, _ = P.replicated_training(backend, k=k)
        P.assert_nests_same(hist, want_hist, f"k={k} {backend} outputs")
        P.assert_nests_same(params, want_params, f"k={k} {backend} parameters")
        print(f"oracle k={k} {backend}: as numpy")
EOF
step "oracle: 2 ranks sharing the GPU (host-staged MPI)"
run_pytest tests/test_backend_parity.py -k "two_processes"

step "device residency: state on the GPU, bytes per step"
run_pytest tests/test_device_state.py
step "NCCL structurally: a 1-rank communicator"
python bench/gpu_nccl_check.py one
step "NCCL structurally: 2 ranks on one GPU (refused cleanly; host-staged automatically)"
MPIEXEC="$(dirname "$(python -c 'import sys; print(sys.executable)')")/mpiexec"
timeout 300 "$MPIEXEC" -n 2 python bench/gpu_nccl_check.py shared \
  || { echo "gpu_check: the 2-rank NCCL check failed or hung"; exit 1; }

step "benchmark: 8-op elementwise chain (cupy backend vs cupy.fuse, jax.jit, copy bandwidth)"
python bench/fusion.py --threads 1
step "benchmark: MLP and conv steps on the GPU (vs PyTorch eager, torch.compile, jax.jit)"
python bench/gpu_steps.py

step "done in $(( $(date +%s) - start )) s"
