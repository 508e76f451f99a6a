#!/usr/bin/env bash
# The GPU session's one script: every throughput number of issue 24, as JSON lines under $OUT, in one call.
#
#   OUT=/tmp/out bash benchmarks/gpu_suite.sh [part ...]   parts: base32 base16 layer large agreement
#                                                          (default: base32 base16 layer, ~6.5 minutes)
#   OUT=/tmp/out bash benchmarks/gpu_suite.sh large        lm_large alone: its dense compile took over 2 minutes
#   OUT=/tmp/out bash benchmarks/gpu_suite.sh issue40      head32 head16 cublas32 large (issue 40; see below)
#
# Writes $OUT/<part>.jsonl (one JSON object per line), $OUT/suite.log (every command, its stderr and exit status)
# and $OUT/env.txt (GPU, driver, versions). The parts run in the order given, by priority, each under its own
# timeout and all under one deadline (SUITE_SECONDS, default 450 s, so one 10-minute call holds the suite with
# room for the machine's start): a part gets at most the time left. A part stopped by its timeout keeps the
# rows it printed (each case prints as it ends).
#   base32 / base16: benchmarks.throughput on configs/lm_base.py at 32 / 16 x 1024 tokens in one microbatch
#     (one routing group per sequence, as the config): the plain-JAX reference, dense, index dispatch at
#     capacity factor 2.0 (the config's) and 1.0; each row carries its compiled program's op counts.
#   layer: benchmarks.moe_layer, one MoE layer fwd + bwd in bf16 at lm_base's and lm_large's shapes, index
#     against grouped (row blocks of 128 and 512) at capacity factor 2.0 and 1.0 (the no-drop case, capacity
#     factor 0, did not finish compiling index dispatch at 1,024 slots a group within 2 minutes on an H100).
#   large: configs/lm_large.py on one device (mesh.expert=1), 4 x 1024 tokens (LARGE_ROWS; 8 on an H200):
#     reference, dense and index at cf 1.0.
#   agreement: benchmarks.loss_agreement, 200 steps of the CPU default model, dispatchers x float32 / bfloat16.
#   head32 / head16 (issue 40): benchmarks.throughput on lm_base at 32 / 16 x 1024 tokens, every change of issue 40
#     on and off in the same process: the reference, dense, dense with the padded vocabulary (model.vocab_multiple
#     =128), with the chunked loss (model.loss_chunk_tokens=$CHUNK, default 8192) and with both, then index dispatch
#     at cf 1.0 without and with both (head16: the both-off and both-on rows only).
#   cublas32: the reference, dense and dense with both changes at 32 x 1024 with XLA_FLAGS
#     --xla_gpu_enable_triton_gemm=false (the head's GEMM on cuBLAS instead of a Triton fusion). An XLA flag is
#     read once per process, so this is a process of its own: compare its rows with head32's.
#   issue40 = head32 head16 cublas32 large, by priority. Estimated from the 27 Nov compiles (20-40 s a train step,
#     lm_large's dense over 2 minutes), one 450 s call finishes head32, head16 and cublas32 and skips or cuts large:
#     run `large` in a second call on the warm machine (the compilation cache then holds head32's programs).
# Compiles dominate (20-40 s a train step at lm_base): JAX_COMPILATION_CACHE_DIR makes a rerun on a warm
# machine skip them.
set -u
OUT=${OUT:?set OUT to the output folder}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/jax_cache}
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.95}
PY=${PYTHON:-python3}
PARTS=${*:-base32 base16 layer}
DEADLINE=$(( $(date +%s) + ${SUITE_SECONDS:-450} ))

# Packages the GPU image lacks (ml_collections) travel as wheels in .whl/ (DEVELOPERS.md); install them once.
if ! $PY -c "import ml_collections" 2>/dev/null; then
  [ -d .whl ] || { echo "ml_collections is missing and there is no .whl/ folder to install it from" >&2; exit 2; }
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 2
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1;
  $PY -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__); print(jax.devices())"; } >"$OUT/env.txt" 2>&1

