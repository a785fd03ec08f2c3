"""An ANCE-refresh training run (tests/test_ance_refresh.py): the run's gin, its data, and one process of it.

As a script, one process of a two-process run (jax.distributed on 127.0.0.1): the run uninterrupted, with a
snapshot of its work dir as a kill at step 4 leaves it (after that step's refresh wrote generation 2, before a
checkpoint recorded it), then the snapshot rerun to the end as `st5 train` reruns it. argv: ROOT OUT_JSON (ROOT:
the files `write_inputs` made; the work dirs go next to OUT_JSON). Imported, the same pieces for the one-process
tests.
Env: JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID.
"""

import json
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))

K = 3  # negatives per example
STEPS, EVERY = 8, 2  # refreshes at steps 2, 4 and 6 (not at the last step)
TOPICS = ["river", "music", "stone", "paper", "night", "city", "bird", "light"]

GIN = """
run.model = @st5_model()
st5_model.size = 't5_tiny'
st5_model.embedding_dim = 16
st5_model.dropout_rate = 0.1
st5_model.max_length = 16
st5_model.dtype = 'float32'
run.train_config = @TrainConfig()
TrainConfig.num_train_steps = {steps}
TrainConfig.global_batch_size = 8
TrainConfig.checkpoint_every = 3
TrainConfig.keep_checkpoints = 10
TrainConfig.log_every = 1
TrainConfig.eval_every = -1
TrainConfig.optimizer = @OptimizerConfig()
OptimizerConfig.learning_rate = 1e-2
TrainConfig.objective = @Contrastive()
Contrastive.num_negatives = {k}
run.data = @DataConfig()
DataConfig.task = @st5_jax.data.hard_negatives_task()
st5_jax.data.hard_negatives_task.num_negatives = {k}
st5_jax.data.hard_negatives_task.file_pattern = '{root}/gen0/part-*.jsonl'
DataConfig.feature_lengths = {{'inputs': 16, 'targets': 16, 'negative_targets': 16}}
run.mesh = @MeshConfig()
MeshConfig.data = -1
run.negatives_refresh = @NegativesRefresh()
NegativesRefresh.every = {every}
NegativesRefresh.num_negatives = {k}
NegativesRefresh.pairs_files = '{root}/pairs.jsonl'
NegativesRefresh.corpus_files = '{root}/corpus.jsonl'
NegativesRefresh.mined_per_query = 5
NegativesRefresh.range_min = 1
NegativesRefresh.range_max = 24
NegativesRefresh.batch_size = 16
NegativesRefresh.seed = 3
"""


def write_inputs(root: pathlib.Path) -> None:
  """pairs.jsonl (24 queries; 8 positives outside the corpus), corpus.jsonl (74 documents, two equal to a
  positive after normalisation), gen0/ (BM25 negatives from `st5 data mine`'s library) and run.gin."""
  from st5_jax.data.offline import mine as mine_lib  # pylint: disable=g-import-not-at-top

  us = TOPICS[:3]
  pairs = [{"query": f"what about the {t} {u}", "pos": [f"the {t} story of the {u}" if u != us[2] else
                                                        f"a {t} tale by the {u}"]} for t in TOPICS for u in us]
  docs = [f"the {t} {w} of the {u}" for t in TOPICS for w in ("story", "song", "road") for u in us]
  docs += ["the river story of the river.", "A stone tale by the stone"]
  (root / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
  (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"d{i}", "text": d}) + "\n"
                                             for i, d in enumerate(docs)))
  pairs_ = mine_lib.read_pairs([str(root / "pairs.jsonl")])
  mine_lib.mine(pairs_, mine_lib.files_corpus(str(root / "corpus.jsonl")), str(root / "gen0"),
                mine_lib.MineConfig(num_negatives=5, range_min=1, range_max=20))
  (root / "run.gin").write_text(GIN.format(steps=STEPS, k=K, every=EVERY, root=root))


def parse(root, *bindings):
  from st5_jax import gin_config  # pylint: disable=g-import-not-at-top

  gin_config.parse_gin([str(root / "run.gin")], list(bindings))
  return gin_config.run_spec()


