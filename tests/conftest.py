"""Shared fixtures: the real corpora in ../shared/data and a tiny, fast config."""
from __future__ import annotations

import fcntl
import os
import pathlib
import shutil
import sys
import tempfile

import ml_collections
import pytest

from configs import default

REPO = pathlib.Path(__file__).resolve().parents[1]
MAIN = [sys.executable, "-m", "stablemoe_jax.main", "--config", "configs/default.py"]  # run from REPO
SHARED_DATA = pathlib.Path(os.environ.get("STABLEMOE_DATA_DIR") or
                           pathlib.Path(__file__).resolve().parents[2] / "shared" / "data").resolve()


_CACHE_OWNER = "STABLEMOE_TESTS_XLA_CACHE_PID"  # set with the cache folder that pytest_configure made
# The tests' programs are tiny, so XLA's CPU compile costs far more than running them: LLVM at -O0 halves it (the
# tiny config's train step: 10.5 s -> 5.2 s) and runs the CPU default's model 1.75x slower, which only
# test_balance_scope's 60 steps of the default model would feel (it starts a process without it).
FAST_COMPILE_FLAG = "--xla_backend_optimization_level=0"


def xla_flags(cpu_devices: int | None = None) -> str:
  """XLA_FLAGS for a test's subprocess: this session's (the fast compile), plus ``cpu_devices`` CPU devices."""
  flags = os.environ.get("XLA_FLAGS", "")
  return f"{flags} --xla_force_host_platform_device_count={cpu_devices}".strip() if cpu_devices else flags


def jit_init(module, seed: int, *inputs, **kwargs):
  """``module.init(jax.random.key(seed), *inputs, **kwargs)`` compiled as one XLA program. Run eagerly, Flax
  compiles every op of a model as a program of its own: two eager inits of the tiny encoder-decoder took 43 s of
  the brute-force beam test's 100 s (cProfile, shared cores). ``kwargs`` are Python values, fixed at trace time.
  The parameter dict comes back sorted by name, not in Flax's call order."""
  import jax  # here, not at the top: pytest_configure sets XLA_FLAGS before any test touches a backend
  return jax.jit(lambda key, *xs: module.init(key, *xs, **kwargs))(jax.random.key(seed), *inputs)


def _use_fast_compile():
  """Sets the fast-compile flag and caches every compiled program (JAX's default skips those under 1 s, most of
  the tests'), in this process and, through the environment, in the processes the tests start."""
  if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE_FLAG}".strip()
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


def pytest_configure(config):
  """One persistent XLA compilation cache per pytest process (each xdist worker its own folder, removed at the end).

  Many tests compile the same programs again: a run and its resumption, a kill -9 and the rerun, every test of the
  tiny config. Tracing and lowering still happen each time (so do the checks and warnings made there); only XLA's
  compile of an identical program is read back from disk. The variable passes it on to the subprocesses the tests
  start, so a CLI rerun reuses what the killed run compiled. A JAX_COMPILATION_CACHE_DIR set outside the tests is
  used as is (and kept); JAX_ENABLE_COMPILATION_CACHE=false turns the cache off.

  The workers' folders are separate because JAX writes an entry in place (no lock without ``filelock``): a worker
  could read another's half-written entry. xdist's controller runs no test and makes none.
  """
  _use_fast_compile()
  if os.environ.get("JAX_COMPILATION_CACHE_DIR") and not os.environ.get(_CACHE_OWNER):
    return
  if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
    return  # xdist's controller: the workers start from its environment
  worker = getattr(config, "workerinput", {}).get("workerid", "main")
  config._xla_cache_dir = tempfile.mkdtemp(prefix=f"stablemoe_jax_xla_cache_{worker}_")
  os.environ["JAX_COMPILATION_CACHE_DIR"], os.environ[_CACHE_OWNER] = config._xla_cache_dir, str(os.getpid())
  import jax  # pylint: disable=import-outside-toplevel
  jax.config.update("jax_compilation_cache_dir", config._xla_cache_dir)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def pytest_unconfigure(config):
  if getattr(config, "_xla_cache_dir", None):
    shutil.rmtree(config._xla_cache_dir, ignore_errors=True)
    os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)
    os.environ.pop(_CACHE_OWNER, None)