run() {  # run PART SECONDS command...: appends the command's stdout to $OUT/PART.jsonl
  local part=$1 seconds=$2; shift 2
  local left=$(( DEADLINE - $(date +%s) ))
  (( left < seconds )) && seconds=$left
  if (( seconds < 20 )); then echo "== $part skipped: ${left} s left before the deadline" >>"$OUT/suite.log"; return; fi
  echo "== $part ($seconds s, started $(date -u +%T)): $*" >>"$OUT/suite.log"
  timeout --signal=INT --kill-after=10 "$seconds" "$@" >>"$OUT/$part.jsonl" 2>>"$OUT/suite.log"
  echo "== $part exit $? at $(date -u +%T)" >>"$OUT/suite.log"
}

base() {  # base ROWS
  run base$1 240 $PY -m benchmarks.throughput --config configs/lm_base.py --config.train.batch_size=$1 \
    --config.train.microbatches=1 --config.model.moe.num_groups=$1 --steps 8 --warmup 2 \
    --cases "index_cf2.0:model.moe.dispatcher=index,model.moe.capacity_factor=2.0;index_cf1.0:model.moe.dispatcher=index,model.moe.capacity_factor=1.0" \
    ${PROFILE:+--profile_dir /tmp/profile$1}
}

CHUNK=${CHUNK:-8192}
ON="model.vocab_multiple=128,model.loss_chunk_tokens=$CHUNK"
DENSE_ON="dense_pad:model.moe.enabled=False,model.vocab_multiple=128;dense_chunk:model.moe.enabled=False,model.loss_chunk_tokens=$CHUNK"
BOTH="dense_pad_chunk:model.moe.enabled=False,$ON"
MOE="index_cf1.0:model.moe.dispatcher=index,model.moe.capacity_factor=1.0"
MOE_ON="index_cf1.0_pad_chunk:model.moe.dispatcher=index,model.moe.capacity_factor=1.0,$ON"
head() {  # head ROWS SECONDS CASES [PART [env ...]]: lm_base at ROWS x 1024 tokens, the reference and dense first
  local rows=$1 seconds=$2 cases=$3 part=${4:-head$1}; shift 4 2>/dev/null || shift $#
  run $part $seconds "$@" $PY -m benchmarks.throughput --config configs/lm_base.py --config.train.batch_size=$rows \
    --config.train.microbatches=1 --config.model.moe.num_groups=$rows --steps 6 --warmup 2 --cases "$cases" \
    ${PROFILE:+--profile_dir /tmp/profile_$part}
}

LARGE_ROWS=${LARGE_ROWS:-4}
[ "$PARTS" = issue40 ] && PARTS="head32 head16 cublas32 large"
for part in $PARTS; do
  case $part in
    base32) base 32 ;;
    base16) base 16 ;;
    layer)  # 16 routing groups of 1024 tokens, as the configs; one process per shape, every capacity factor
      run layer 120 $PY -m benchmarks.moe_layer --tokens 16384 --d_model 768 --d_ff 3072 --experts 32 \
        --sublayers 3 --groups 16 --capacity_factor 2.0,1.0 --block_size 128,512 --repeats 10 \
        --dtype bfloat16 --dispatchers index,grouped
      run layer 120 $PY -m benchmarks.moe_layer --tokens 16384 --d_model 1024 --d_ff 4096 --experts 64 \
        --sublayers 6 --groups 16 --capacity_factor 2.0,1.0 --block_size 128,512 --repeats 5 \
        --dtype bfloat16 --dispatchers index,grouped ;;
    large)
      run large 400 $PY -m benchmarks.throughput --config configs/lm_large.py --config.mesh.expert=1 \
        --config.train.batch_size=$LARGE_ROWS --config.train.microbatches=1 --config.model.moe.num_groups=$LARGE_ROWS \
        --steps 5 --warmup 1 --cases "index_cf1.0:model.moe.dispatcher=index,model.moe.capacity_factor=1.0" ;;
    agreement)
      run agreement 80 $PY -m benchmarks.loss_agreement --config configs/default.py --steps 200 ;;
    head32) head 32 220 "$DENSE_ON;$BOTH;$MOE;$MOE_ON" ;;
    head16) head 16 150 "$BOTH;$MOE;$MOE_ON" ;;
    cublas32) head 32 100 "$BOTH" cublas32 env XLA_FLAGS="--xla_gpu_enable_triton_gemm=false ${XLA_FLAGS:-}" ;;
    *) echo "unknown part $part (base32 base16 layer large agreement head32 head16 cublas32, or issue40)" >&2
       exit 2 ;;
  esac
done
ls -l "$OUT"
