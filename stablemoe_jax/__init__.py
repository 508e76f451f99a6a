"""stablemoe_jax: StableMoE (Dai et al., ACL 2022) and the MoE routers it is compared with, in JAX/Flax."""
