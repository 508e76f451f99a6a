"""Every shell command the documentation gives (README.md, DEVELOPERS.md, docs/*.md, the launch scripts' usage lines;
``doc_commands``) runs here in a cheap form, or is listed in SKIPS with the reason it cannot.

The forms, cheapest first:
* every command that takes a config (``--config FILE[:ARG] --config.a.b=v ...``, also through a launch script) has
  its config loaded with its overrides exactly as ml_collections parses them and checked as the program checks it
  before any work (``validate_config``; a comparison builds and checks every method's config);
* every ``--flag`` of a command must be one its program lists in ``--helpfull`` / ``--help``;
* a launch on more than one device (``--cpu_devices``, ``XLA_FLAGS``, the launch scripts' process and device
  counts, SLURM's nodes x the script's GPUs per node) and every documented ``--mode=plan`` run as
  ``python -m stablemoe_jax.main ... --mode=plan --plan_devices=N``, which makes the launch's device checks (the
  planning process has 1 CPU device, so nothing compiles);
* (slow) the commands on the CPU presets (RUN_CONFIGS) run for real with the tiny model's overrides appended
  (``conftest.tiny_flags``, the translation twin of ``mt_fixtures.make_tiny_mt_config``), from a temporary folder:
  ``runs/...``, outputs and a copy of ``results/`` land there, never in the repository. Trainings run first, so a
  command on a workdir (eval, analyze, translate, sacrebleu on its output) finds it trained; ``--step=N`` names the
  tiny run's last checkpoint instead. Not run: the GPU-size presets (NOT_RUN), the launch scripts and Beam
  preparation (NOT_RUN_PROGRAMS), trainings that only change model.* or health.* values (``is_variant``), and a
  command whose tiny form repeats another's.


This module holds what the test files of the documented commands share (``test_documented_commands.py``: every
command run or skipped with its reason; ``test_documented_flags.py``, ``test_documented_plans.py`` and the slow
``test_documented_runs.py``): the command list's parsed form (``unwrap``, ``Launch``), the ``SKIPS`` / ``NOT_RUN`` /
``RUN_CONFIGS`` / ``NOT_RUN_PROGRAMS`` tables and the tiny forms, so one place says what runs, in which form, and why
the rest does not.
"""
from __future__ import annotations

import dataclasses
import pathlib
import re

from absl import flags
from tests.conftest import REPO, tiny_flags
from ml_collections import config_flags

from tests import doc_commands
from tests.doc_commands import Command


