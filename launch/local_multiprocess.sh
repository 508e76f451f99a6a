#!/usr/bin/env bash
# N processes on this machine, D CPU devices each (default 1), joined by jax.distributed (gloo collectives):
# a real multi-host run without a cluster, for checking a launch before paying for one.
#   launch/local_multiprocess.sh 2 --config configs/default.py --workdir runs/mp --config.train.steps=20 \
#     --config.train.stage1_steps=10 --config.train.warmup_steps=5
#   launch/local_multiprocess.sh 2 2 --config configs/default.py --workdir runs/mp      # 2 processes x 2 devices
#   DEVICES_PER_PROCESS=2 launch/local_multiprocess.sh 2 --config configs/default.py --workdir runs/mp
# Every other argument goes to `python -m stablemoe_jax.main` (e.g. --config.mesh.expert=4).
# When one process exits non-zero, the others are stopped (SIGTERM, then SIGKILL after GRACE_SECONDS, default 5)
# and this script exits with that process's status. PORT overrides the coordinator port.
set -uo pipefail
if ((BASH_VERSINFO[0] < 5 || (BASH_VERSINFO[0] == 5 && BASH_VERSINFO[1] < 1))); then
  echo "launch: needs bash >= 5.1 (for wait -n -p), this is ${BASH_VERSION}; on macOS: brew install bash" >&2; exit 2
fi
cd "$(dirname "$0")/.."
usage="usage: [DEVICES_PER_PROCESS=D] $0 NUM_PROCESSES [DEVICES_PER_PROCESS] --config FILE --workdir DIR [flags]"
num_processes="${1:-}"
[[ "${num_processes}" =~ ^[1-9][0-9]*$ ]] || { echo "${usage}" >&2; exit 2; }
shift
devices="${DEVICES_PER_PROCESS:-1}"
if [[ $# -gt 0 && "$1" =~ ^[0-9]+$ ]]; then devices="$1"; shift; fi
if [[ ! "${devices}" =~ ^[1-9][0-9]*$ ]]; then
  echo "DEVICES_PER_PROCESS must be a positive integer, got ${devices}" >&2; exit 2
fi
port="${PORT:-$((20000 + RANDOM % 20000))}"
grace="${GRACE_SECONDS:-5}"
export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"

declare -A rank_of=()
stop_all() {  # SIGTERM to every process still running, SIGKILL to those left after the grace period
  local pids=("${!rank_of[@]}")
  [[ ${#pids[@]} -eq 0 ]] && return
  kill -TERM "${pids[@]}" 2>/dev/null
  for ((t = 0; t < grace * 10; t++)); do
    kill -0 "${pids[@]}" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "${pids[@]}" 2>/dev/null
  wait "${pids[@]}" 2>/dev/null
}
trap 'echo "launch: interrupted; stopping all processes" >&2; stop_all; exit 130' INT TERM

for ((i = 0; i < num_processes; i++)); do
  python -m stablemoe_jax.main --coordinator_address="127.0.0.1:${port}" --num_processes="${num_processes}" \
    --process_id="${i}" --cpu_devices="${devices}" "$@" &
  rank_of[$!]="${i}"
done

while [[ ${#rank_of[@]} -gt 0 ]]; do
  wait -n -p done_pid "${!rank_of[@]}"
  status=$?
  rank="${rank_of[${done_pid}]}"
  unset "rank_of[${done_pid}]"
  if [[ ${status} -ne 0 ]]; then
    how="exited with status ${status}"
    hint=""
    if ((status > 128)); then
      how="was killed by signal $((status - 128)) (status ${status})"
      hint=" Rerun the same command to resume from the last checkpoint."
    fi
    echo "launch: process ${rank} (pid ${done_pid}) ${how}; stopping the other ${#rank_of[@]} process(es).${hint}" >&2
    stop_all
    exit "${status}"
  fi
done
exit 0