# A slow test (over ~20 s) counts as this many fast ones when the test files are ordered heaviest first.
SLOW_WEIGHT = 30
# Files that share one session fixture trained under a lock (mt_shared_run): one unit of work, so that one worker
# trains it and uses it for both instead of the other worker waiting on the lock meanwhile.
# The files of tests/data/ that read its conftest's ``ptb`` (one tokenization of PTB into TFDS records) likewise.
SHARED_UNITS = {"tests/analysis/test_translation_analysis.py": "mt_shared_run",
                "tests/compare/test_translation_compare.py": "mt_shared_run",
                **{f"tests/data/{name}.py": "ptb_records"
                   for name in ("common/test_tokenizers", "common/test_locate", "test_download", "lm/test_builder",
                                "lm/test_stream_blocks", "lm/test_prepared_data", "lm/test_own_corpora")}}


def _unit(nodeid: str) -> str:
  """The unit of work a test belongs to under ``-n N``: its file, or its group in SHARED_UNITS."""
  module = nodeid.split("::", 1)[0]
  return SHARED_UNITS.get(module, module)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
  """``-n N`` (xdist's default, ``--dist load``): whole test files to a worker, the heaviest first (see
  ``pytest_collection_modifyitems``). A file's module fixtures (the expert-parallel layouts, the resharded runs, the
  uninterrupted run of test_train) are then built once, never once per worker, and the last files to run are quick
  ones, so a worker does not sit idle while the other finishes a long test. Another ``--dist`` is left alone."""
  if config.getvalue("dist") != "load":
    return None
  from xdist.scheduler import LoadScopeScheduling  # pylint: disable=import-outside-toplevel

  class FileScheduling(LoadScopeScheduling):
    """xdist's file-by-file scheduling (``--dist loadfile``), with SHARED_UNITS' files together."""

    def _split_scope(self, nodeid: str) -> str:
      return _unit(nodeid)

  config.option.loadscopereorder = False  # keep the order of pytest_collection_modifyitems, not by test count
  return FileScheduling(config, log)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
  """Units of work (``_unit``) heaviest first (a slow test counts SLOW_WEIGHT, others 1), the tests of each in their
  collected order. Runs after ``-m``/``-k`` deselection, so the weights are those of the tests that will run."""
  del config
  weight, first = {}, {}
  for index, item in enumerate(items):
    unit = _unit(item.nodeid)
    weight[unit] = weight.get(unit, 0) + (SLOW_WEIGHT if item.get_closest_marker("slow") else 1)
    first.setdefault(unit, index)
  items.sort(key=lambda item: (-weight[_unit(item.nodeid)], first[_unit(item.nodeid)]))  # stable sort


@pytest.fixture(scope="session")
def ptb_dir() -> pathlib.Path:
  if not (SHARED_DATA / "ptb" / "ptb.train.txt").is_file():
    pytest.fail(f"Penn Treebank not found under {SHARED_DATA}; set STABLEMOE_DATA_DIR to the shared data folder.")
  return SHARED_DATA


def make_tiny_config(data_dir: pathlib.Path):
  """The default config shrunk to seconds per run: 2 blocks, d=32, 4 experts, 4 x 16 tokens a step."""
  config = default.get_config()
  config.data.data_dir = str(data_dir)
  model = config.model
  model.d_model, model.num_heads, model.num_layers, model.d_ff, model.max_len = 32, 2, 2, 64, 16
  model.dropout = 0.1
  model.moe.num_experts, model.moe.sublayers_per_expert = 4, 2
  model.moe.distilled_router.dim = 8
  train = config.train
  train.steps, train.stage1_steps, train.warmup_steps = 12, 5, 2
  train.batch_size, train.seq_len = 4, 16
  train.learning_rate = 3e-3
  train.log_every, train.eval_every, train.eval_batches = 2, 6, 2
  train.checkpoint_every, train.keep_checkpoints = 4, 10
  config.eval.batch_size, config.eval.seq_len = 64, 16
  # The final evaluations score each split's first 4 batches (4,096 tokens): the whole of PTB's valid and test
  # splits through the 10,000-word softmax would be most of a tiny run's time.
  config.eval.max_batches, config.health.contribution_batches = 4, 4
  # 12 steps of a tiny model leave a layer worth well under the verdict's 1% (0.6-0.8% measured): a tiny run's layer
  # is dead only when removing it helps. The tests of the verdict set their own threshold.
  config.health.min_contribution = 0.0
  # No routing records or analysis report (a tiny run's slowest extra, ~5 s): the tests of the analysis turn them on.
  config.analysis.record_every, config.analysis.report_at_end = 0, False
  return config


