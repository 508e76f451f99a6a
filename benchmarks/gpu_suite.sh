#!/usr/bin/env bash
# The GPU session's one script: every throughput / agreement number of issue 8, as JSON lines under $OUT.
#
#   OUT=/tmp/out bash benchmarks/gpu_suite.sh [part ...]     parts: base large layer agreement (default: all)
#
# Writes $OUT/<part>.jsonl (one JSON object per line), $OUT/suite.log (every command, its stderr and exit
# status) and $OUT/env.txt (GPU, driver, versions): 6 files. Each part runs under its own timeout, all
# together at most 690 s (200 + 140 + 6 x 45 + 80): run it as two commands, `base large` (340 s) and
# `layer agreement` (350 s), each inside one 10-minute call; a part that times out keeps the rows it printed
# (each case prints as it ends).
# Per-step batches: the configs' 512 x 1024 tokens (8 microbatches of 64 x 1024) are cut to 16 x 1024 in one
# microbatch (--config.train.batch_size=16 --config.train.microbatches=1; num_groups=16, one routing group
# per sequence as in the configs), so a case compiles and steps in seconds. lm_large runs on one device
# (mesh.expert=1) with 4 x 1024 tokens: its parameters, gradients and Adam state take 53 GiB (plan.py), and
# 8 x 1024 would add ~24 GiB of activations, too close to an H100's 78 GiB; on an H200 set LARGE_ROWS=8.
# BASE_ROWS / LARGE_ROWS change the rows (of 1024 tokens) per step.
set -u
OUT=${OUT:?set OUT to the output folder}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/jax_cache}  # a rerun on a warm machine skips compiles
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.95}
PY=${PYTHON:-python3}
PARTS=${*:-base large layer agreement}
RAW=$(mktemp)

# Packages the GPU image lacks (ml_collections) travel as wheels in .whl/ (DEVELOPERS.md); install them once.
if ! $PY -c "import ml_collections" 2>/dev/null; then
  [ -d .whl ] || { echo "ml_collections is missing and there is no .whl/ folder to install it from" >&2; exit 2; }
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 2
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1;
  $PY -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__); print(jax.devices())"; } >"$OUT/env.txt" 2>&1

run() {  # run PART SECONDS command...
  local part=$1 seconds=$2; shift 2
  local dest=$OUT/$part.jsonl
  [ "$part" = layer_raw ] && dest=$RAW
  echo "== $part ($seconds s): $*" >>"$OUT/suite.log"
  timeout --signal=INT --kill-after=10 "$seconds" "$@" >>"$dest" 2>>"$OUT/suite.log"
  echo "== $part exit $?" >>"$OUT/suite.log"
}

BASE_ROWS=${BASE_ROWS:-16}
LARGE_ROWS=${LARGE_ROWS:-4}
for part in $PARTS; do
  case $part in
    base)  # lm_base: dense + default cases (index cf 2.0 / 1.0, grouped where present)
      run base 200 $PY -m benchmarks.throughput --config configs/lm_base.py --config.train.batch_size=$BASE_ROWS \
        --config.train.microbatches=1 --config.model.moe.num_groups=$BASE_ROWS --steps 8 --warmup 2 ;;
    large)  # lm_large: dense + index and (if present) grouped at cf 1.0
      cases="index_cf1.0:model.moe.dispatcher=index,model.moe.capacity_factor=1.0"
      if $PY -c "import sys; from stablemoe_jax.models.dispatch import DISPATCHERS; sys.exit('grouped' not in DISPATCHERS)"; then
        cases="$cases;grouped_cf1.0:model.moe.dispatcher=grouped,model.moe.capacity_factor=1.0"
      fi
      run large 140 $PY -m benchmarks.throughput --config configs/lm_large.py --config.mesh.expert=1 \
        --config.train.batch_size=$LARGE_ROWS --config.train.microbatches=1 --config.model.moe.num_groups=$LARGE_ROWS \
        --steps 5 --warmup 1 --cases "$cases" ;;
    layer)  # one MoE layer, fwd + bwd, bf16: base (16K tokens, 768/3072, 32 experts, 3 sublayers), large
      for cf in 2.0 1.0 0; do  # one routing group per 1024 tokens, as in the configs; 0: no drops (evaluation)
        run layer_raw 45 $PY -m benchmarks.moe_layer --tokens 16384 --d_model 768 --d_ff 3072 --experts 32 \
          --sublayers 3 --groups 16 --capacity_factor $cf --repeats 10 --dtype bfloat16 --dispatchers index,grouped,one_hot
        run layer_raw 45 $PY -m benchmarks.moe_layer --tokens 16384 --d_model 1024 --d_ff 4096 --experts 64 \
          --sublayers 6 --groups 16 --capacity_factor $cf --repeats 5 --dtype bfloat16 --dispatchers index,grouped
      done
      # moe_layer prints indented JSON objects: one line each in layer.jsonl
      $PY -c "
import json, sys
text, decoder, i = open(sys.argv[1]).read(), json.JSONDecoder(), 0
while (i := text.find('{', i)) >= 0:
  obj, i = decoder.raw_decode(text, i)
  print(json.dumps(obj))" "$RAW" >>"$OUT/layer.jsonl" 2>>"$OUT/suite.log" ;;
    agreement)  # 200 steps of the CPU default model, dispatchers x float32 / bfloat16, synthetic bigram data
      run agreement 80 $PY -m benchmarks.loss_agreement --config configs/default.py --steps 200 ;;
    *) echo "unknown part $part (base large layer agreement)" >&2; exit 2 ;;
  esac
done
ls -l "$OUT"
