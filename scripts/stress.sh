#!/usr/bin/env bash
# Stress: the whole test suite twice in a row while other processes keep every core busy.
# Guards against the XLA CPU collective abort ("Expected 8 threads to join the rendezvous"),
# which shows up under load. Not part of .ci/run (two suites take far more than its budget).
#
# Usage: scripts/stress.sh [extra pytest args]
# Environment: PYTHON (default: python3; e.g. build/ci-venv/bin/python),
#              STRESS_RUNS (default 2), STRESS_RUN_TIMEOUT_S (default 3600, per suite run),
#              STRESS_BUSY (busy processes, default: the number of cores).
# Exits non-zero if any run fails, aborts, or times out.
set -euo pipefail

cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
runs="${STRESS_RUNS:-2}"
run_timeout="${STRESS_RUN_TIMEOUT_S:-3600}"
busy_count="${STRESS_BUSY:-$(nproc)}"
busy_limit=$((runs * run_timeout + 60))  # the busy loops end on their own even if we are killed
log_dir="$(mktemp -d -t padded-eval-stress.XXXXXX)"

busy_pids=()
stop_busy() {
  for pid in "${busy_pids[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  wait "${busy_pids[@]}" 2>/dev/null || true
}
trap stop_busy EXIT

echo "== $busy_count busy processes (at most ${busy_limit}s each)"
for _ in $(seq "$busy_count"); do
  timeout "$busy_limit" "$python" -c 'while True: pass' &
  busy_pids+=("$!")
done

status=0
for run in $(seq "$runs"); do
  log="$log_dir/run$run.log"
  echo "== run $run of $runs: $python -m pytest $* (log: $log)"
  start=$(date +%s)
  rc=0
  PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" timeout "$run_timeout" \
    "$python" -m pytest -q -p no:cacheprovider "$@" >"$log" 2>&1 || rc=$?
  echo "   exit $rc after $(($(date +%s) - start))s; load: $(cut -d' ' -f1-3 /proc/loadavg)"
  tail -n 3 "$log" | sed 's/^/   /'
  if grep -q -e "Fatal Python error" -e "Termination timeout" -e "join the rendezvous" "$log"; then
    echo "   ABORT: XLA collective rendezvous timeout in run $run"
    grep -m 3 -e "Fatal Python error" -e "Termination timeout" "$log" | sed 's/^/   /'
    if [[ "$rc" -eq 0 ]]; then rc=1; fi
  fi
  if [[ "$rc" -eq 124 ]]; then
    echo "   TIMEOUT: run $run exceeded ${run_timeout}s"
  fi
  if [[ "$rc" -ne 0 ]]; then
    status=1
  fi
done

if [[ "$status" -eq 0 ]]; then
  echo "== stress passed: $runs runs under load, no failure, no abort"
else
  echo "== stress FAILED (logs in $log_dir)"
fi
exit "$status"
