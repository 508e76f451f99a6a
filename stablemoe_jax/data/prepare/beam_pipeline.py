"""Running the shard tasks on Apache Beam (or inline, without Beam).

The pipeline is one task per shard, with no GroupByKey, so a worker holds one
shard's batch at a time and nothing is shuffled through the runner:

    Create(shard specs) | Reshuffle | Map(process_shard, job)

`Reshuffle` spreads the specs over the workers. Results are the files the
tasks write (see `shard_writer`), so any runner whose workers share the output
filesystem works:

* one machine: `workers=N` runs Beam's FnApiRunner (the portable local runner)
  with N subprocess workers (`direct_num_workers=N`,
  `direct_running_mode=multi_processing`). The runner is pinned: Beam >= 2.68
  may otherwise pick Prism, which downloads a binary from GitHub.
* a cluster: `beam_args` (e.g. `--runner=FlinkRunner --flink_master=host:8081
  --environment_type=LOOPBACK`) go to `PipelineOptions` as they are, and Beam
  picks that runner; the workdir must be a shared POSIX path (NFS, FUSE).
* `workers=0`: no Beam at all, the tasks run in this process in order.

`import apache_beam` happens here only, at preparation time: training never
needs Beam.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Sequence

from stablemoe_jax.data.common.shards import ShardSpec
from stablemoe_jax.data.prepare import shard_writer


def run_inline(specs: Sequence[ShardSpec], job: shard_writer.ShardJob) -> None:
  for spec in specs:
    shard_writer.process_shard(spec, job)


def run_beam(specs: Sequence[ShardSpec], job: shard_writer.ShardJob, workers: int, beam_args: str = '') -> None:
  """Runs every shard task on Beam; returns when the pipeline has finished."""
  import apache_beam as beam
  from apache_beam.options.pipeline_options import PipelineOptions

  logging.getLogger('apache_beam').setLevel(logging.WARNING)
  args = shlex.split(beam_args)
  if any(a.startswith('--runner') for a in args):
    pipeline = beam.Pipeline(options=PipelineOptions(args))
  else:
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner
    options = PipelineOptions(args, direct_num_workers=workers, direct_running_mode='multi_processing',
                              default_sdk_harness_log_level='WARNING')
    pipeline = beam.Pipeline(runner=FnApiRunner(), options=options)
  with pipeline:
    _ = (pipeline
         | 'Shards' >> beam.Create(list(specs))
         | 'Spread' >> beam.Reshuffle()
         | 'Tokenize' >> beam.Map(shard_writer.process_shard, job))


def run(specs: Sequence[ShardSpec], job: shard_writer.ShardJob, workers: int, beam_args: str = '') -> None:
  if not specs:
    return
  if workers == 0 and not beam_args:
    run_inline(specs, job)
  else:
    run_beam(specs, job, max(workers, 1), beam_args)
