#!/usr/bin/env bash
# Run where pip reaches PyPI, before bench/gpu_check.sh on a GPU machine that has no network:
# puts in .whl/ (ignored by git) the wheels that machine lacks, for its CPython 3.12 on x86-64
# Linux. Its image has CuPy, JAX with its CUDA plugin, PyTorch, pytest, pytest-xdist,
# hypothesis, ml_dtypes, tqdm and threadpoolctl; it lacks MPI: the `mpich` wheel (mpiexec and
# libmpi) and `mpi4py` built for it.
#
#   bash bench/gpu_prepare.sh            # then carry .whl/ to the GPU machine
#   GPU_PYTHON=3.11 bash bench/gpu_prepare.sh   # another Python there
set -euo pipefail
cd "$(dirname "$0")/.."
py=${GPU_PYTHON:-3.12}
mkdir -p .whl
# one version of each (two would stop the install there): the newest the `mpi` extra allows
wheels=("mpich>=4.2" "mpi4py>=4.0")
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
         manylinux_2_5_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
rm -f .whl/mpich-*.whl .whl/mpi4py-*.whl
for w in "${wheels[@]}"; do
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$py" \
    --implementation cp "${platforms[@]}" -d .whl "$w"
done
ls -l .whl
echo "gpu_prepare: .whl/ holds the wheels bench/gpu_check.sh installs on the GPU machine"
