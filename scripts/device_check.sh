#!/usr/bin/env bash
# The GPU check: what a first GPU machine should run, in under 8 minutes on one GPU, printing one
# table (benchmarks/device_report.py):
#   1. benchmarks/gpu_throughput.py at K = 1 and 8 for cff, feedback ResMLP and ssl (`single`
#      and `run_seeds`, with GPU busy from the profiler);
#   2. benchmarks/ray_task.py: one seed-batched cff task of 8 seeds through a local Ray on the GPU;
#   3. benchmarks/launches.py: the CPU launch gauge (ops and syncs per seed-step), beside (1).
# Each step has its own time limit, and a step that fails or runs out leaves the others' results.
#
#   bash scripts/device_check.sh                  # on the GPU machine, from the checkout
#   OUT=/tmp/check bash scripts/device_check.sh   # where the JSON, the log and the table go
#   bash scripts/device_check.sh --smoke          # tiny configs on the CPU (checks the script)
#
# A bare GPU machine (torch, numpy, scipy, scikit-learn, pyyaml; no pydantic, no Ray): make the
# bundle here first (scripts/device_bundle.sh writes .whl/site.tar.gz, ignored by git), carry
# .whl to the machine, and this script unpacks it into /tmp/site when an import is missing.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d -t seedgrid-device-check-XXXX)}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
SMOKE=()
if [ "${1:-}" = "--smoke" ]; then SMOKE=(--smoke); fi

if ! "$PY" -c "import pydantic, ray" 2>/dev/null; then
  if [ -f .whl/site.tar.gz ]; then
    mkdir -p /tmp/site && tar xzf .whl/site.tar.gz -C /tmp/site
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
  else
    echo "device_check: pydantic or ray is missing and there is no .whl/site.tar.gz" \
      "(scripts/device_bundle.sh makes it); the steps that need them will fail" >&2
  fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled} RAY_USAGE_STATS_ENABLED=0

LOG="$OUT/log.txt"
: >"$LOG"
# step NAME SECONDS COMMAND...: run it under its limit, its output into the log
step() {
  local name=$1 limit=$2
  shift 2
  local began=$SECONDS
  echo "== $name (limit ${limit} s): $*" | tee -a "$LOG"
  timeout --signal=INT --kill-after=15 "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  echo "== $name: exit $rc after $((SECONDS - began)) s" | tee -a "$LOG"
}

"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(),
  torch.cuda.get_device_name() if torch.cuda.is_available() else '')" 2>&1 | tee -a "$LOG"

if [ ${#SMOKE[@]} -gt 0 ]; then
  step throughput 200 "$PY" benchmarks/gpu_throughput.py --smoke --trainers cff feedback_resmlp \
    --modes run_seeds --json "$OUT/throughput.json"
  step ray_task 90 "$PY" benchmarks/ray_task.py --smoke --json "$OUT/ray_task.json"
  step launches 200 "$PY" benchmarks/launches.py --smoke --trainers cff feedback_resmlp \
    --json "$OUT/launches.json"
else
  step throughput 290 "$PY" benchmarks/gpu_throughput.py --trainers cff feedback_resmlp ssl \
    --modes run_seeds --k 1 8 --epochs 1 --max-seconds 40 --json "$OUT/throughput.json"
  step ray_task 90 "$PY" benchmarks/ray_task.py --case cff --k 8 --epochs 2 \
    --json "$OUT/ray_task.json"
  step launches 90 "$PY" benchmarks/launches.py --json "$OUT/launches.json"
fi
"$PY" benchmarks/device_report.py "$OUT" | tee "$OUT/table.txt"
echo "device_check: results under $OUT (total $SECONDS s)"
