#!/usr/bin/env bash
# Plain multi-host launch without a scheduler: run this on every host with its own PROCESS_ID.
#   COORDINATOR=host0:12345 NUM_PROCESSES=2 PROCESS_ID=0 launch/multihost.sh --config configs/lm_base.py --workdir /shared/runs/base
# Every argument goes to stablemoe_jax.main: set the mesh with e.g. --config.mesh.expert=8, and the failure
# detection with --heartbeat_timeout_seconds=N (default 10: if a host dies the others stop within about N s).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${COORDINATOR:?set COORDINATOR=host:port of process 0}"
: "${NUM_PROCESSES:?set NUM_PROCESSES}"
: "${PROCESS_ID:?set PROCESS_ID (0 on the coordinator host)}"
exec python -m stablemoe_jax.main --coordinator_address="${COORDINATOR}" \
  --num_processes="${NUM_PROCESSES}" --process_id="${PROCESS_ID}" "$@"
