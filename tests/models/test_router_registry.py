"""The router registry: no router name branched on outside models/, the losses it names, the post-update hook."""
import jax.numpy as jnp
import numpy as np
import pytest

from stablemoe_jax.core.settings import ModelSettings, typed
from stablemoe_jax.models import routers
from stablemoe_jax.models.routing import STATS, layer_stats
from tests.models.topk_reference import init_layer, moe_config


# --- the registry: every router fact outside models/ comes from it --------------------------------------------------

def test_nothing_outside_models_branches_on_a_router_name():
  # A router's name as a string literal appears outside models/ only in the comparison's table of methods (config
  # values, as on the command line); any other use (a comparison, a dict keyed by names) would be a branch.
  import pathlib
  import re
  root = pathlib.Path(routers.__file__).parents[1]
  names = "|".join(sorted(routers.ROUTERS))
  pattern = re.compile(rf"""["']({names})["']""")
  found = []
  for path in sorted(root.rglob("*.py")):
    relative = path.relative_to(root).as_posix()
    if relative.startswith(("models/", "core/settings/")) or relative == "compare/methods.py":  # config values
      continue
    found += [f"{relative}:{n}: {line.strip()}" for n, line in enumerate(path.read_text().splitlines(), 1)
              if pattern.search(line)]
  assert found == []


@pytest.mark.parametrize("router, settings", [("stablemoe", {}), ("switch", {"top_k": 2, "z_loss_weight": 1e-3}),
                                              ("hash", {})])
def test_returned_losses_are_those_the_registry_names(router, settings):
  cfg = moe_config(router=router)
  for key, value in settings.items():
    cfg[router][key] = value
  layer, params, x, ids = init_layer(cfg)
  _, sown = layer.apply({"params": params}, x, ids, jnp.array(True), deterministic=False, mutable=[STATS])
  names = set(layer_stats(sown)[""].losses.present())
  assert names <= set(routers.ROUTERS[router].losses)
  assert ("balance" in names) == (router != "hash")


def test_post_update_hook_comes_from_the_registry():
  from configs import default
  config = default.get_config()
  # the default's cosine router holds no norm
  assert routers.post_update_hook(typed(ModelSettings, config.model)) is None
  config.model.moe.stablemoe.cosine_expert_norm = 1.5
  hook = routers.post_update_hook(typed(ModelSettings, config.model))
  params = {"moe_0": {"router": {"centroids": jnp.ones((4, 16))}}, "embed": {"embedding": jnp.ones((3, 2))}}
  out = hook(params)
  np.testing.assert_allclose(np.linalg.norm(out["moe_0"]["router"]["centroids"], axis=-1), 1.5, rtol=1e-6)
  np.testing.assert_array_equal(out["embed"]["embedding"], params["embed"]["embedding"])
  config.model.moe.router = "hash"
  assert routers.post_update_hook(typed(ModelSettings, config.model)) is None
