"""`python -m stablemoe_jax.data.prepare --config CONFIG --workdir DIR [--workers N]`: the command's documented
name. The command itself (flags, config check, user errors) is ``stablemoe_jax/commands/prepare.py``, an entry
point above the layers; this file imports nothing else of the package, so the data layer knows no entry point and
no experiment."""
from absl import flags

from stablemoe_jax.commands import prepare

if __name__ == "__main__":
  prepare.define_flags()
  flags.adopt_module_key_flags(prepare)  # `--help` lists the command's flags, as when they were defined here
  prepare.run()
