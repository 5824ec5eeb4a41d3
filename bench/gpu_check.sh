#!/usr/bin/env bash
# The GPU check (issue 31): is the GPU path right? One command on one machine with an NVIDIA GPU
# (sized for one H100 with 16 cores: at most 8 minutes), no network. Correctness only; the
# benchmarks are bench/gpu_bench.sh, a second run.
#
#   where pip works:   bash bench/gpu_prepare.sh   # wheels the GPU machine lacks -> .whl/
#   GPU machine:       bash bench/gpu_check.sh     # log, junit XML, summary -> $OUT or gpu_check_out/
#
# 0. environment (bench/gpu_env.sh): a venv that sees the machine's packages (CuPy, JAX,
#    PyTorch, pytest) plus the carried wheels (mpich: mpiexec beside the interpreter; mpi4py);
# 1. versions: driver, CUDA runtime, CuPy, NVRTC, NCCL, JAX and its devices, PyTorch, MPI;
# 2. the parity suites (pytest -n 8): the cupy tests (every generated kernel, raw ones too, the
#    products on cuBLAS, CUDA-graph replay, the model steps' kernels, scatter-add, device state,
#    the bytes a step moves), the op harness and the float16 harness on cupy and jax against
#    NumPy, whole steps, 2 ranks sharing the GPU (host-staged);
# 3. the oracle: k = 1, 2, 4 replicas in one process, cupy and jax against numpy;
# 4. NCCL: a 1-rank communicator through the library's NCCL transport;
# 5. NCCL: 2 ranks on the one GPU (refused clearly; host-staged automatically; NCCL's own init
#    fails cleanly).
# Every step runs under a hard timeout and every step runs even when one before it failed; the
# script fails (exit 1) when any step failed or any test skipped for a reason other than "a GPU
# is here" (what only the stand-in can check) or a missing compiler. The CuPy stand-in of the
# tests is off: REPLICATE_CUPY_STANDIN=0.
#
# Rehearsal without a GPU (tests/backends/test_gpu_check.py): GPU_CHECK_REHEARSAL=1 runs every step on the
# CuPy stand-in seen as a GPU (REPLICATE_CUPY_STANDIN=gpu-view), with GPU_CHECK_PYTHON as the
# interpreter and GPU_CHECK_SELECT / GPU_CHECK_TESTS / GPU_CHECK_ORACLE / GPU_CHECK_WORKERS /
# GPU_CHECK_STEPS narrowing the work.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUTDIR=${OUT:-$ROOT/gpu_check_out}
mkdir -p "$OUTDIR"
REHEARSAL=${GPU_CHECK_REHEARSAL:-0}
WORKERS=${GPU_CHECK_WORKERS:-8}
SELECT=${GPU_CHECK_SELECT:-"cupy or jax or test_cupy_kernels or test_cupy_scatter or \
test_device_state or test_cuda_codegen or test_cupy_graph or test_cuda_blas or test_cuda_raw"}
ORACLE=${GPU_CHECK_ORACLE:-"1 2 4"}
STEPS=${GPU_CHECK_STEPS:-"versions parity oracle nccl-one nccl-shared"}
TESTS=${GPU_CHECK_TESTS:-"tests/backends/test_cupy_kernels.py tests/backends/test_cupy_scatter.py \
tests/backends/test_cupy_graph.py tests/backends/test_cuda_blas.py \
tests/backends/test_cuda_raw.py tests/backends/test_cuda_codegen.py tests/backends/test_device_state.py \
tests/backends/test_backend_parity.py tests/backends/test_jax_backend.py \
tests/api/test_ops_low_precision.py tests/graph/test_step_errors.py tests/api/test_interop.py"}
SUMMARY=$OUTDIR/summary.txt
: >"$SUMMARY"
exec > >(tee "$OUTDIR/gpu_check.log") 2>&1
start=$(date +%s)
failed=0

if [ "$REHEARSAL" = 1 ]; then
  export REPLICATE_CUPY_STANDIN=gpu-view   # the stand-in, seen by the tests as a GPU
else
  export REPLICATE_CUPY_STANDIN=0          # the real CuPy on the real GPU, never the stand-in
fi

