"""Random-access example sources cut from a `TokenStream` (fairseq `sample_break_mode=none`).

Both sources ignore line boundaries: examples run across records (eos tokens
stay in the stream). Each example is a dict of 1-D arrays of length S:

    inputs  int32   [S]
    targets int32   [S]   (the next token of each input)
    weights float32 [S]   (1 = a real target, 0 = padding)

* `TrainBlocks`: block i is stream[i*S : i*S + S + 1] (consecutive blocks
  overlap by one token); inputs = block[:-1], targets = block[1:]. There are
  (N - 1) // S blocks for a stream of N tokens; the tail that does not fill a
  block is not used in that epoch.
* `EvalRows`: the stream's N - 1 predictions (inputs = stream[:-1], targets =
  stream[1:]) tiled in order by non-overlapping rows of S; the last row is
  padded with id `pad_id` and weight 0, and `num_padded_rows` optional extra
  all-padding rows let the rows fill whole batches.
"""

from __future__ import annotations

import numpy as np

from stablemoe_jax.data.lm.stream import TokenStream


class TrainBlocks:
  """Overlapping (seq_len + 1)-token blocks of a stream, as a random-access source."""

  def __init__(self, stream: TokenStream, seq_len: int):
    if seq_len < 1:
      raise ValueError(f'seq_len must be positive, got {seq_len}.')
    self._stream = stream
    self.seq_len = seq_len
    self._len = max(len(stream) - 1, 0) // seq_len
    if self._len == 0:
      raise ValueError(
          f'A stream of {len(stream)} tokens is too short for one block of '
          f'seq_len + 1 = {seq_len + 1} tokens.'
      )

  def __len__(self) -> int:
    return self._len

  def block_start(self, index: int) -> int:
    """Stream position of block `index`'s first input token."""
    return index * self.seq_len

  def __getitem__(self, index: int) -> dict[str, np.ndarray]:
    index = int(index)
    if not 0 <= index < self._len:
      raise IndexError(f'block {index} out of range [0, {self._len})')
    start = self.block_start(index)
    block = self._stream.read(start, start + self.seq_len + 1)
    return {
        'inputs': np.array(block[:-1], dtype=np.int32),
        'targets': np.array(block[1:], dtype=np.int32),
        'weights': np.ones(self.seq_len, dtype=np.float32),
    }


class SlidingEvalRows:
  """Overlapping windows of S inputs advancing by ``stride``, scoring every prediction once.

  Window k reads inputs stream[k*stride : k*stride + S] (targets shifted by one).
  Window 0 scores all its S predictions; window k >= 1 scores only its last
  ``stride`` positions, the predictions no earlier window scored, so each has at
  least S - stride tokens of context. The last window is padded (id ``pad_id``,
  weight 0) past the stream's end; ``num_padded_rows`` optional all-padding rows
  let the windows fill whole batches. ``stride == S`` gives `EvalRows`' rows.
  """

  def __init__(self, stream: TokenStream, seq_len: int, stride: int, num_padded_rows: int = 0, pad_id: int = 0):
    if seq_len < 1 or not 0 < stride <= seq_len:
      raise ValueError(f'Need seq_len >= 1 and 0 < stride <= seq_len, got seq_len={seq_len}, stride={stride}.')
    self._stream = stream
    self.seq_len = seq_len
    self.stride = stride
    self.pad_id = pad_id
    self.num_targets = max(len(stream) - 1, 0)
    beyond_first = max(self.num_targets - seq_len, 0)
    self.num_data_rows = (1 + -(-beyond_first // stride)) if self.num_targets else 0
    self._len = self.num_data_rows + num_padded_rows

  def __len__(self) -> int:
    return self._len

  def __getitem__(self, index: int) -> dict[str, np.ndarray]:
    index = int(index)
    if not 0 <= index < self._len:
      raise IndexError(f'window {index} out of range [0, {self._len})')
    s = self.seq_len
    inputs = np.full(s, self.pad_id, dtype=np.int32)
    targets = np.full(s, self.pad_id, dtype=np.int32)
    weights = np.zeros(s, dtype=np.float32)
    if index < self.num_data_rows:
      start = index * self.stride  # Input position of the window's first token.
      n = min(s, self.num_targets - start)
      tokens = self._stream.read(start, start + n + 1)
      inputs[:n] = tokens[:-1]
      targets[:n] = tokens[1:]
      first_scored = 0 if index == 0 else s - self.stride
      weights[first_scored:n] = 1.0
    return {'inputs': inputs, 'targets': targets, 'weights': weights}


class EvalRows(SlidingEvalRows):
  """Non-overlapping rows tiling every prediction of a stream exactly once, in order."""

  def __init__(self, stream: TokenStream, seq_len: int, num_padded_rows: int = 0, pad_id: int = 0):
    super().__init__(stream, seq_len, seq_len, num_padded_rows, pad_id)
