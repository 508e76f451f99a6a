"""Expert parallelism for translation: mesh.expert=2 on 2 fake CPU devices gives the single device's forward,
gradients, MoE metrics and three train steps (the tolerances of tests/parallel/test_expert_parallel.py)."""
from __future__ import annotations

import numpy as np
import pytest
from tests.parallel.test_expert_parallel import run_python


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
  out = tmp_path_factory.mktemp("mt_layouts")
  result = run_python(["tests/parallel/mt_ep_script.py", str(out)], devices=2, timeout=900)
  assert result.returncode == 0, result.stderr[-3000:]
  return np.load(out / "layouts.npz")


def _compare(arrays, prefix: str, rtol: float, atol: float) -> int:
  names = [k[len("one_device/"):] for k in arrays.files if k.startswith(f"one_device/{prefix}")]
  for name in names:
    np.testing.assert_allclose(arrays[f"expert2/{name}"], arrays[f"one_device/{name}"], rtol=rtol, atol=atol,
                               err_msg=name)
  return len(names)


@pytest.mark.slow
def test_translation_expert2_matches_one_device(layouts):
  arrays = layouts
  assert _compare(arrays, "logits", rtol=1e-5, atol=1e-5) == 1
  assert _compare(arrays, "grad", rtol=1e-5, atol=1e-6) > 20
  assert _compare(arrays, "params", rtol=1e-4, atol=2e-4) > 20
  assert _compare(arrays, "metrics", rtol=1e-5, atol=1e-6) > 3 * 4
  sown = [k for k in arrays.files if k.startswith("one_device/sown")]
  assert any("encoder_moe" in k for k in sown) and any("decoder_moe" in k for k in sown)
  assert _compare(arrays, "sown", rtol=1e-5, atol=1e-7) == len(sown)
  for name in [k for k in arrays.files if k.startswith("one_device/") and ("load" in k or "dropped" in k)]:
    np.testing.assert_array_equal(arrays[name.replace("one_device/", "expert2/")], arrays[name], err_msg=name)
  metrics = [k for k in arrays.files if k.startswith("one_device/metrics/0/")]
  assert any("encoder_moe" in k for k in metrics) and any("decoder_moe" in k for k in metrics), metrics
