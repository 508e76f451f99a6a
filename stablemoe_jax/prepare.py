"""Entry point: ``python -m stablemoe_jax.prepare --config CONFIG --workdir DIR [--workers N]``: corpora at any size.

The command beside ``main``, above the layers: its flags, the config check and the user errors of every entry point
(``cli``). A language-model config is prepared by ``data/prepare/lm.py``, a translation config
(``config.task = "translation"``) by ``data/prepare/translation.py``; both take the config's typed ``data`` section
and write into ``DIR/data``, where ``python -m stablemoe_jax.main`` then reads them.
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

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Path to a configs/*.py file (its data section is used).')
_WORKDIR = flags.DEFINE_string('workdir', None,
                                'The run directory; the data go to WORKDIR/data, where main reads them.')
_WORKERS = flags.DEFINE_integer('workers', 1, 'Beam worker processes on this machine; 0: no Beam, one process.')
_SKIP_BAD_FILES = flags.DEFINE_bool('skip_bad_files', False, 'Leave out input files with a non-UTF-8 or unreadable '
                                    'line (listed in the report) instead of stopping.')
_BEAM_ARGS = flags.DEFINE_string('beam_args', '', 'Beam pipeline options for a cluster runner, e.g. '
                                 '"--runner=FlinkRunner --flink_master=host:8081 --environment_type=LOOPBACK".')
_SHARD_MB = flags.DEFINE_float('shard_mb', Options.shard_mb,
                               'MiB of plain text per shard (a compressed file is one shard).')
_SHARD_PAIRS = flags.DEFINE_integer('shard_pairs', Options.shard_pairs, 'Translation: sentence pairs per shard.')
_CHUNK_TOKENS = flags.DEFINE_integer('chunk_tokens', Options.chunk_tokens, 'Tokens per array_record record.')
_SAMPLE_LINES = flags.DEFINE_integer('sentencepiece_sample_lines', Options.sentencepiece_sample_lines,
                                     'sentencepiece trains on a seeded sample of at most this many train lines.')
_BATCH_LINES = flags.DEFINE_integer('batch_lines', Options.batch_lines,
                                    'Lines a worker tokenizes at once (bounds its memory).')
flags.mark_flags_as_required(['config', 'workdir'])


def main(argv: list[str]) -> None:
  del argv
  options = Options(_SHARD_MB.value, _SHARD_PAIRS.value, _CHUNK_TOKENS.value, _SAMPLE_LINES.value, _BATCH_LINES.value,
                    _WORKERS.value, _SKIP_BAD_FILES.value, _BEAM_ARGS.value)
  config, prepared_dir = _CONFIG.value, pathlib.Path(_WORKDIR.value) / 'data'
  translation = task_name(config) == 'translation'
  if translation:
    validate_config(config)  # Before any work: the config main will be run with (pairs, files' globs, ...).
  data = settings_lib.from_config(config).data  # the command's edge: its config typed once
  report = (prepare_translation if translation else lm_prepare).prepare(data, prepared_dir, options)
  print(json.dumps(report))


def run() -> None:
  """Runs the command (exit status 2 and one line on a user error)."""
  cli.run_app(main)


if __name__ == '__main__':
  run()
