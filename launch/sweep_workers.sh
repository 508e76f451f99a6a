#!/usr/bin/env bash
# Several workers of one resumable comparison sweep on one machine (one GPU, or many CPU cores).
#
#   WORKERS=10 DEADLINE_S=3000 bash launch/sweep_workers.sh configs/tune_cpu.py /tmp/tune [--config.a.b=v ...]
#
# Each worker runs `python -m stablemoe_jax.compare` with the config's methods in its own rotated order, so the
# workers start on different methods; the per-run lock (compare/runner.py) keeps two workers off one run. A
# worker repeats its pass until a pass finds nothing left to train (seeds wait for a method's whole grid, which
# another worker may still be finishing). After DEADLINE_S seconds the workers are stopped: their unfinished runs
# resume from their last checkpoint on the next call. Logs: WORKDIR/logs/worker<i>.log.
# On one GPU, give each worker a slice of its memory: XLA_PYTHON_CLIENT_PREALLOCATE=false (set below).
set -uo pipefail
config=${1:?usage: sweep_workers.sh CONFIG WORKDIR [--config.x=y ...]}
workdir=${2:?usage: sweep_workers.sh CONFIG WORKDIR [--config.x=y ...]}
shift 2
workers=${WORKERS:-4}
deadline=$(( $(date +%s) + ${DEADLINE_S:-86400} ))
export XLA_PYTHON_CLIENT_PREALLOCATE=${XLA_PYTHON_CLIENT_PREALLOCATE:-false}
mkdir -p "$workdir/logs"

methods=$(python3 - "$config" "$@" <<'EOF'
import sys
from ml_collections import config_flags
from absl import flags
flag = config_flags.DEFINE_config_file("config")
flags.FLAGS(["x", f"--config={sys.argv[1]}", *sys.argv[2:]])
print(flag.value.compare.methods.replace(" ", ""))
EOF
) || exit 1
IFS=, read -r -a names <<< "$methods"

worker() {  # $1: worker index; passes until nothing is left or the deadline passes
  local i=$1 n=${#names[@]} order=() pass="$workdir/logs/worker$1.pass"
  shift
  for ((k = 0; k < n; k++)); do order+=("${names[(i + k) % n]}"); done
  order=$(IFS=,; echo "${order[*]}")
  while (( $(date +%s) < deadline )); do
    python -m stablemoe_jax.compare --config "$config" --workdir "$workdir" "$@" \
      --config.compare.methods="$order" 2>&1 | tee "$pass"
    status=${PIPESTATUS[0]}
    if (( status != 0 )) && grep -q "^error:" "$pass"; then  # a config or data error: every pass would repeat it
      echo "worker $i: stopped by the error above (exit $status)"; break
    fi
    grep -q "training in" "$pass" && continue                 # trained something: look again
    grep -q "skipped\|no choice" "$pass" || break             # every run finished: done
    sleep 10                                                  # waiting on another worker's runs
  done
}

pids=()
for ((i = 0; i < workers; i++)); do
  worker "$i" "$@" > "$workdir/logs/worker$i.log" 2>&1 &
  pids+=($!)
  sleep 2  # staggered starts: the first pass of each worker takes a different run
done
( while (( $(date +%s) < deadline )); do sleep 5; done; echo "deadline: stopping the workers"
  pkill -TERM -f "stablemoe_jax.compare --config $config --workdir $workdir" ) &
watchdog=$!
wait "${pids[@]}"  # the workers by pid: a bare `wait` would also wait out the watchdog once they have all ended
kill "$watchdog" 2>/dev/null
grep -h "trained in" "$workdir"/logs/worker*.log | sort | uniq
# Each method's choice as the passes logged it, in order and once each: a rejected setting stays next to the
# setting chosen after it (sorting would put "chose 1e-3" before "chose 2e-3 ... rejected").
grep -h ": chose \|: .* rejected: " "$workdir"/logs/worker*.log | awk '!seen[$0]++'
