"""Download without network: the checksums against shared/data's md5sums, and the one-line error."""
from __future__ import annotations

import shutil

import pytest

from stablemoe_jax.data import download
from stablemoe_jax.data.common import locate


# --- download (no network) -----------------------------------------------------


def test_download_md5s_match_shared_md5sums(shared_data):
  sums = {}
  for line in (shared_data / 'MD5SUMS').read_text().splitlines():
    md5, name = line.split()
    sums[name] = md5
  for split, md5 in download.PTB_MD5.items():
    assert sums[f'./ptb/ptb.{split}.txt'] == md5


def test_download_verifies_checksums_without_network(ptb_files, tmp_path, monkeypatch):
  fetched = []

  def local_fetch(url, dest):
    split = url.rsplit('ptb.', 1)[1].split('.')[0]
    fetched.append(split)
    shutil.copyfile(ptb_files[split], dest)

  monkeypatch.setattr(download, 'fetch', local_fetch)
  paths = download.download_ptb(tmp_path)
  assert sorted(fetched) == ['test', 'train', 'valid']
  assert paths == {s: tmp_path / 'ptb' / f'ptb.{s}.txt' for s in ('train', 'valid', 'test')}
  assert locate.corpus_files(tmp_path, 'ptb') == paths
  fetched.clear()
  download.download_ptb(tmp_path)  # Verified files are not fetched again.
  assert fetched == []

  def corrupt_fetch(url, dest):
    local_fetch(url, dest)
    with open(dest, 'ab') as f:
      f.write(b'corrupted')

  monkeypatch.setattr(download, 'fetch', corrupt_fetch)
  bad = tmp_path / 'bad'
  with pytest.raises(download.ChecksumError, match='md5'):
    download.download_ptb(bad)
  assert list((bad / 'ptb').iterdir()) == []  # Nothing left behind.


def test_download_without_network_is_one_line_and_nonzero(tmp_path, monkeypatch, capsys):
  def offline(url, timeout=None):
    raise download.urllib.error.URLError(OSError(-2, 'Name or service not known'))

  monkeypatch.setattr(download.urllib.request, 'urlopen', offline)
  assert download.main(['--dest', str(tmp_path)]) == 1
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1
  assert err.startswith('error: could not download https://') and 'ptb.train.txt' in err
  assert 'Name or service not known' in err
  assert list((tmp_path / 'ptb').iterdir()) == []  # No .part file left.