@pytest.fixture
def tiny_config(ptb_dir):
  return make_tiny_config(ptb_dir)


@pytest.fixture(scope="session")
def prepared_ptb(ptb_dir, tmp_path_factory) -> pathlib.Path:
  """PTB tokenized once per pytest process (word tokenizer, the tiny config's data settings), for
  ``share_prepared_ptb``, with each split's stream saved flat (`stream.cached_records`). Each xdist worker prepares
  its own: its runs use it one at a time."""
  from stablemoe_jax.core.settings import from_config  # pylint: disable=import-outside-toplevel
  from stablemoe_jax.data.lm.pipeline import load_lm_data  # pylint: disable=import-outside-toplevel
  directory = tmp_path_factory.mktemp("prepared_ptb") / "data"
  data = load_lm_data(from_config(make_tiny_config(ptb_dir)).data, directory)
  for split in data.sources:  # saves each split's flat stream beside its records: the runs load it, parse nothing
    data.stream(split)
  return directory


def share_prepared_ptb(prepared: pathlib.Path, *workdirs: pathlib.Path) -> None:
  """Points each ``workdir/data`` at ``prepared`` (``prepared_ptb``), as the comparison runner shares one corpus
  between its runs: a run of the default data settings then reuses the tokenizer and records (~3.5 s a run)."""
  for workdir in map(pathlib.Path, workdirs):
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "data").symlink_to(prepared, target_is_directory=True)


def train_tiny_run(tiny_config, prepared: pathlib.Path, workdir: pathlib.Path, router: str):
  """Trains ``tiny_config`` with ``router`` for 4 steps (2 in stage 1) into ``workdir``, on the shared ``prepared``
  corpus, checkpointed at steps 2 and 4; returns the config it trained."""
  from stablemoe_jax.experiment import loop  # pylint: disable=import-outside-toplevel
  config = ml_collections.ConfigDict(tiny_config.to_dict())
  config.model.moe.router = router
  config.train.steps, config.train.stage1_steps, config.train.checkpoint_every = 4, 2, 2
  share_prepared_ptb(prepared, workdir)
  loop.train_and_evaluate(config, workdir)
  return config


def tiny_flags(steps: int, stage1_steps: int, warmup_steps: int, log_every: int, checkpoint_every: int) -> list[str]:
  """Command-line overrides that shrink configs/default.py to a tiny model, as a user would type them."""
  return ["--config.model.d_model=32", "--config.model.num_heads=2", "--config.model.num_layers=2",
          "--config.model.d_ff=64", "--config.model.max_len=16", "--config.model.moe.num_experts=4",
          f"--config.train.steps={steps}", f"--config.train.stage1_steps={stage1_steps}",
          f"--config.train.warmup_steps={warmup_steps}", "--config.train.batch_size=4",
          "--config.train.seq_len=16", "--config.eval.seq_len=16", f"--config.train.log_every={log_every}",
          "--config.train.eval_every=1000", f"--config.train.checkpoint_every={checkpoint_every}",
          "--config.eval.max_batches=4", "--config.health.contribution_batches=4", "--config.health.min_contribution=0",
          "--config.analysis.record_every=0", "--config.analysis.report_at_end=False"]


@pytest.fixture(scope="session")
def mt_shared_run(tmp_path_factory) -> pathlib.Path:
  """The comparison folder of one tiny StableMoE translation run (``mt_fixtures.shared_run_config``), trained once
  per test run: xdist's workers share it through their common temporary folder and a lock, so whichever needs it
  first trains it and the other waits. Read it only; ``mt_fixtures.copy_shared_run`` gives a test its own copy."""
  from tests.mt_fixtures import train_shared_run  # pylint: disable=import-outside-toplevel (it imports this module)
  if not os.environ.get("PYTEST_XDIST_WORKER"):
    return train_shared_run(tmp_path_factory.getbasetemp() / "mt_shared_run")
  root = tmp_path_factory.getbasetemp().parent  # shared by the workers of this run
  with open(root / "mt_shared_run.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
      return train_shared_run(root / "mt_shared_run")
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)
