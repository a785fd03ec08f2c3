"""No dead gin: every line of a shipped gin file is read by some shipped run.

A binding is dead when every run that includes its file overrides it later (e.g. a model
file's remat_policy that every run file re-set), or when nothing a run builds reads its
configurable. Runs are the files one trains with: gin/*.gin and gin/rehearsal/*.gin;
gin/runs/, gin/models/ and gin/targets/ are the pieces they include.
"""

from __future__ import annotations

import collections
import pathlib
import shutil

import gin
import pytest

from st5_jax import gin_config
from st5_jax.gin_config import parse_gin

GIN = pathlib.Path(__file__).resolve().parents[1] / "gin"


def _runs(root: pathlib.Path) -> list[str]:
  return sorted([p.name for p in root.glob("*.gin")] + [f"rehearsal/{p.name}" for p in (root / "rehearsal").glob("*.gin")])


RUNS = _runs(GIN)


def dead_bindings(root: pathlib.Path) -> tuple[list[str], set[str]]:
  """Lines of the gin tree at `root` that no run reads, as 'file:line: key = value'; and the files runs read."""
  live, seen = set(), {}
  for run in _runs(root):
    bindings = gin_config.trace([run], search_paths=[str(root)])
    last = {b.key: b for b in bindings}  # the binding of each key the run ends with
    for b in bindings:
      where = (str(pathlib.Path(b.file).resolve().relative_to(root.resolve())), b.line)
      seen[where] = b
      if last[b.key] is b:
        live.add(where)
  dead = [f"{f}:{line}: {seen[(f, line)].key} = {seen[(f, line)].value}" for f, line in sorted(set(seen) - live)]
  return dead, {f for f, _ in seen}


def test_no_binding_is_overridden_in_every_run_that_reads_it():
  dead, _ = dead_bindings(GIN)
  assert not dead, "overridden in every run that includes it (delete it, or stop overriding it):\n" + "\n".join(dead)


def test_the_check_finds_a_model_file_setting_that_every_target_overrides(tmp_path):
  # The bug this check exists for: gin/models/t5_11b.gin set remat_policy, and every run
  # including it set it again. Put such a line back in a copy of the tree.
  root = tmp_path / "gin"
  shutil.copytree(GIN, root)
  with open(root / "models" / "t5_11b.gin", "a", encoding="utf-8") as f:
    f.write("st5_model.remat_policy = 'dots_with_no_batch_dims'\n")
  dead, _ = dead_bindings(root)
  n = len((root / "models" / "t5_11b.gin").read_text().splitlines())
  assert dead == [f"models/t5_11b.gin:{n}: st5_jax.gin_config.st5_model.remat_policy = 'dots_with_no_batch_dims'"]


def test_every_target_file_is_used_by_a_run():
  _, read = dead_bindings(GIN)
  unused = sorted(str(p.relative_to(GIN)) for p in (GIN / "targets").glob("*.gin") if str(p.relative_to(GIN)) not in read)
  # A target given beside a run on the command line (`--gin RUN.gin --gin targets/v6e_256.gin`) is used when
  # tests/test_aot_generations.py combines it with the runs (and checks that none of its lines is dead).
  combined = (pathlib.Path(__file__).parent / "test_aot_generations.py").read_text()
  unused = [u for u in unused if f'"{u}"' not in combined]
  assert not unused, f"no run includes {unused}, nor does tests/test_aot_generations.py combine it with the runs"


# Configurables read when the dataset is built (not by run_spec()), and the tasks that read them.
# None: every task reads it.
DATA_TIME = {"st5_jax.data.options": None, "st5_jax.data.user_qa_pairs": {"st5_user_qa_pairs"},
             "st5_jax.data.user_nli_triples": {"st5_user_nli_triples"},
             "st5_jax.data.seed_user_text": {"st5_seed_user_text"}}


@pytest.mark.parametrize("run", RUNS)
def test_every_configurable_a_run_binds_is_read(run):
  bindings = gin_config.trace([run], search_paths=[str(GIN)])
  # A stage-2 run's init_from and a cached run's cache_dir are REQUIRED: set them as a user must.
  required = {"run.init_from": "'/stage1/workdir'", "DataConfig.cache_dir": "'/st5_cache'"}
  extra = []
  for key, value in required.items():
    values = [b.value for b in bindings if b.key.endswith(key)]
    if values and "REQUIRED" in str(values[-1]):
      extra.append(f"{key} = {value}")
  parse_gin([run], extra)
  spec = gin_config.run_spec()
  called = {selector for _, selector in gin.config._OPERATIVE_CONFIG}  # pylint: disable=protected-access
  bound = collections.defaultdict(list)
  for b in bindings:
    if b.configurable:
      bound[b.configurable].append(f"{pathlib.Path(b.file).relative_to(GIN)}:{b.line}")
  unread = {}
  for configurable, where in bound.items():
    if configurable in called:
      continue
    if configurable in DATA_TIME:
      tasks = DATA_TIME[configurable]
      if tasks is None or spec.data.task in tasks:
        continue
    unread[configurable] = where
  assert not unread, f"{run}: bound but never read (task {spec.data.task!r}): {unread}"

