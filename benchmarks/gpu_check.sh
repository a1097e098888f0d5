#!/usr/bin/env bash
# The GPU check: the one script run on a machine with a GPU (Python 3.12 and PyTorch with CUDA installed, nothing
# fetchable). It installs the wheels carried in .whl/ (benchmarks/gpu_wheels.sh downloads them), says what the
# machine offers, runs every `gpu`-marked test and then benchmarks/gpu.py --quick, and writes its logs and results
# to a folder: gpu_check.log (the steps and their statuses), install.log, machine.txt, pytest.log, gpu_bench.log and
# gpu.json (the benchmark's results file, as benchmarks/results keeps them). Each step has a time limit; the whole
# check stays within GPU_CHECK_SECONDS (480 by default).
#
#     bash benchmarks/gpu_check.sh [FOLDER [COMMIT]]    # FOLDER: default $OUT; COMMIT: recorded with the results
#
# Without CUDA it says so, runs the tests (each `gpu` test skipped with its reason) and the benchmark (each table
# noted "skipped: no CUDA"), and exits 0. Its status: 0 when every step ran and passed, else that of the first step
# that failed (124: a step ran out of time).
set -uo pipefail

cd "$(dirname "$0")/.."
OUTDIR=${1:-${OUT:-}}
if [ -z "$OUTDIR" ]; then
  echo "usage: bash benchmarks/gpu_check.sh FOLDER [COMMIT] (or set OUT)" >&2
  exit 2
fi
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
COMMIT=${2:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
PYTHON=${PYTHON:-python3}
BUDGET=${GPU_CHECK_SECONDS:-480}
START=$(date +%s)
STATUS=0
export PYTHONUNBUFFERED=1

log() { echo "[gpu_check +$(( $(date +%s) - START ))s] $*" | tee -a "$OUTDIR/gpu_check.log"; }
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
# step NAME SECONDS LOGFILE COMMAND...: COMMAND under a time limit (never past the budget), its output in LOGFILE
step() {
  local name=$1 limit=$2 file=$3 rc
  shift 3
  local remaining=$(( $(left) - 5 ))
  if [ "$remaining" -lt "$limit" ]; then limit=$remaining; fi
  if [ "$limit" -le 5 ]; then
    log "$name: not run, the check's $BUDGET s are spent"
    [ "$STATUS" -ne 0 ] || STATUS=124
    return
  fi
  log "$name: started (at most $limit s)"
  timeout -s TERM -k 20 "$limit" "$@" >"$OUTDIR/$file" 2>&1
  rc=$?
  log "$name: exit status $rc$([ "$rc" -eq 124 ] && echo ' (its time limit)')"
  if [ "$rc" -ne 0 ] && [ "$STATUS" -eq 0 ]; then STATUS=$rc; fi
}

log "commit $COMMIT, results in $OUTDIR"
PYVERSION=$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
if ! ls .whl/*.whl >/dev/null 2>&1; then
  log "no .whl/ here: the packages this Python has are used (benchmarks/gpu_wheels.sh downloads the others)"
elif [ "$PYVERSION" != 3.12 ]; then
  log "the wheels in .whl/ are for Python 3.12 and this is $PYVERSION: not installed, the packages it has are used"
else
  step "install the carried wheels" 120 install.log "$PYTHON" -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

step "what the machine offers" 60 machine.txt "$PYTHON" -c '
import os, platform, torch
print("python", platform.python_version(), "| torch", torch.__version__, "| CUDA", torch.version.cuda)
print("cores", os.cpu_count(), "|", platform.platform())
if torch.cuda.is_available():
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        print(f"cuda:{i} {p.name}, {p.total_memory / 2**30:.0f} GiB, compute capability {p.major}.{p.minor}, "
              f"bf16 {torch.cuda.is_bf16_supported()}")
    print("nccl", torch.cuda.nccl.version())
else:
    print("no CUDA: torch sees no CUDA device here")
import gymnasium, hydra, omegaconf, tensordict
print("tensordict", tensordict.__version__, "| hydra", hydra.__version__, "| omegaconf", omegaconf.__version__,
      "| gymnasium", gymnasium.__version__)
'
command -v nvidia-smi >/dev/null && nvidia-smi -L >>"$OUTDIR/machine.txt" 2>&1
cat "$OUTDIR/machine.txt" | tee -a "$OUTDIR/gpu_check.log"
if ! "$PYTHON" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
  log "no CUDA on this machine: the gpu tests are skipped (each with its reason) and the benchmark's tables say so"
fi

# only the modules that hold gpu tests: the others import what this machine need not have (Ray, Slurm's submitit...)
GPU_TEST_FILES=$(grep -rl --include='test_*.py' 'mark.gpu' tests | sort)
step "gpu tests" 200 pytest.log "$PYTHON" -m pytest -m gpu -p no:cacheprovider -n 0 -q -rA --timeout 150 $GPU_TEST_FILES
tail -n 15 "$OUTDIR/pytest.log" | tee -a "$OUTDIR/gpu_check.log"

step "benchmarks/gpu.py --quick" 400 gpu_bench.log "$PYTHON" benchmarks/gpu.py --quick --results-dir "$OUTDIR" \
  --commit "$COMMIT" --timeout 240
grep -E "^(- |\| |skipped|stopped|results:)" "$OUTDIR/gpu_bench.log" | tee -a "$OUTDIR/gpu_check.log"

log "done in $(( $(date +%s) - START )) s, status $STATUS"
exit "$STATUS"