# (file, command): why it does not run here. The command is its text (``Command.text``) or its first words up to a
# space; only commands of that file match, so a new command elsewhere, or a changed one, is run or fails the test.
SKIPS = {
    ("README.md", "pip install -r requirements.txt"): "installs packages (network); test_packaging checks the file",
    ("DEVELOPERS.md", "pip install -r requirements.txt"): "installs packages (network); test_packaging checks the file",
    ("README.md", "STABLEMOE_DATA_DIR=../shared/data python -m pytest -n 2"): "the test suite itself",
    ("docs/layout.md", "STABLEMOE_DATA_DIR=../shared/data python -m pytest -n 2"): "the test suite itself",
    ("docs/layout.md", "STABLEMOE_DATA_DIR=../shared/data python -m pytest -n 2 -m 'not slow'"): "the test suite itself",
    ("DEVELOPERS.md", "python -m pytest -q -n 2 -m 'not slow'"): "the test suite itself",
    ("DEVELOPERS.md", "python -m pytest -q -n 2"): "the test suite itself",
    # DEVELOPERS.md's GPU-session recipes: wheels for the GPU image and a sweep on the GPU machine.
    ("DEVELOPERS.md", "echo /.whl/"): "edits .git/info/exclude (GPU-session setup)",
    ("DEVELOPERS.md", "for p in ml_collections"): "GPU-session setup: a shell loop over pip show",
    ("DEVELOPERS.md", "do"): "part of the shell loop above",
    ("DEVELOPERS.md", "done"): "part of the shell loop above",
    ("DEVELOPERS.md", "echo '$p==$(pip"): "part of the shell loop above",
    ("DEVELOPERS.md", "python3 -m pip download"): "downloads wheels (network)",
    ("DEVELOPERS.md", "pip wheel --no-deps promise==2.3 -w .whl"): "builds a wheel from PyPI (network)",
    ("DEVELOPERS.md", "python3 -m pip install -q --no-index"): "installs the carried wheels on the GPU machine",
    ("DEVELOPERS.md", "exit"): "part of the GPU machine's install line",
    ("DEVELOPERS.md", "mkdir -p /tmp/tune"): "GPU machine: copies a prepared corpus from .gpu/ (not in the clone)",
    ("DEVELOPERS.md", "cp -r .gpu/tune_data /tmp/tune/data"): "GPU machine: .gpu/ is not in the clone",
    ("DEVELOPERS.md", "tar czf '$OUT/tune.tgz'"): "GPU machine: archives its results for the device tool",
    ("docs/data.md", "python -m stablemoe_jax.data.download --dest DIR"): "downloads PTB (network)",
    ("docs/data.md", "python -m stablemoe_jax.prepare --config configs/lm_files.py:lm_base --workdir "
                     "/shared/runs/base ..."): "a Flink cluster; `...` stands for the file flags above it",
    ("docs/data.md", "'--beam_args=--runner=SparkRunner"): "a Spark cluster (flags of the command above)",
    ("docs/data.md", "'--beam_args=--runner=DataflowRunner"): "Google Cloud Dataflow (flags of the command above)",
    ("docs/speed.md", "bash benchmarks/gpu_suite.sh"): "the GPU suite: CUDA only",
    ("docs/speed.md", "python -m benchmarks.throughput --config configs/lm_base.py --steps 10"):
        "lm_base's shapes (GPU-size); tests/benchmarks/test_throughput.py runs the benchmark at CPU size",
    ("docs/speed.md", "python -m benchmarks.loss_agreement --steps 200"): "200 steps of several runs (minutes)",
    ("docs/speed.md", "python -m benchmarks.moe_layer --dispatchers index,grouped --capacity_factor 2.0"):
        "times each dispatcher 10 times at 4,096 tokens; its flags are checked",
    ("docs/speed.md", "python -m benchmarks.eval_cost"): "a timing benchmark; its flags are checked",
    ("docs/speed.md", "STABLEMOE_DATA_DIR=../shared/data python -m benchmarks.mt_step --workdir /work/runs/mt_step "
                      "--rounds 6 --steps 5"): "a timing benchmark (minutes of compiles and steps on the real pairs); "
                                               "its flags are checked, tests/data/translation/test_mt_packing.py checks the packing",
    ("docs/facts.md", "python -m benchmarks.facts_step --workdir runs/facts_step"):
        "a timing benchmark of the facts model's step (minutes); its numbers are in docs/facts.md",
    ("docs/speed.md", "python -m benchmarks.base_assignment"): "a timing benchmark at 16K tokens; flags checked",
    ("docs/speed.md", "python benchmarks/decode_speed.py --workdir runs/mt_stablemoe --sentences 1000"):
        "a timing benchmark on a trained translation run; its flags are checked",
    ("docs/gpu.md", "git clone REPOSITORY_URL stablemoe_jax"): "network; REPOSITORY_URL stands for this repository",
    ("docs/gpu.md", "cd stablemoe_jax"): "part of the clone line",
    ("docs/gpu.md", "pip install -e '.[cuda,beam]'"): "installs CUDA wheels (network, GPU); test_packaging checks the extras",
    ("docs/gpu.md", "python -c 'import jax; print(jax.devices())'"): "lists the GPUs: CUDA only",
    ("docs/gpu.md", "tensorboard --logdir /shared/runs/base/tensorboard"): "a server; tests/integration/test_train.py reads the "
                                                                           "metrics a run writes",
}
# Presets whose commands are checked (config, flags, and a plan on several devices) but not run: the slow tier trains
# only RUN_CONFIGS.
NOT_RUN = {
    "configs/lm_base.py": "the paper's base model (GPU-size; 16-19 s a step on 2 CPU cores)",
    "configs/lm_large.py": "the paper's large model (GPU-size)",
    "configs/lm_files.py:lm_base": "the paper's base model on your own corpus (GPU-size, files under /data)",
    "configs/mt_files.py": "your own parallel files under /data; tests/data/prepare/test_mt_files.py runs it on small files",
    "configs/mt_paper.py": "the paper's translation model (GPU-size)",
    "configs/tune_cpu.py": "the tuned sweep (87 runs); tests/compare/test_sweep.py runs a tiny one",
    "configs/tune_routers_cpu.py": "the routers-after-StableMoE sweep (20 new runs of 850 steps); "
                                    "tests/compare/test_sweep.py checks its grid and the committed runs it reuses",
    "configs/compare_cpu.py": "7-8 methods x seeds; tests/compare/test_compare.py runs the comparison",
    "configs/compare_mt_cpu.py": "8 translation methods; tests/compare/test_translation_compare.py runs the comparison",
    "configs/tune_mt_cpu.py": "the tuned translation comparison (32 runs of 1,000 steps); tests/compare/test_sweep.py runs a "
                              "tiny sweep and tests/compare/test_translation_compare.py a translation comparison",
    "configs/ablate_cpu.py": "the paper's Table 5 ablations, 3 seeds each (hours); tests/compare/test_compare.py runs the "
                             "comparison",
    "configs/lm_multi_cpu.py": "the multilingual LM probe, 3 methods x 2 seeds at the default's budget (hours); "
                               "tests/data/lm/test_lm_multi.py runs its commands on the tiny model",
    "configs/facts_cpu.py": "the facts regime (5,000 steps, ~10 min a run); tests/analysis/test_facts_probe.py trains "
                            "it tiny and checks the probe against a per-line loop",
    "configs/tune_facts_cpu.py": "the facts regime's tuned comparison (45 runs); tests/compare/test_facts_report.py "
                                 "reports tiny facts runs",
    "configs/xmoe_cpu.py": "X-MoE's routing as published against the default's, 6 runs (hours); tests/compare/test_sweep.py "
                           "runs a tiny sweep of the same shape",
}
PROGRAMS_WITH_CONFIG = ("stablemoe_jax.main", "stablemoe_jax.compare", "stablemoe_jax.compare.probe",
                        "stablemoe_jax.prepare", "benchmarks.router_geometry", "benchmarks.throughput",
                        "benchmarks.loss_agreement")
