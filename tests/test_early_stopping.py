"""Early stopping (TrainConfig.early_stopping): best kept in WORKDIR/best, patience, resume, best|latest loading."""

import json

import numpy as np
import pytest

import synthetic
from st5_jax import configs, hooks, optim, partitioning, train
from st5_jax.checkpoints import native
from st5_jax.encoder import SentenceEncoder

# The real vocabulary's size: the in-training evaluation tokenises STS-B dev with it.
TINY = configs.ST5Config(t5=configs.t5_size("t5_tiny", dropout_rate=0.0), embedding_dim=16)
TEXTS = ["A man is playing a guitar.", "Two dogs run on the beach.", "A woman slices an onion."]


def test_best_keeper_counts_patience_with_min_delta_and_restores():
  saved = []
  keeper = hooks.BestKeeper(hooks.EarlyStopping(patience=3, min_delta=0.5), lambda s, step, v: saved.append(step))
  for step, score in [(10, 50.0), (20, 50.4), (30, 51.0), (40, 51.2), (50, 49.0)]:
    keeper.update(step, score, None)
  # 50.4 is within min_delta of 50: no improvement; 51.0 beats 50 + 0.5; 51.2 does not beat 51.5.
  assert saved == [10, 30] and (keeper.best, keeper.best_step, keeper.bad) == (51.0, 30, 2)
  assert not keeper.should_stop
  resumed = hooks.BestKeeper(hooks.EarlyStopping(patience=3, min_delta=0.5), lambda *a: saved.append("x"),
                             json.loads(json.dumps(keeper.state_dict())))
  resumed.update(60, 51.4, None)
  assert resumed.should_stop and resumed.stopped_at == 60 and saved == [10, 30]
  nan = hooks.BestKeeper(hooks.EarlyStopping(patience=1), lambda *a: saved.append("nan"))
  nan.update(5, float("nan"), None)
  assert nan.best is None and nan.should_stop and "nan" not in saved
  never = hooks.BestKeeper(hooks.EarlyStopping(patience=None), lambda *a: None)
  for step in range(1, 50):
    never.update(step, 10.0 - step, None)
  assert not never.should_stop and never.best_step == 1
  with pytest.raises(ValueError, match="patience"):
    hooks.EarlyStopping(patience=0)
  with pytest.raises(ValueError, match="eval_every"):
    train.TrainConfig(num_train_steps=4, global_batch_size=8, early_stopping=hooks.EarlyStopping())


def _run(workdir, vocab_path, data_dir, *, stop_after_steps=None):
  # min_delta 100: no evaluation after the first can improve, so the stop step is known in advance:
  # best at step 4, no improvement at 8 and 12, stop at 12 with patience 2 (of 40 steps).
  tc = train.TrainConfig(num_train_steps=40, global_batch_size=16, checkpoint_every=100, log_every=1, eval_every=4,
                         optimizer=optim.OptimizerConfig(learning_rate=1e-2),
                         early_stopping=hooks.EarlyStopping(patience=2, min_delta=100.0))
  return train.train(workdir=workdir, model_config=TINY, train_config=tc, make_iterator=synthetic.factory(),
                     mesh_config=partitioning.MeshConfig(), vocab_file=vocab_path, progress=False,
                     eval_data_dir=str(data_dir), stop_after_steps=stop_after_steps)


def test_training_stops_keeps_the_best_and_resumes_with_its_patience(tmp_path, vocab_path, data_dir):
  straight = tmp_path / "straight"
  _run(straight, vocab_path, data_dir)
  summary = json.loads((straight / "results.json").read_text())
  assert summary["last_step"] == 12 and "stsb_dev_spearman_after" not in summary
  es = summary["early_stopping"]
  assert (es["best_step"], es["bad_evaluations"], es["stopped_at"]) == (4, 2, 12)
  rows = [json.loads(l) for l in (straight / "metrics.jsonl").read_text().splitlines()]
  evals = {r["step"]: r["eval/stsb_dev_spearman"] for r in rows if "eval/stsb_dev_spearman" in r}
  assert sorted(evals) == [0, 4, 8, 12] and es["best"] == pytest.approx(evals[4])
  assert native.committed_steps(straight / "best") == [4] and native.committed_steps(straight) == [12]

  # best | latest | auto (= best when there is one).
  best = SentenceEncoder.load(straight, checkpoint="best").encode(TEXTS)
  latest = SentenceEncoder.load(straight, checkpoint="latest").encode(TEXTS)
  np.testing.assert_array_equal(SentenceEncoder.load(straight).encode(TEXTS), best)
  assert np.abs(best - latest).max() > 1e-4

  # Stopped after step 9 (one evaluation without improvement so far), then rerun: the patience count
  # survives the restart, so it stops at step 12 as the straight run (a lost count would stop at 16).
  wd = tmp_path / "resumed"
  _run(wd, vocab_path, data_dir, stop_after_steps=9)
  assert json.loads((wd / "results.json").read_text())["early_stopping"]["bad_evaluations"] == 1
  _run(wd, vocab_path, data_dir)
  assert json.loads((wd / "results.json").read_text())["early_stopping"] == es
  np.testing.assert_array_equal(SentenceEncoder.load(wd).encode(TEXTS), best)
  # A rerun after the stop trains nothing.
  _run(wd, vocab_path, data_dir)
  assert native.committed_steps(wd) == [9, 12]


def test_checkpoint_best_without_one_is_a_clear_error(tmp_path, vocab_path):
  tc = train.TrainConfig(num_train_steps=2, global_batch_size=16, checkpoint_every=100, log_every=1, eval_every=-1,
                         optimizer=optim.OptimizerConfig(learning_rate=1e-2))
  train.train(workdir=tmp_path, model_config=TINY, train_config=tc, make_iterator=synthetic.factory(),
              mesh_config=partitioning.MeshConfig(), vocab_file=vocab_path, progress=False)
  assert native.choose_checkpoint(tmp_path, "auto") == str(tmp_path)
  with pytest.raises(FileNotFoundError, match="no best checkpoint"):
    SentenceEncoder.load(tmp_path, checkpoint="best")
