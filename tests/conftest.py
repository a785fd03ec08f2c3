"""Shared test set-up: 8 fake CPU devices, fp32 matmuls, paths to ../shared.

XLA_FLAGS must be set before JAX is first imported, so this runs at collection time.
"""

import inspect
import json
import os
import pathlib
import re
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

# The `st5` command's GC thresholds, before JAX, TensorFlow and torch are imported: with CPython's
# defaults the tests spent over a tenth of their CPU time in the cyclic collector (docs/testing.md, "Time").
from st5_jax import hostmem  # noqa: E402  pylint: disable=g-import-not-at-top

hostmem.raise_gc_threshold()

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


# jaxlib 0.10.2's XLA:CPU loses, when it loads an executable from the persistent cache, the
# order between a collective inside a nested computation (a while body: scanned layers,
# GradCache's chunks; a conditional's branch; a call) and the collectives outside it:
# ThunkSequenceSerDesProtobuf::FromProto gives every nested thunk sequence a communicator
# resource of its own, so the executor's ordering edges between them are gone. Fake devices can
# then enter different collectives first (a rendezvous XLA aborts after 40 s). Executables with
# such collectives are never written to the cache; every other one is (docs/testing.md).
_COLLECTIVE_OP = re.compile(r" (all-reduce|all-gather|reduce-scatter|all-to-all|ragged-all-to-all|"
                            r"collective-permute|collective-broadcast)(-start)?\(")


def has_nested_collectives(hlo_text: str) -> bool:
  """True if a collective sits in a computation other than ENTRY (a loop body, a branch, a call)."""
  computation = None
  for line in hlo_text.splitlines():
    if not line.startswith(" "):  # a computation's header or closing brace, or module metadata
      computation = line if line.endswith("{") else None
    elif computation is not None and not computation.startswith("ENTRY") and _COLLECTIVE_OP.search(line):
      return True
  return False


def _install_cache_guard():
  from jax._src import compiler  # pylint: disable=g-import-not-at-top

  write = compiler._cache_write  # pylint: disable=protected-access
  params = list(inspect.signature(write).parameters)
  if params != ["cache_key", "compile_time_secs", "module_name", "backend", "executable", "host_callbacks"]:
    raise RuntimeError(f"jax._src.compiler._cache_write changed ({params}): update tests/conftest.py's cache guard")

  def cache_write_unless_nested_collectives(cache_key, compile_time_secs, module_name, backend, executable,
                                            host_callbacks):
    if any(has_nested_collectives(m.to_string()) for m in executable.hlo_modules()):
      return
    write(cache_key, compile_time_secs, module_name, backend, executable, host_callbacks)

  compiler._cache_write = cache_write_unless_nested_collectives  # pylint: disable=protected-access


_install_cache_guard()


# The longest tests first (from `--durations` of CI runs, longest first). xdist's work stealing
# gives the first worker the first half of the collection and lets an idle worker take the end
# of another's queue: a long test collected late could be the last one left, running alone.
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
    "test_consert_gin.py::test_consert_files_train_with_their_adamw_and_warmup",
    "test_faults_disk.py::test_full_disk_during_a_save",
    "test_evaluation_harness.py::test_transfer_and_sentglue_match_scikit_learn",
    "test_consert_gin.py::test_aot_compiles_the_consert_joint_step",
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
