#!/bin/bash
# Issue 40, CPU: peak memory of lm_base's train step at 2 x 1024 tokens, one case a process.
cd "$(dirname "$0")/../../.."  # the repository root
BASE="--config configs/lm_base.py --config.train.batch_size=2 --config.train.microbatches=1 --config.model.moe.num_groups=2 --noreference --nodense --steps 1 --warmup 0"
for c in "dense_off:model.moe.enabled=False" "dense_pad_chunk:model.moe.enabled=False,model.vocab_multiple=128,model.loss_chunk_tokens=512" "moe_off:model.moe.dispatcher=index" "moe_pad_chunk:model.moe.dispatcher=index,model.vocab_multiple=128,model.loss_chunk_tokens=512"; do
  echo "== $c" >> ${LOG:-/tmp/peak.log}
  nice -n 5 python -m benchmarks.peak_memory --interval 0.2 -- python -m benchmarks.throughput $BASE --cases "$c" >> ${ROWS:-/tmp/peak.jsonl} 2>> ${LOG:-/tmp/peak.log}
done
echo finished >> ${LOG:-/tmp/peak.log}