GPUS_PER_HOST = int(re.search(r"--gpus-per-node=(\d+)", (REPO / "launch/slurm.sbatch").read_text()).group(1))

# sentencepiece's vocabulary at 600 pieces: the stand-in for docs/data.md's own corpus is a slice of PTB
LM_TINY = [*tiny_flags(steps=4, stage1_steps=2, warmup_steps=1, log_every=2, checkpoint_every=2),
           "--config.data.sentencepiece_vocab_size=600"]
MT_TINY = ["--config.data.sentencepiece_vocab_size=600", "--config.data.bible_valid_books=Ruth",
           "--config.data.bible_test_books=Jonah", "--config.model.d_model=32", "--config.model.num_heads=2",
           "--config.model.num_layers=2", "--config.model.d_ff=64", "--config.model.max_len=32",
           "--config.model.moe.num_experts=4", "--config.model.moe.distilled_router.dim=8",
           "--config.train.steps=4", "--config.train.stage1_steps=2", "--config.train.warmup_steps=1",
           "--config.train.batch_size=8", "--config.train.seq_len=32", "--config.train.log_every=2",
           "--config.train.eval_every=1000", "--config.train.checkpoint_every=2", "--config.eval.batch_size=16",
           "--config.eval.seq_len=32", "--config.eval.max_sentences=16", "--config.analysis.record_every=0",
           "--config.analysis.report_at_end=False", "--config.health.contribution_batches=2"]
# The presets the slow tier trains, with the overrides that make them tiny; NOT_RUN says why the others do not.
RUN_CONFIGS = {"configs/default.py": LM_TINY, "configs/mt_cpu.py": MT_TINY}


@dataclasses.dataclass(frozen=True)
class Launch:
  """What a command runs, unwrapped from ``nice``, ``bash``, ``sbatch`` and the launch scripts: the Python program
  (module name or script path), its arguments, and the devices the launch gives it."""
  program: str
  args: tuple[str, ...]
  devices: int
  launcher: str = ""


def _xla_devices(env: dict) -> int:
  found = re.search(r"--xla_force_host_platform_device_count=(\d+)", env.get("XLA_FLAGS", ""))
  return int(found.group(1)) if found else 1


