#!/usr/bin/env bash
# The GPU benchmarks (issue 31): a second GPU run, after bench/gpu_check.sh passed. One command,
# each benchmark under a hard timeout, the output also in $OUT (or gpu_bench_out/):
#
# 1. the 8-op elementwise chain on 16 M float32 (bench/fusion.py, its GPU section): the cupy
#    backend vs cupy.fuse, jax.jit on the GPU, CuPy op by op and a device-to-device copy of the
#    same bytes (target: >= 80 % of the copy's bandwidth, no slower than jax.jit);
# 2. the MLP, conv and GPT training steps (bench/gpu_steps.py --calls 10): the cupy backend op
#    by op and replayed as a CUDA graph vs jax.jit on the GPU, PyTorch eager and torch.compile on
#    CUDA, with the kernels and bytes per step;
# 3. the probes: what bounds the chain (bench/gpu_chain_probe.py: hand kernels against CuPy's
#    ElementwiseKernel), a GEMM's host cost and cuBLAS under capture (gpu_cublas_probe.py), and
#    a replayed step's host part against its graph's device time (gpu_replay_probe.py).
#
#   bash bench/gpu_prepare.sh   # where pip works, as for gpu_check.sh
#   bash bench/gpu_bench.sh     # on the GPU machine
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${OUT:-$PWD/gpu_bench_out}
mkdir -p "$OUTDIR"
export REPLICATE_CUPY_STANDIN=0
. bench/gpu_env.sh
failed=0
timeout --kill-after=10 "${GPU_BENCH_FUSION_S:-150}" "$PY" bench/fusion.py --threads 1 \
  2>&1 | tee "$OUTDIR/fusion.txt" || failed=1
timeout --kill-after=10 "${GPU_BENCH_STEPS_S:-240}" "$PY" bench/gpu_steps.py --calls 10 \
  2>&1 | tee "$OUTDIR/gpu_steps.txt" || failed=1
for probe in gpu_chain_probe gpu_cublas_probe gpu_replay_probe; do
  timeout --kill-after=10 "${GPU_BENCH_PROBE_S:-60}" "$PY" "bench/$probe.py" \
    2>&1 | tee "$OUTDIR/$probe.txt" || failed=1
done
exit $failed
