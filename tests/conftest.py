"""Shared test set-up: 8 fake CPU devices, fp32 matmuls, paths to ../shared.

XLA_FLAGS must be set before JAX is first imported, so this runs at collection time.
"""

import json
import os
import pathlib
import time

# 8 fake CPU devices for meshes; cheaper compiles because tests compile far more than they run:
# cheaper LLVM passes, and XLA:CPU's older elemental emitters for fusions instead of the MLIR
# fusion emitters (a third less time on the compile-bound tests, measured in docs/testing.md;
# the numerics tests hold either way). An exported XLA_FLAGS keeps its other flags, but its
# device count is replaced: the mesh tests need exactly 8.
_DEVICE_FLAG = "--xla_force_host_platform_device_count="
_TEST_FLAGS = {_DEVICE_FLAG: "8", "--xla_backend_optimization_level=": "0",
               "--xla_llvm_disable_expensive_passes=": "true", "--xla_cpu_use_fusion_emitters=": "false"}


def _xla_flags(existing: str) -> str:
  flags = existing.split()
  present = {f.split("=")[0] + "=" for f in flags}
  flags = [f for f in flags if not f.startswith(_DEVICE_FLAG)]
  flags += [k + v for k, v in _TEST_FLAGS.items() if k == _DEVICE_FLAG or k not in present]
  return " ".join(flags)


os.environ["XLA_FLAGS"] = _xla_flags(os.environ.get("XLA_FLAGS", ""))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # keep TensorFlow off any GPU

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED = pathlib.Path(os.environ.get("ST5_SHARED_DIR", REPO.parent / "shared"))
os.environ.setdefault("ST5_DATA_DIR", str(SHARED / "data"))
os.environ.setdefault("ST5_VOCAB", str(SHARED / "data" / "t5_spiece" / "spiece.model"))

import jax  # noqa: E402
import pytest  # noqa: E402

# Reference comparisons at 1e-5 need true fp32 matmuls on every backend.
jax.config.update("jax_default_matmul_precision", "highest")
# Identical programs recur across tests (and test processes): reuse their executables.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / "st5_jax_test_xla_cache"))
jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)

DATA_DIR = pathlib.Path(os.environ["ST5_DATA_DIR"])
FIXTURES_DIR = SHARED / "fixtures"
VOCAB = os.environ["ST5_VOCAB"]


def _require(path: pathlib.Path) -> pathlib.Path:
  # Fail, never skip: CI has ../shared, so its absence is a broken set-up.
  if not path.exists():
    raise FileNotFoundError(f"{path} is missing; tests read ../shared (set ST5_SHARED_DIR to relocate it).")
  return path


@pytest.fixture(scope="session")
def data_dir() -> pathlib.Path:
  return _require(DATA_DIR)


@pytest.fixture(scope="session")
def fixtures_dir() -> pathlib.Path:
  return _require(FIXTURES_DIR)


@pytest.fixture(scope="session")
def vocab_path() -> str:
  return str(_require(pathlib.Path(VOCAB)))


@pytest.fixture(scope="session")
def gcs():
  """A GCS emulator on 127.0.0.1 that this process (and subprocesses given `gcs.env()`) use for gs://."""
  from gcs_emulator import GcsEmulator

  emulator = GcsEmulator()
  emulator.activate()
  yield emulator
  emulator.stop()


@pytest.fixture
def fresh_compiles():
  """Compile, never load, executables of multi-device steps (tests/test_consert.py, the objectives contract).

  With jaxlib 0.10.2 on CPU, a two-view step loaded from the persistent compilation cache
  sometimes deadlocks in an all-gather rendezvous (one fake device runs an independent
  collective first); freshly compiled, the same step never did (measured here).
  """
  from jax._src import compilation_cache  # pylint: disable=g-import-not-at-top

  before = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  compilation_cache.reset_cache()
  yield
  jax.config.update("jax_enable_compilation_cache", before)
  compilation_cache.reset_cache()


# The longest tests first (from `--durations` of CI runs, longest first): xdist hands tests
# out in collection order, so a long test collected late would run alone at the end.
LONGEST_FIRST = (
    "test_gin_and_launch.py::test_large_runs_fit_their_tpu_slice",
    "test_pod_rehearsal.py::",
    "test_beam_cache.py::test_training_from_a_beam_cache_sigtermed",
    "test_objectives_contract.py::test_it_compiles_for_a_tpu_topology",
    "test_train.py::test_sigterm_saves_and_resume_is_exact",
    "test_objectives_contract.py::test_it_saves_restores_continues_and_exports_its_tower",
    "test_faults_kill_multihost.py::",
    "test_consert_gin.py::test_consert_recipes_train_end_to_end",
    "test_consert.py::test_nt_xent_is_over_the_global_batch_across_two_processes",
    "test_multihost.py::",
    "test_seed_encoder.py::test_weak_decoder_reconstructs",
    "test_faults_kill.py::",
)


def _longest_first_rank(nodeid: str) -> int:
  for rank, pattern in enumerate(LONGEST_FIRST):
    if pattern in nodeid:
      return rank
  return len(LONGEST_FIRST)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  """With ST5_TEST_TIMELINE=FILE, each test's worker, start and end go to FILE (one JSON line each).

  `--durations` says how long tests took, not when: the timeline shows where a worker sat idle
  (tests/timeline.py summarises it; docs/testing.md).
  """
  del nextitem
  path = os.environ.get("ST5_TEST_TIMELINE")
  start = time.time()
  yield
  if path:
    row = {"worker": os.environ.get("PYTEST_XDIST_WORKER", "main"), "test": item.nodeid, "start": start,
           "end": time.time()}
    with open(path, "a", encoding="utf-8") as f:  # one short append per test: the workers' lines do not mix
      f.write(json.dumps(row) + "\n")


def pytest_collection_modifyitems(config, items):
  del config
  items.sort(key=lambda item: _longest_first_rank(item.nodeid))  # stable: the rest keep their order