def unwrap(command: Command) -> Launch | None:
  """The program a command runs, or None for one this test does not know (then it must be in SKIPS)."""
  argv, env = list(command.argv), dict(command.env)
  if argv[:1] == ["nice"]:
    argv = argv[3:] if argv[1:2] == ["-n"] else argv[1:]
  if argv[:1] == ["bash"]:
    argv = argv[1:]
  if argv[:1] == ["sbatch"]:
    nodes = next((int(a.split("=")[1]) for a in argv if a.startswith("--nodes=")), 1)
    script = next(i for i, a in enumerate(argv) if a.startswith("launch/"))
    return Launch("stablemoe_jax.main", tuple(argv[script + 1:]), nodes * GPUS_PER_HOST, argv[script])
  if argv[:1] == ["launch/multihost.sh"]:
    return Launch("stablemoe_jax.main", tuple(argv[1:]), int(env["NUM_PROCESSES"]) * GPUS_PER_HOST, argv[0])
  if argv[:1] == ["launch/local_multiprocess.sh"]:
    processes, rest = int(argv[1]), argv[2:]
    per_process = int(env.get("DEVICES_PER_PROCESS", 1))
    if rest and rest[0].isdigit():
      per_process, rest = int(rest[0]), rest[1:]
    return Launch("stablemoe_jax.main", tuple(rest), processes * per_process, argv[0])
  if argv[:1] == ["launch/sweep_workers.sh"]:
    return Launch("stablemoe_jax.compare", ("--config", argv[1], "--workdir", argv[2], *argv[3:]), 1, argv[0])
  if argv[:2] in (["python", "-m"], ["python3", "-m"]):
    devices = next((int(a.split("=")[1]) for a in argv if a.startswith("--cpu_devices=")), _xla_devices(env))
    return Launch(argv[2], tuple(argv[3:]), devices)
  if argv[:1] == ["python"] and argv[1].endswith(".py"):
    return Launch(argv[1], tuple(argv[2:]), 1)
  if argv[:1] == ["sacrebleu"]:
    return Launch("sacrebleu", tuple(argv[1:]), 1)
  return None


def skip_reason(command: Command) -> str | None:
  file = command.source.split(":")[0]
  for (skip_file, text), reason in SKIPS.items():
    if skip_file == file and (command.text == text or command.text.startswith(text + " ")):
      return reason
  return None


def config_argv(args) -> list[str]:
  """The ``--config FILE`` and ``--config.*`` words of a command's arguments, in order."""
  out, args = [], list(args)
  for i, arg in enumerate(args):
    if arg == "--config":
      out += [arg, args[i + 1]]
    elif arg.startswith("--config=") or arg.startswith("--config.") or arg.startswith("--noconfig."):
      out.append(arg)
  return out


def config_file(args) -> str | None:
  words = config_argv(args)
  for i, arg in enumerate(words):
    if arg == "--config":
      return words[i + 1]
    if arg.startswith("--config="):
      return arg.split("=", 1)[1]
  return None


def load_config(args):
  """The config a program gets from these arguments, parsed by ml_collections as the program parses it."""
  argv = ["prog", *(str(REPO / a) if a.startswith("configs/") else a for a in config_argv(args))]
  values = flags.FlagValues()
  holder = config_flags.DEFINE_config_file("config", None, "", flag_values=values, sys_argv=argv)
  values(argv)
  return holder.value


def check_config(program: str, args) -> None:
  """Raises what the program would say about its config before doing any work."""
  from stablemoe_jax.compare import methods  # pylint: disable=import-outside-toplevel
  from stablemoe_jax.compare.comparison import Comparison  # pylint: disable=import-outside-toplevel
  from stablemoe_jax.experiment.config_validation import validate_config  # pylint: disable=import-outside-toplevel
  config = load_config(args)
  if program == "stablemoe_jax.compare":
    methods.method_configs(Comparison.of(config))
  elif program in ("stablemoe_jax.main", "stablemoe_jax.compare.probe", "benchmarks.router_geometry"):
    validate_config(config)


def launches():
  """(command, launch) of every documented command that is not skipped."""
  found = [(c, unwrap(c)) for c in doc_commands.documented_commands(REPO) if skip_reason(c) is None]
  return [(c, launch) for c, launch in found if launch is not None]  # the first test fails on the others


# ---- the slow tier: the CPU commands, run for real on the tiny model ------------------------------------------
NOT_RUN_PROGRAMS = {
    "stablemoe_jax.prepare": "Beam preparation; tests/data/prepare/test_prepare_*.py and test_mt_files.py run it",
    "stablemoe_jax.data.prepare.union_corpus": "writes the union corpus from the shared data (seconds, 24 MB); "
                                               "tests/data/lm/test_lm_multi.py runs it and checks its lines",
    "stablemoe_jax.analysis.plot": "needs three runs' routing records; tests/analysis/test_analysis.py plots real records",
    "launch/local_multiprocess.sh": "planned above; tests/parallel/test_parallel.py and test_multiprocess.py run the script",
    "launch/sweep_workers.sh": "the tuned sweep (87 runs); tests/compare/test_sweep.py runs a tiny sweep, "
                              "tests/integration/test_sweep_workers.py the script with a stand-in pass",
}
GERMAN = "Ein Mann fährt Fahrrad.\nZwei Hunde spielen im Schnee.\n"


