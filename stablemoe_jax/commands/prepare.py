"""`python -m stablemoe_jax.data.prepare --config CONFIG --workdir DIR [--workers N]`: corpora at any size.

The command (``data/prepare/__main__.py`` only names it): its flags, the config check and the user errors of every
entry point (``cli``). A language-model config is prepared by ``data/prepare/lm.py``, a translation config
(``config.task = "translation"``) by ``data/prepare/translation.py``; both write into ``DIR/data``, where
``python -m stablemoe_jax.main`` then reads them.
"""
from __future__ import annotations

import json
import pathlib

from absl import flags
from ml_collections import config_flags

from stablemoe_jax import cli
from stablemoe_jax.core import settings as settings_lib
from stablemoe_jax.core.constants import task_name
from stablemoe_jax.data.prepare import lm as lm_prepare
from stablemoe_jax.data.prepare import translation as prepare_translation
from stablemoe_jax.data.prepare.lm import Options
from stablemoe_jax.experiment.config_validation import validate_config


def main(argv: list[str]) -> None:
  del argv
  f = flags.FLAGS
  options = Options(f.shard_mb, f.shard_pairs, f.chunk_tokens, f.sentencepiece_sample_lines, f.batch_lines,
                    f.workers, f.skip_bad_files, f.beam_args)
  if task_name(f.config) == 'translation':
    validate_config(f.config)  # Before any work: the config main will be run with (pairs, files' globs, ...).
    report = prepare_translation.prepare(settings_lib.from_config(f.config).data, pathlib.Path(f.workdir) / 'data',
                                         options)
  else:
    report = lm_prepare.prepare(settings_lib.from_config(f.config).data, pathlib.Path(f.workdir) / 'data', options)
  print(json.dumps(report))


def define_flags() -> None:
  """The command's flags (defined by the entry point that runs it, never on import)."""
  config_flags.DEFINE_config_file('config', None, 'Path to a configs/*.py file (its data section is used).')
  flags.DEFINE_string('workdir', None, 'The run directory; the data go to WORKDIR/data, where main reads them.')
  flags.DEFINE_integer('workers', 1, 'Beam worker processes on this machine; 0: no Beam, one process.')
  flags.DEFINE_bool('skip_bad_files', False, 'Leave out input files with a non-UTF-8 or unreadable line '
                    '(listed in the report) instead of stopping.')
  flags.DEFINE_string('beam_args', '', 'Beam pipeline options for a cluster runner, e.g. '
                      '"--runner=FlinkRunner --flink_master=host:8081 --environment_type=LOOPBACK".')
  flags.DEFINE_float('shard_mb', Options.shard_mb, 'MiB of plain text per shard (a compressed file is one shard).')
  flags.DEFINE_integer('shard_pairs', Options.shard_pairs, 'Translation: sentence pairs per shard.')
  flags.DEFINE_integer('chunk_tokens', Options.chunk_tokens, 'Tokens per array_record record.')
  flags.DEFINE_integer('sentencepiece_sample_lines', Options.sentencepiece_sample_lines,
                       'sentencepiece trains on a seeded sample of at most this many train lines.')
  flags.DEFINE_integer('batch_lines', Options.batch_lines, 'Lines a worker tokenizes at once (bounds its memory).')
  flags.mark_flags_as_required(['config', 'workdir'])


def run() -> None:
  """Runs the command on the flags of :func:`define_flags` (exit status 2 and one line on a user error)."""
  cli.run_app(main)