class Recorder:
  """Every step: (step, the task the stream read it from, this process's fingerprint of its batch)."""

  def __init__(self):
    self.rows = []

  def __call__(self, info):
    import numpy as np  # pylint: disable=g-import-not-at-top

    local = [int(np.asarray(s.data).sum()) for k in sorted(info.batch) for s in info.batch[k].addressable_shards]
    self.rows.append([info.step, info.stream.iterator.name, local])

  def hook(self):
    from st5_jax import hooks  # pylint: disable=g-import-not-at-top

    return hooks.Hook(self, every=1)


class Snapshot:
  """The work dir as a run killed at `step` leaves it: its last checkpoint (`step` - 1, committed) and the
  negatives written so far (by the refresh of this step too when this hook runs after it), copied by the lead
  to `dest` during the run (metrics.jsonl left behind: the rerun logs the steps it redoes)."""

  def __init__(self, workdir, dest, step):
    self.workdir, self.dest, self.step = pathlib.Path(workdir), pathlib.Path(dest), step

  def __call__(self, info):
    import shutil  # pylint: disable=g-import-not-at-top
    import time  # pylint: disable=g-import-not-at-top

    from st5_jax import multihost  # pylint: disable=g-import-not-at-top

    if info.step != self.step or not multihost.is_lead():
      return
    last = str(self.step - 1)
    deadline = time.time() + 300
    while not (self.workdir / "checkpoints" / last).is_dir():  # its save commits in the background
      assert time.time() < deadline, "checkpoint never committed"
      time.sleep(0.02)
    def left_behind(folder, names):
      return [n for n in names if n == "metrics.jsonl" or (pathlib.Path(folder).name == "checkpoints" and n != last)]

    shutil.copytree(self.workdir, self.dest, ignore=left_behind)

  def hook(self):
    from st5_jax import hooks  # pylint: disable=g-import-not-at-top

    return hooks.Hook(self, every=self.step)


def run(root, workdir, *, hooks_before=(), hooks_after=(), bindings=(), stop_after_steps=None):
  """The run (with gin `bindings`) through train.train: a recorder and `hooks_before`, the refresh, `hooks_after`.

  Returns (result, the refresher, the recorder's rows); the recorder runs before the refresh (a step's batch
  was read from the stream as it was before its hooks)."""
  from st5_jax import paths, train  # pylint: disable=g-import-not-at-top
  from st5_jax.retrieval import refresh  # pylint: disable=g-import-not-at-top

  spec = parse(root, *bindings)
  refresher, recorder = refresh.Refresher(spec.negatives_refresh, spec.data), Recorder()
  result = train.train(workdir=str(workdir), model_config=spec.model, train_config=spec.train_config,
                       make_iterator=spec.data, mesh_config=spec.mesh, vocab_file=paths.vocab_path(spec.vocab),
                       progress=False, stop_after_steps=stop_after_steps,
                       hooks=[recorder.hook(), *hooks_before, refresher.hook(), *hooks_after])
  return result, refresher, recorder.rows


def rerun(root, workdir):
  """The same command again in `workdir` (`st5 train --gin_file run.gin`'s train_from_gin): it resumes."""
  from st5_jax import gin_config  # pylint: disable=g-import-not-at-top

  parse(root)
  return gin_config.train_from_gin(workdir=str(workdir), progress=False)


def main():
  from st5_jax import multihost  # pylint: disable=g-import-not-at-top

  multihost.maybe_initialize()
  import jax  # pylint: disable=g-import-not-at-top

  root, out_json = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
  out = out_json.parent
  # Killed at step 4 after its refresh wrote generation 2, before a checkpoint recorded it (the last is step 3).
  full, refresher, rows = run(root, out / "full", hooks_after=[Snapshot(out / "full", out / "killed", 4).hook()])
  again = rerun(root, out / "killed")
  if jax.process_index() == 0:
    out_json.write_text(json.dumps({"processes": jax.process_count(), "devices": jax.device_count(),
                                    "steps": [full.step, again.step], "rows": rows, "costs": refresher.costs}))
  return 0


if __name__ == "__main__":
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  sys.exit(main())
