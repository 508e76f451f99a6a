#!/usr/bin/env bash
# N processes on this machine, one CPU device each, joined by jax.distributed (gloo collectives):
# a real multi-host run without a cluster, for checking a launch before paying for one.
#   launch/local_multiprocess.sh 2 --config configs/default.py --workdir runs/mp --config.train.steps=20
set -euo pipefail
cd "$(dirname "$0")/.."
num_processes="$1"; shift
port="${PORT:-$((20000 + RANDOM % 20000))}"
pids=()
for ((i = 0; i < num_processes; i++)); do
  python -m stablemoe_jax.main --coordinator_address="127.0.0.1:${port}" \
    --num_processes="${num_processes}" --process_id="${i}" "$@" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "${pid}" || status=$?; done
exit "${status}"
