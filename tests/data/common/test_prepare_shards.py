"""Cutting raw text into shards (stablemoe_jax.data.common.shards): lines, compression, bad and empty input."""

from __future__ import annotations

import gzip

import pytest

from stablemoe_jax.data.common import shards
from stablemoe_jax.data.common import text

MESSY = ('\ufefffirst line\r\n\r\n  second  line \nthird\rfourth\r\n' + ''.join(f'line {i} ' + 'x' * (i % 13) + '\n'
                                                                           for i in range(300)) + 'last, no newline')


def _lines_of(specs) -> list[str]:
  return [line for spec in specs for batch in shards.iter_line_batches(spec, 7) for line in batch]


@pytest.mark.parametrize('shard_bytes', [1, 2, 5, 17, 64, 1000, 1 << 30])
def test_byte_range_shards_partition_the_lines_as_iter_lines_reads_them(tmp_path, shard_bytes):
  path = tmp_path / 'messy.txt'
  path.write_bytes(MESSY.encode())
  specs = shards.plan_split('train', [path], shard_bytes, 'settings')
  assert len(specs) == -(-path.stat().st_size // shard_bytes)
  assert _lines_of(specs) == list(text.iter_lines(path))


def test_compressed_inputs_are_one_shard_with_the_same_lines(tmp_path):
  import zstandard
  plain = tmp_path / 'a.txt'
  plain.write_bytes(MESSY.encode())
  (tmp_path / 'a.txt.gz').write_bytes(gzip.compress(MESSY.encode()))
  (tmp_path / 'a.txt.zst').write_bytes(zstandard.ZstdCompressor().compress(MESSY.encode()))
  for name in ('a.txt.gz', 'a.txt.zst'):
    specs = shards.plan_split('train', [tmp_path / name], 10, 's')
    assert len(specs) == 1 and specs[0].stop == -1
    assert _lines_of(specs) == list(text.iter_lines(plain))


def test_globs_expand_sorted_without_repeats_and_an_empty_glob_is_one_line(tmp_path):
  for name in ('b.txt', 'a.txt', 'c.gz'):
    (tmp_path / name).write_text('x\n')
  files = shards.expand_inputs(f'{tmp_path}/*.txt, {tmp_path}/a.txt,{tmp_path}/*.gz', 'data.train_files')
  assert [p.name for p in files] == ['a.txt', 'b.txt', 'c.gz']
  with pytest.raises(shards.EmptyInputError) as error:
    shards.expand_inputs(f'{tmp_path}/*.none', 'data.valid_files')
  assert str(error.value) == f"data.valid_files: '{tmp_path}/*.none' matches no file."
  with pytest.raises(shards.EmptyInputError, match='no input given'):
    shards.expand_inputs(' , ', 'data.test_files')


def test_a_non_utf8_line_names_the_file_and_its_line_in_a_later_shard(tmp_path):
  path = tmp_path / 'latin1.txt'
  lines = [f'sentence number {i}'.encode() for i in range(200)]
  lines[136] = 'se\u00f1or caf\u00e9'.encode('latin-1')
  path.write_bytes(b'\n'.join(lines) + b'\n')
  specs = shards.plan_split('train', [path], 500, 's')
  bad = [s for s in specs if s.start <= sum(len(x) + 1 for x in lines[:136]) < s.stop]
  assert len(bad) == 1 and bad[0].index > 2  # The line numbers must count the lines of the shards before.
  for spec in specs:
    if spec is bad[0]:
      with pytest.raises(text.BadCorpusError) as error:
        _lines_of([spec])
      assert f'{path}, line 137: byte 0xf1 at column 3 is not UTF-8' in str(error.value)
    else:
      _lines_of([spec])


def test_a_truncated_gzip_file_is_a_clear_error(tmp_path):
  path = tmp_path / 'cut.txt.gz'
  path.write_bytes(gzip.compress(MESSY.encode() * 50)[:-200])
  with pytest.raises(text.BadCorpusError, match=f'{path}: cannot be read after line'):
    _lines_of(shards.plan_split('train', [path], 10, 's'))


def test_shard_names_change_with_settings_input_and_range(tmp_path):
  path = tmp_path / 'a.txt'
  path.write_text('one\ntwo\nthree\n')
  names = lambda settings, size: [s.name for s in shards.plan_split('valid', [path], size, settings)]
  base = names('s', 4)
  assert base == names('s', 4) and all(n.startswith('valid-0000') for n in base)
  assert not set(base) & set(names('t', 4))
  assert not set(base) & set(names('s', 5))
  path.write_text('one\ntwo\nthree!\n')
  assert not set(base) & set(names('s', 4))
