"""Run by tests/decoding/test_decoding_devices.py in a subprocess with 4 CPU devices.

The tiny translation model (random, peaked parameters) decodes 7 sources with beam 3 on one device, and split over
the 4 devices of a (data 2, expert 2) mesh with the parameters sharded over the mesh as a run could leave them. Writes ``OUT/decoded.npz`` for the test to compare.
"""
from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from tests.mt_fixtures import tiny_model_config  # noqa: E402

from stablemoe_jax.decoding.translator import make_translate_fn  # noqa: E402
from stablemoe_jax.models.seq2seq import TransformerSeq2Seq  # noqa: E402
from stablemoe_jax.parallel import mesh as mesh_lib  # noqa: E402
from stablemoe_jax.core.settings import ModelSettings, typed


def main(out: str) -> None:
  assert jax.device_count() == 4, jax.devices()
  config = tiny_model_config(vocab_size=40).model
  rng = np.random.default_rng(0)
  source = np.zeros((7, 10), np.int32)  # 7 sentences: not a multiple of 4 devices
  for row, length in enumerate([3, 9, 5, 1, 7, 4, 8]):
    source[row, :length] = rng.integers(4, 40, size=length)
    source[row, length] = 3  # eos
  params = TransformerSeq2Seq(typed(ModelSettings, config)).init(jax.random.key(1), jnp.asarray(source), jnp.asarray(source),
                                           jnp.array(True))["params"]
  params = {**params, "embed": {"embedding": params["embed"]["embedding"] * 6.0}}
  results = {}
  for beam, layouts in ((3, (("data2_expert2", 2),)),):
    results[f"one_device/beam{beam}"] = make_translate_fn(typed(ModelSettings, config), beam, 12)(params, source)
    for name, expert in layouts:
      mesh = mesh_lib.make_mesh(ml_collections.ConfigDict({"expert": expert}))
      placed = params
      if expert > 1:  # leaves whose first dimension splits 4 ways are split over every device
        placed = jax.tree.map(lambda p: jax.device_put(p, NamedSharding(
            mesh, PartitionSpec(tuple(mesh.axis_names)) if p.shape and p.shape[0] % 4 == 0 else PartitionSpec())),
                              params)
        assert any(len(leaf.sharding.device_set) == 4 and not leaf.sharding.is_fully_replicated
                   for leaf in jax.tree.leaves(placed))
      results[f"{name}/beam{beam}"] = make_translate_fn(typed(ModelSettings, config), beam, 12, mesh=mesh)(placed, source)
  np.savez(f"{out}/decoded.npz", **{f"{k}/{part}": np.asarray(v[i]) for k, v in results.items()
                                   for i, part in enumerate(("tokens", "scores"))})


if __name__ == "__main__":
  main(sys.argv[1])
