"""Finding the raw corpus files on disk.

Nothing here downloads: a missing corpus is an error whose message says where
the files were expected and how to point the run at them (or fetch PTB with
`python -m stablemoe_jax.data.download --dest DIR` on a machine with internet).

Layouts accepted (splits are always named 'train', 'valid', 'test'):

* corpus 'ptb':  `DIR/ptb/ptb.{split}.txt` or `DIR/ptb.{split}.txt`
* corpus 'text': `DIR/{split}.txt` (a user's own plain-text corpus, one
  sentence per line)
"""

from __future__ import annotations

import os
import pathlib

from stablemoe_jax.core.errors import DataError, DataNotFoundError  # noqa: F401  (raised here; re-exported)

ENV_VAR = 'STABLEMOE_DATA_DIR'
SPLITS = ('train', 'valid', 'test')
CORPORA = ('ptb', 'text')


def _how_to_fix(corpus: str) -> str:
  lines = [
      'Set the location with --config.data.data_dir=DIR or the environment '
      f'variable {ENV_VAR}=DIR.'
  ]
  if corpus == 'ptb':
    lines.append(
        'On a machine with internet, `python -m stablemoe_jax.data.download '
        '--dest DIR` fetches PTB into DIR/ptb/.'
    )
  return ' '.join(lines)


def _candidates(data_dir: pathlib.Path, corpus: str) -> list[dict[str, pathlib.Path]]:
  """The layouts accepted for `corpus`, most specific first."""
  if corpus == 'ptb':
    return [
        {s: data_dir / 'ptb' / f'ptb.{s}.txt' for s in SPLITS},
        {s: data_dir / f'ptb.{s}.txt' for s in SPLITS},
    ]
  if corpus == 'text':
    return [{s: data_dir / f'{s}.txt' for s in SPLITS}]
  raise ValueError(f'Unknown corpus {corpus!r}; allowed: {", ".join(CORPORA)}.')


def expected_files(corpus: str) -> str:
  """Human-readable list of the file names a corpus needs, e.g. for errors."""
  layouts = _candidates(pathlib.Path('DIR'), corpus)
  return ' or '.join(
      ', '.join(str(p.relative_to('DIR')) for p in layout.values())
      for layout in layouts
  )


def corpus_files(data_dir: os.PathLike | str, corpus: str) -> dict[str, pathlib.Path]:
  """Maps split name ('train', 'valid', 'test') to that split's text file.

  Raises:
    ValueError: unknown corpus.
    DataNotFoundError: no accepted layout has all three files under data_dir.
  """
  data_dir = pathlib.Path(data_dir)
  layouts = _candidates(data_dir, corpus)
  for layout in layouts:
    if all(p.is_file() for p in layout.values()):
      return dict(layout)
  missing = [str(p) for p in layouts[0].values() if not p.is_file()]
  raise DataNotFoundError(
      f'Corpus {corpus!r} not found in {data_dir}: expected '
      f'{expected_files(corpus)} (missing: {", ".join(missing)}). '
      + _how_to_fix(corpus)
  )


def resolve_data_dir(configured: str | os.PathLike, corpus: str = 'ptb') -> pathlib.Path:
  """Returns the raw-corpus directory: `configured` if non-empty, else $STABLEMOE_DATA_DIR.

  The directory must hold the files of `corpus` (see `corpus_files`).

  Raises:
    DataNotFoundError: nothing configured, the directory does not exist, or
      the corpus files are missing; the message names the expected files and
      how to set the location.
  """
  configured = os.fspath(configured) if configured else ''
  source = 'config.data.data_dir'
  if not configured:
    configured = os.environ.get(ENV_VAR, '')
    source = f'${ENV_VAR}'
  if not configured:
    raise DataNotFoundError(
        f'No data directory given for corpus {corpus!r}: config.data.data_dir '
        f'is empty and {ENV_VAR} is not set. Expected files: '
        f'{expected_files(corpus)}. ' + _how_to_fix(corpus)
    )
  data_dir = pathlib.Path(configured).expanduser()
  if not data_dir.is_dir():
    raise DataNotFoundError(
        f'Data directory {data_dir} (from {source}) does not exist. Expected '
        f'files: {expected_files(corpus)}. ' + _how_to_fix(corpus)
    )
  corpus_files(data_dir, corpus)  # Raises if files are missing.
  return data_dir