def _rewrite(args, workspace: pathlib.Path) -> list[str]:
  """A command's arguments for the workspace: an absolute --workdir moved inside it, the placeholder corpus folder
  /data/mine a small text corpus."""
  out, args = [], list(args)
  for i, arg in enumerate(args):
    if i and args[i - 1] == "--workdir" and arg.startswith("/"):
      arg = str(workspace / arg.lstrip("/"))
    out.append(arg.replace("=/data/mine", f"={workspace / 'text_corpus'}"))
  return out


def _workdir(args) -> str | None:
  args = list(args)
  return args[args.index("--workdir") + 1] if "--workdir" in args else None


def _mode(args) -> str:
  return next((a.split("=", 1)[1] for a in args if a.startswith("--mode=")), "train")


def _normalized(args, workdir) -> tuple:
  """What a program does with these arguments: ``--name=value`` flags with the last value winning, the other
  words in order, the workdir left out."""
  flags_, words = {}, []
  for arg in args:
    if arg.startswith("--") and "=" in arg:
      name, value = arg.split("=", 1)
      flags_.pop(name, None)
      flags_[name] = value
    elif arg != workdir:
      words.append(arg)
  return tuple(words), tuple(flags_.items())


def is_variant(args, tiny) -> bool:
  """A training whose overrides, past those the tiny flags replace, change only model.* or health.* values: another
  router or baseline (docs/method.md), the paper's loss, the guard's stop. Its config is checked above; the tiny
  tier does not train it (each would cost a compile), as tests/integration/test_routers_training.py, test_moe.py,
  test_health_guard.py and test_translation_*.py train the routers, the dense baselines and the guard."""
  replaced = {flag.split("=", 1)[0] for flag in tiny}
  kept = [a.split("=", 1)[0] for a in args if a.startswith("--config.") and a.split("=", 1)[0] not in replaced]
  return bool(kept) and all(k.startswith(("--config.model.", "--config.health.")) for k in kept)


def tiny_form(launch: Launch) -> list[str] | None:
  """The arguments of a command's run on the tiny model, or None when the slow tier does not run it."""
  if launch.launcher or launch.program in NOT_RUN_PROGRAMS:
    return None
  tiny = RUN_CONFIGS.get(config_file(launch.args))
  if launch.program == "stablemoe_jax.main" and tiny is not None and _mode(launch.args) != "plan":
    if _mode(launch.args) == "train" and is_variant(launch.args, tiny):
      return None
    # --step=N names a checkpoint of the documented run: the tiny run's latest stands in
    return [a for a in launch.args if not a.startswith(("--cpu_devices=", "--step="))] + tiny
  if launch.program == "benchmarks.router_geometry":
    return [*launch.args, *LM_TINY, "--steps", "2", "--every", "1"]
  if launch.program == "stablemoe_jax.compare.probe":
    return [*launch.args, *LM_TINY, "--stop_at=2"]
  if launch.program == "stablemoe_jax.compare" and "--config.compare.report_only=True" in launch.args:
    return list(launch.args)
  if launch.program == "sacrebleu":
    return list(launch.args)
  return None


def tiny_runs(commands):
  """(runs, copies): the runs (command, program, args, env) of the commands the slow tier runs, every training
  first, duplicates (same program, same arguments once the tiny flags are appended, same devices; for an eval,
  analyze or translate also the same workdir) left out; ``copies``: (workdir, its duplicate's workdir), to copy
  once the trainings ran, so that a later command on the duplicate's workdir finds a trained run."""
  seen, runs, copies = {}, [], []
  for command, launch in commands:
    args = tiny_form(launch)
    if args is None:
      continue
    workdir = _workdir(args)
    on_a_run = launch.program == "stablemoe_jax.main" and _mode(args) != "train"
    key = (launch.program, _normalized(args, workdir), launch.devices, workdir if on_a_run else None)
    if key in seen:
      if workdir and workdir != seen[key]:
        copies.append((seen[key], workdir))
      continue
    seen[key] = workdir
    env = {"XLA_FLAGS": f"--xla_force_host_platform_device_count={launch.devices}"} if launch.devices > 1 else {}
    runs.append((command, launch.program, args, env))
  runs.sort(key=lambda run: not (run[1] == "stablemoe_jax.main" and _mode(run[2]) == "train"))
  return runs, copies