# step NAME SECONDS COMMAND...: run it under a hard timeout, record the outcome
step() {
  local name=$1 limit=$2 t0 rc
  shift 2
  t0=$(date +%s)
  echo
  echo "=== $name (at $(( t0 - start )) s, at most $limit s)"
  timeout --kill-after=10 "$limit" bash -c '"$@"' step "$@"  # a function (exported) or a command
  rc=$?
  local took=$(( $(date +%s) - t0 ))
  if [ "$rc" -eq 0 ]; then
    printf '%-44s passed  %4d s\n' "$name" "$took" >>"$SUMMARY"
  else
    [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && rc="timeout"
    printf '%-44s FAILED  %4d s  (%s)\n' "$name" "$took" "exit $rc" >>"$SUMMARY"
    failed=1
  fi
}
wanted() { [[ " $STEPS " == *" $1 "* ]]; }

# -- 0. the interpreter: the machine's packages plus the carried wheels --------------------------
. bench/gpu_env.sh
export PY REHEARSAL OUTDIR WORKERS SELECT TESTS

# -- 1. versions --------------------------------------------------------------------------------
versions() {
  [ "$REHEARSAL" = 1 ] || nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  "$PY" - <<'PYEOF'
import os, platform, sys
sys.path.insert(0, "tests")
import cupy_standin
cupy_standin.install()  # only in the rehearsal
import numpy, cupy
n = cupy.cuda.runtime.getDeviceCount()  # raises without a driver: the check fails here
if n < 1:
    sys.exit("gpu_check: CuPy sees no GPU")
print(f"python {platform.python_version()} ({sys.executable}), numpy {numpy.__version__}")
if not cupy_standin.INSTALLED:
    props = cupy.cuda.runtime.getDeviceProperties(0)
    print(f"device {props['name'].decode()} x{n}, driver {cupy.cuda.runtime.driverGetVersion()}, "
          f"CUDA runtime {cupy.cuda.runtime.runtimeGetVersion()}, CuPy {cupy.__version__}, "
          f"NVRTC {cupy.cuda.nvrtc.getVersion()}")
from replicate.runtime.communication.gpu_transport import nccl_module
nccl = nccl_module()
print(f"NCCL {nccl.get_version() if nccl is not None else 'does not load'}")
import jax
print(f"jax {jax.__version__}: {jax.devices()}")
if not cupy_standin.INSTALLED and not [d for d in jax.devices() if d.platform == "gpu"]:
    sys.exit("gpu_check: JAX sees no GPU (install jax[cuda12] or jax[cuda13])")
try:
    import torch
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, available "
          f"{torch.cuda.is_available()}")
except ImportError:
    print("torch not installed")
from mpi4py import MPI
print(f"mpi4py {MPI.Get_library_version().splitlines()[0]}")
mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
assert os.path.exists(mpiexec), f"no mpiexec beside the interpreter ({mpiexec})"
from replicate.backends import available
assert "cupy" in available(), "the cupy backend is not available"
PYEOF
}
export -f versions
wanted versions && step "versions" 90 versions

# -- 2. the parity suites -----------------------------------------------------------------------
parity() {
  # shellcheck disable=SC2086 - TESTS is a list of paths
  "$PY" -m pytest -q -p no:cacheprovider -n "$WORKERS" -rs --junitxml="$OUTDIR/junit.xml" \
    -o faulthandler_timeout=150 -k "$SELECT" $TESTS
  local rc=$?
  # nothing may skip on a GPU machine, but what only the stand-in or a compiler can check
  "$PY" - "$OUTDIR/junit.xml" <<'PYEOF' || rc=1
import sys, xml.etree.ElementTree as ET
ALLOWED = ("a GPU is here", "g++", "nvcc")
cases = list(ET.parse(sys.argv[1]).getroot().iter("testcase"))
skipped = [(c.get("classname") + "::" + c.get("name"), s.get("message", ""))
           for c in cases for s in c.findall("skipped")]
bad = [(n, m) for n, m in skipped if not any(a in m for a in ALLOWED)]
print(f"gpu_check: {len(cases)} tests, {len(skipped)} skipped ({len(skipped) - len(bad)} "
      f"allowed: {', '.join(ALLOWED)})")
for n, m in bad:
    print(f"gpu_check: skipped on a GPU machine: {n}: {m}")
sys.exit(1 if bad or not cases else 0)
PYEOF
  return $rc
}
export -f parity
wanted parity && step "parity suites (pytest -n $WORKERS)" 300 parity

# -- 3.-5. the oracle and NCCL ------------------------------------------------------------------
wanted oracle && step "oracle: k = ${ORACLE// /, } replicas (cupy, jax)" 120 \
  "$PY" bench/gpu_oracle.py $ORACLE
wanted nccl-one && step "NCCL: a 1-rank communicator" 60 "$PY" bench/gpu_nccl_check.py one
wanted nccl-shared && step "NCCL: 2 ranks on one GPU" 90 \
  "$(dirname "$("$PY" -c 'import sys; print(sys.executable)')")/mpiexec" -n 2 \
  "$PY" bench/gpu_nccl_check.py shared

echo
echo "=== summary ($(( $(date +%s) - start )) s; $OUTDIR)"
cat "$SUMMARY"
exit $failed
