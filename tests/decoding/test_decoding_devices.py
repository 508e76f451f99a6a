"""Decoding split over several devices (make_translate_fn with a mesh): the same hypotheses and scores as one
device, with the parameters sharded over the mesh and a sentence count that does not divide the devices."""
from __future__ import annotations

import numpy as np
import pytest
from tests.parallel.test_expert_parallel import run_python


@pytest.mark.slow
def test_decoding_over_four_devices_equals_one_device(tmp_path):
  result = run_python(["tests/decoding/decode_devices_script.py", str(tmp_path)], devices=4, timeout=900)
  assert result.returncode == 0, result.stderr[-3000:]
  arrays = np.load(tmp_path / "decoded.npz")
  tokens = arrays["one_device/beam3/tokens"]
  assert tokens.shape == (7, 12) and (tokens == 3).any(axis=1).all()  # every hypothesis ends (eos = 3)
  np.testing.assert_array_equal(arrays["data2_expert2/beam3/tokens"], tokens)
  np.testing.assert_allclose(arrays["data2_expert2/beam3/scores"], arrays["one_device/beam3/scores"], rtol=1e-5,
                             atol=1e-5)
  assert len(set(arrays["one_device/beam3/scores"].round(4))) >= 2  # the hypotheses' scores depend on the source
