# Sourced by bench/gpu_check.sh and bench/gpu_bench.sh: the environment of a GPU run.
#
# Sets PY, the interpreter: the machine's python3 (or GPU_CHECK_PYTHON) where .whl/ is empty;
# else a venv that sees the machine's packages (CuPy, JAX, PyTorch, pytest) plus the wheels
# bench/gpu_prepare.sh put in .whl/ (mpich: mpiexec beside the interpreter; mpi4py). A venv made
# from another venv's python (the image's python3 is one) sees only the base install, so it is
# pointed at the machine's site-packages too, after its own: the carried wheels win.
# Exports what JAX and the tests need on a GPU (as replicate.launch.gpu_environment sets them).

export XLA_PYTHON_CLIENT_PREALLOCATE=false
case "${XLA_FLAGS:-}" in
  *xla_gpu_deterministic_ops*) ;;
  *) export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_gpu_deterministic_ops=true" ;;
esac
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

PY=${GPU_CHECK_PYTHON:-python3}
if [ "${GPU_CHECK_REHEARSAL:-0}" != 1 ] && compgen -G ".whl/*.whl" >/dev/null; then
  VENV=${GPU_CHECK_VENV:-/tmp/replicate-gpu-venv}
  if [ ! -x "$VENV/bin/python" ]; then
    host_site=$("$PY" -c 'import site; print("\n".join(site.getsitepackages()))')
    "$PY" -m venv --system-site-packages "$VENV" || exit 1
    venv_site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    printf '%s\n' "$host_site" >"$venv_site/zz_gpu_check_host.pth"
    "$VENV/bin/python" -m pip install -q --no-index --no-deps --no-compile .whl/*.whl || exit 1
  fi
  PY=$VENV/bin/python
fi
echo "interpreter: $PY"
