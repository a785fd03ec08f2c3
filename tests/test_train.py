"""The trainer: schedule, sharded steps, checkpoints, resume, failure modes (Adafactor: test_optim.py)."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import pytest

import synthetic
from xla_env import xla_flags
from st5_jax import configs, features, hooks, optim, partitioning, train
from st5_jax.checkpoints import native, tree
from st5_jax.checkpoints import state as state_lib

TINY = configs.ST5Config(t5=configs.t5_size("t5_tiny", dropout_rate=0.0, vocab_size=384), embedding_dim=16)


def _tc(**kw):
  base = dict(num_train_steps=6, global_batch_size=16, checkpoint_every=100, log_every=1, eval_every=-1,
              optimizer=optim.OptimizerConfig(learning_rate=1e-2))
  base.update(kw)
  return train.TrainConfig(**base)


def _run(workdir, vocab_path, mesh=partitioning.MeshConfig(), model=TINY, data=None, **kw):
  tc = kw.pop("tc", None) or _tc()
  return train.train(workdir=workdir, model_config=model, train_config=tc, make_iterator=data or synthetic.factory(),
                     mesh_config=mesh, vocab_file=vocab_path, progress=False, **kw)


def _params(workdir):
  _, params, step = native.load_params(workdir)
  return step, {k: np.asarray(v) for k, v in tree.flatten(params).items()}


def test_schedule_values():
  sched = optim.learning_rate_schedule(learning_rate=1e-3, num_train_steps=1000, constant_fraction=0.1)
  assert float(sched(0)) == pytest.approx(1e-3)
  assert float(sched(99)) == pytest.approx(1e-3)
  assert float(sched(100)) == pytest.approx(1e-3)  # 10%: decay starts here
  assert float(sched(550)) == pytest.approx(0.5e-3)  # 55%: halfway down
  assert float(sched(1000)) == pytest.approx(0.0, abs=1e-12)  # 100%: zero at the last step
  assert float(sched(1200)) == 0.0


def _one_step(mesh, model=TINY):
  # epsilon1=1e-6: Adafactor's first update is ~sign(g) per element, so with the default
  # 1e-30 a gradient of 1e-12 (reduction-order noise) would flip a full-size update.
  setup = train.build(model, _tc(optimizer=optim.OptimizerConfig(learning_rate=1e-2, epsilon1=1e-6)), mesh)
  with jax.set_mesh(mesh):
    state = train.init_state(setup, model, seed=0)
    it = synthetic.SyntheticPairs(mesh, 16, 0)
    for _ in range(2):
      state, metrics = setup.step_fn(state, next(it))
  flat = {k: np.asarray(jax.device_get(v)) for k, v in tree.flatten(state.params).items()}
  return flat, jax.device_get(metrics)


@pytest.fixture(scope="module")
def unsharded_steps():
  return _one_step(partitioning.make_mesh(partitioning.MeshConfig(1, 1, 1), devices=jax.devices()[:1]))


# (data, fsdp, model): the (8,1), (4,2), (2,4) data x model meshes, and fsdp.
@pytest.mark.parametrize("mesh_shape", [(8, 1, 1), (4, 1, 2), (2, 1, 4), (2, 2, 2)])
def test_sharded_step_equals_unsharded(mesh_shape, unsharded_steps):
  ref, ref_m = unsharded_steps
  got, m = _one_step(partitioning.make_mesh(partitioning.MeshConfig(*mesh_shape)))
  assert float(m["loss"]) == pytest.approx(float(ref_m["loss"]), rel=1e-5)
  for k in ref:
    np.testing.assert_allclose(got[k], ref[k], atol=2e-5, rtol=1e-4, err_msg=k)


def test_clear_errors_before_compiling():
  with pytest.raises(partitioning.PartitioningError, match="needs 12 devices, but 8"):
    partitioning.make_mesh(partitioning.MeshConfig(3, 2, 2))
  from st5_jax.batch_geometry import DataConfigError
  with pytest.raises(DataConfigError, match="not divisible by the number of data shards 8"):
    train.build(TINY, _tc(global_batch_size=12), partitioning.make_mesh(partitioning.MeshConfig(8, 1, 1)))
  odd = TINY.replace(t5=TINY.t5.replace(num_heads=3, head_dim=6))  # joined_kv 18 over model=4
  with pytest.raises(partitioning.PartitioningError, match=r"attention.*dim 18 over mesh axis model \(size 4\)"):
    train.build(odd, _tc(), partitioning.make_mesh(partitioning.MeshConfig(2, 1, 4)))


def test_loss_goes_down_and_outputs_are_written(tmp_path, vocab_path):
  tc = _tc(num_train_steps=32, checkpoint_every=10, keep_checkpoints=2, log_every=1)
  result = _run(tmp_path, vocab_path, tc=tc, data=synthetic.factory(cycle=4))  # 4 batches, 8 epochs
  rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  losses_ = [r["train/loss"] for r in rows if "train/loss" in r]
  assert result.step == 32 and len(losses_) == 32
  assert np.mean(losses_[-4:]) < 0.5 * np.mean(losses_[:4])  # same 4 batches, first vs last epoch
  assert {"train/accuracy", "train/alignment", "train/uniformity", "train/examples_per_sec",
          "train/learning_rate"} <= set(rows[-1])
  assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()) == [30, 32]
  summary = json.loads((tmp_path / "results.json").read_text())
  assert summary["last_step"] == 32 and summary["final_metrics"]["loss"] == pytest.approx(losses_[-1])
  assert list((tmp_path / "tensorboard").iterdir())
  assert native.read_config(tmp_path) == TINY


def test_resume_on_a_different_mesh_matches(tmp_path, vocab_path):
  # Different meshes reduce in different orders; epsilon1 keeps Adafactor's sign-like first
  # updates from amplifying that noise (see _one_step).
  tc = _tc(num_train_steps=8, optimizer=optim.OptimizerConfig(learning_rate=1e-2, epsilon1=1e-6))
  full = tmp_path / "full"
  _run(full, vocab_path, mesh=partitioning.MeshConfig(8, 1, 1), tc=tc)
  split = tmp_path / "split"
  r1 = _run(split, vocab_path, mesh=partitioning.MeshConfig(2, 2, 2), tc=tc, stop_after_steps=4)
  assert r1.step == 4
  r2 = _run(split, vocab_path, mesh=partitioning.MeshConfig(1, 4, 2), tc=tc)
  assert r2.step == 8
  (sa, a), (sb, b) = _params(full), _params(split)
  assert sa == sb == 8
  for k in a:
    np.testing.assert_allclose(a[k], b[k], atol=5e-5, rtol=1e-4, err_msg=k)


def test_corrupt_latest_checkpoint_falls_back(tmp_path, vocab_path, caplog):
  tc = _tc(num_train_steps=6, checkpoint_every=2)
  wd = tmp_path / "run"
  _run(wd, vocab_path, tc=tc, stop_after_steps=4)  # checkpoints 2 and 4
  for f in (wd / "checkpoints" / "4" / "params").rglob("*"):
    if f.is_file() and f.stat().st_size > 0:
      f.write_bytes(b"\x00garbage")
  # One more step: from the surviving step 2 this ends at step 3 (from scratch it would end at 1).
  result = _run(wd, vocab_path, tc=tc, stop_after_steps=1)
  assert "step 4" in caplog.text and "cannot be restored" in caplog.text
  assert result.step == 3
  # The unreadable step was moved aside (left in place, orbax would never save a step at or
  # below it, and every load would pick it first), and the step the run stopped at was saved.
  assert not (wd / "checkpoints" / "4").exists() and len(list((wd / "checkpoints").glob("corrupt-4-*"))) == 1
  assert native.committed_steps(wd) == [2, 3]
  # To the end: step 2's weights, optimizer state and data position carry on exactly as in a
  # straight run, and the later steps are saved again.
  result = _run(wd, vocab_path, tc=tc)
  assert result.step == 6 and json.loads((wd / "results.json").read_text())["last_step"] == 6
  assert native.committed_steps(wd)[-1] == 6 and native.load_params(wd)[2] == 6
  ref = tmp_path / "straight"
  _run(ref, vocab_path, tc=tc)
  (sa, a), (sb, b) = _params(ref), _params(wd)
  assert sa == sb == 6
  for k in a:
    np.testing.assert_allclose(b[k], a[k], atol=1e-6, rtol=1e-6, err_msg=k)


def test_dropout_masks_change_every_step():
  """The dropout key folds in the step: the same batch and weights at another step give another loss."""
  model = TINY.replace(t5=TINY.t5.replace(dropout_rate=0.3))
  mesh = partitioning.make_mesh(partitioning.MeshConfig(1, 1, 1), devices=jax.devices()[:1])
  setup = train.build(model, _tc(), mesh)
  with jax.set_mesh(mesh):
    state = train.init_state(setup, model, seed=0)
    batch = next(synthetic.SyntheticPairs(mesh, 16, 0))
    # The step donates its input state: give each call its own copy.
    losses_ = [float(setup.step_fn(jax.tree.map(lambda x: x.copy(), state.replace(step=state.step + s)),
                                   batch)[1]["loss"]) for s in (0, 0, 1)]
  assert losses_[0] == losses_[1] != losses_[2]


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tmp_path, vocab_path):
  tc = _tc(num_train_steps=50, checkpoint_every=1, optimizer=optim.OptimizerConfig(learning_rate=1e38))
  with pytest.raises(hooks.NonFiniteLossError, match="Non-finite") as err:
    _run(tmp_path, vocab_path, tc=tc)
  good = native.load_params(tmp_path)
  assert all(np.all(np.isfinite(np.asarray(v))) for v in tree.flatten(good[1]).values())
  assert f"step {good[2]}" in str(err.value)


def _rel_dist(a, b):
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))


PROJ = "projection_layer/kernel"


def test_init_from_pretrained_and_two_stages(tmp_path, vocab_path):
  """Stage 2 starts from stage 1's weights (projection kept or fresh); an existing checkpoint wins."""
  s1 = tmp_path / "stage1"
  _run(s1, vocab_path, tc=_tc(num_train_steps=3))
  _, p1 = _params(s1)
  # Stage 2 runs with another seed, whose fresh initialisation is ~sqrt(2) away from stage 1
  # (relative); Adafactor's updates are at most lr x RMS(param) per step, so 2 steps at lr 1e-2
  # from stage 1 stay within a few percent of it.
  fresh = {k: np.asarray(v) for k, v in tree.flatten(jax.device_get(
      train.init_state(train.build(TINY, _tc(), partitioning.make_mesh(partitioning.MeshConfig())),
                       TINY, seed=1).params)).items()}
  matrices = [k for k in p1 if p1[k].ndim >= 2]
  assert PROJ in matrices and all(_rel_dist(fresh[k], p1[k]) > 0.5 for k in matrices)

  s2 = tmp_path / "stage2"
  result = _run(s2, vocab_path, tc=_tc(num_train_steps=2, seed=1), init_from=str(s1))
  assert result.summary["init_from"] == str(s1)
  _, p2 = _params(s2)
  for k in matrices:  # every weight, the projection included, trained on from stage 1's
    assert 0 < _rel_dist(p2[k], p1[k]) < 0.1, k

  # init_projection="fresh": the T5 weights come in, the projection is a new one.
  s2f = tmp_path / "stage2_fresh_projection"
  _run(s2f, vocab_path, tc=_tc(num_train_steps=2, seed=1), init_from=str(s1), init_projection="fresh")
  _, p2f = _params(s2f)
  assert _rel_dist(p2f[PROJ], p1[PROJ]) > 0.5
  assert all(_rel_dist(p2f[k], p1[k]) < 0.1 for k in matrices if k != PROJ)
  with pytest.raises(ValueError, match="init_projection must be 'auto' or 'fresh'"):
    _run(tmp_path / "bad_proj", vocab_path, tc=_tc(num_train_steps=1), init_from=str(s1), init_projection="keep")

  # Rerun in stage 2's work dir: its checkpoint wins over init_from (here a path that does not
  # exist, which loading would refuse), and training continues from step 2 with its state.
  result = _run(s2, vocab_path, tc=_tc(num_train_steps=4, seed=1), init_from=str(tmp_path / "missing"))
  assert result.step == 4
  _, p4 = _params(s2)
  assert all(0 < _rel_dist(p4[k], p2[k]) < 0.1 for k in matrices)

  # Mismatched sizes are refused.
  wrong = TINY.replace(t5=TINY.t5.replace(mlp_dim=128))
  with pytest.raises(ValueError, match="mlp_dim: checkpoint 64 vs config 128"):
    _run(tmp_path / "bad", vocab_path, model=wrong, tc=_tc(num_train_steps=1), init_from=str(s1))


def _np_in_batch_loss(left, right, neg):
  """Eq. 14 in NumPy: each query against every positive and hard negative of the batch, t=0.01."""
  logits = left @ np.concatenate([right, neg]).T / 0.01
  logits = logits - logits.max(axis=1, keepdims=True)
  logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
  return float(-np.mean(np.diag(logp[:, :len(left)])))


def _np_stsb_dev_spearman(encoder, data_dir):
  """Spearman x100 of cosine similarity on STS-B dev, read straight from the raw file (scipy)."""
  import scipy.stats
  rows = [l.split("\t") for l in (data_dir / "stsb" / "original" / "sts-dev.csv").read_text().splitlines()]
  s1, s2 = encoder.encode([r[5].strip() for r in rows]), encoder.encode([r[6].strip() for r in rows])
  cos = np.sum(s1 * s2, axis=1) / np.linalg.norm(s1, axis=1) / np.linalg.norm(s2, axis=1)
  return 100 * scipy.stats.spearmanr(cos, [float(r[4]) for r in rows]).statistic


def _count_backend_compiles(fn):
  """(result of fn(), number of XLA compilations it ran)."""
  events = []

  def listener(event, secs, **kw):
    del secs, kw
    if event == "/jax/core/compile/backend_compile_duration":
      events.append(event)

  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    return fn(), len(events)
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)


def test_sts_dev_eval_compiles_its_encoder_once_across_calls(vocab_path, data_dir):
  """The periodic STS-B dev evaluation reuses one compiled encoder: a second call compiles nothing."""
  model = configs.ST5Config(t5=configs.t5_size("t5_tiny", dropout_rate=0.0), embedding_dim=16, max_length=32)
  tc = _tc(num_train_steps=4, eval_every=2)
  mesh = partitioning.make_mesh(partitioning.MeshConfig())
  setup = train.build(model, tc, mesh)
  sts_dev_eval = train.make_dev_eval(setup, model, data_dir=str(data_dir), vocab_file=vocab_path)
  with jax.set_mesh(mesh):
    params = train.init_state(setup, model, seed=0).params
    first, compiles_first = _count_backend_compiles(lambda: sts_dev_eval(params))
    second, compiles_second = _count_backend_compiles(lambda: sts_dev_eval(params))
  assert compiles_first >= 1  # the counter sees the encoder's compilations (one per length bucket)
  assert compiles_second == 0
  assert second == first


def test_trainer_on_seqio_nli_triples_with_stsb_eval_during_training(tmp_path, vocab_path, data_dir, monkeypatch):
  """The real tiny NLI task (premise, entailment, contradiction) through the trainer, STS-B dev every 2 steps."""
  from st5_jax import SentenceEncoder, multihost
  from st5_jax.model import SentenceT5

  model = configs.ST5Config(t5=configs.t5_size("t5_tiny", dropout_rate=0.0), embedding_dim=16, max_length=32)
  data = train.DataConfig(task="st5_snli_devtest_triples", split="all",
                          feature_lengths={"inputs": 32, "targets": 32, "negative_targets": 32})
  tc = _tc(num_train_steps=4, eval_every=2)
  compiled = []
  compile_together = multihost.compile_together

  def recording_compile(fn, *args, name, **kw):
    compiled.append(name)
    return compile_together(fn, *args, name=name, **kw)

  monkeypatch.setattr(multihost, "compile_together", recording_compile)
  _run(tmp_path, vocab_path, model=model, tc=tc, data=data, eval_data_dir=str(data_dir))
  # Three evaluations (steps 0, 2, 4), one encoder: each length bucket compiled once for the run.
  encodes = [n for n in compiled if n.startswith("encode_")]
  assert encodes and len(encodes) == len(set(encodes)), compiled
  assert compiled.count("train_step") == 1
  rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  evals = {r["step"]: r["eval/stsb_dev_spearman"] for r in rows if "eval/stsb_dev_spearman" in r}
  assert sorted(evals) == [0, 2, 4]  # before training, every eval_every steps, after the last step
  summary = json.loads((tmp_path / "results.json").read_text())
  assert summary["stsb_dev_spearman_before"] == evals[0] and summary["stsb_dev_spearman_after"] == evals[4]
  # The last score is the final weights' STS-B dev Spearman, recomputed independently.
  assert evals[4] == pytest.approx(_np_stsb_dev_spearman(SentenceEncoder.load(tmp_path), data_dir), abs=0.05)

  # Step 1's loss is eq. 14 of the initial weights on the task's first batch (hard negatives included).
  mesh = partitioning.make_mesh(partitioning.MeshConfig())
  setup = train.build(model, tc, mesh)
  with jax.set_mesh(mesh):
    params = jax.device_get(train.init_state(setup, model, seed=tc.seed).params)
    batch = {k: np.asarray(v) for k, v in next(data(mesh, tc.global_batch_size, tc.seed)).items()}
  assert set(batch) == {features.LEFT, features.RIGHT, features.RIGHT_NEG}
  emb = {k: np.asarray(SentenceT5(model).apply({"params": params}, v), np.float64) for k, v in batch.items()}
  step1 = next(r["train/loss"] for r in rows if r["step"] == 1 and "train/loss" in r)
  assert step1 == pytest.approx(_np_in_batch_loss(emb[features.LEFT], emb[features.RIGHT], emb[features.RIGHT_NEG]),
                                rel=1e-4)


GIN = """
run.model = @st5_model()
st5_model.size = 't5_tiny'
st5_model.embedding_dim = 16
st5_model.dropout_rate = 0.1
st5_model.vocab_size = 384
run.train_config = @TrainConfig()
TrainConfig.num_train_steps = {steps}
TrainConfig.global_batch_size = 16
TrainConfig.checkpoint_every = 5
TrainConfig.log_every = 1
TrainConfig.eval_every = -1
run.data = @synthetic_factory()
run.mesh = @MeshConfig()
MeshConfig.data = -1
"""

LAUNCH = textwrap.dedent("""
  import sys
  sys.path.insert(0, {tests!r})
  import gin, synthetic
  from st5_jax import cli
  gin.external_configurable(synthetic.factory, "synthetic_factory")
  sys.exit(cli.main(sys.argv[1:]))
""")


def _train_cmd(tmp_path, workdir, steps, *extra):
  gin_file = tmp_path / f"run_{steps}.gin"
  gin_file.write_text(GIN.format(steps=steps))
  script = tmp_path / "launch.py"
  script.write_text(LAUNCH.format(tests=str(pathlib.Path(__file__).parent)))
  return [sys.executable, str(script), "train", "--gin_file", str(gin_file), "--workdir", str(workdir),
          "--no_progress", *extra]


def test_sigterm_saves_and_resume_is_exact(tmp_path, vocab_path):
  """A real SIGTERM to a training process; rerunning the command ends where an uninterrupted run does."""
  env = dict(os.environ, XLA_FLAGS=xla_flags(4))
  steps = 200
  straight = tmp_path / "straight"
  subprocess.run(_train_cmd(tmp_path, straight, steps), env=env, check=True, capture_output=True, timeout=600)

  wd = tmp_path / "interrupted"
  proc = subprocess.Popen(_train_cmd(tmp_path, wd, steps), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  metrics = wd / "metrics.jsonl"
  deadline = time.time() + 300
  while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 10):
    assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
    time.sleep(0.05)
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 143, err.decode()[-3000:]
  assert b"Rerun the same command to resume" in err
  stopped_at = native.load_params(wd)[2]
  assert 10 <= stopped_at < steps
  # Saved at the step it stopped at (results.json's last_step), not only at a checkpoint_every boundary.
  assert stopped_at == json.loads((wd / "results.json").read_text())["last_step"]

  subprocess.run(_train_cmd(tmp_path, wd, steps), env=env, check=True, capture_output=True, timeout=600)
  (sa, a), (sb, b) = _params(straight), _params(wd)
  assert sa == sb == steps
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)
  assert (wd / "operative_config.gin").read_text().count("TrainConfig.num_train_steps = 200") == 1


def test_gin_overrides_parse():
  from st5_jax.commands.train import gin_overrides
  assert gin_overrides(["--gin.TrainConfig.num_train_steps=5", "--gin.run.init_from", "'a b'"]) == [
      "TrainConfig.num_train_steps=5", "run.init_from='a b'"]
  with pytest.raises(SystemExit):
    gin_overrides(["--steps=3"])


def test_init_from_a_t5x_checkpoint_resets_the_optimizer(tmp_path, vocab_path, fixtures_dir):
  """Stage 1 from a real T5X checkpoint (step 1000, with Adafactor state): weights in, fresh optimizer."""
  import orbax.checkpoint as ocp
  from st5_jax.checkpoints import t5x

  path = str(fixtures_dir / "t5x_tiny_dual_encoder_checkpoint_1000")
  t5_cfg, proj_dim, flat = t5x.load(path)
  model = configs.ST5Config(t5=t5_cfg.replace(dropout_rate=0.0), embedding_dim=proj_dim)
  _run(tmp_path, vocab_path, model=model, tc=_tc(num_train_steps=2), init_from=path,
       data=synthetic.factory(vocab=32000))
  mngr = native.checkpoint_manager(tmp_path, read_only=True)
  meta = mngr.restore(2, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
  mngr.close()
  assert meta["step"] == 2
  _, params = _params(tmp_path)
  # Trained from the checkpoint's weights: close to them after 2 small steps, not equal.
  emb0, emb2 = flat["token_embedder/embedding"], params["token_embedder/embedding"]
  assert not np.array_equal(emb0, emb2) and np.corrcoef(emb0.ravel(), emb2.ravel())[0, 1] > 0.99
  # The optimizer restarted: Adafactor's count is this run's 2 steps, not the checkpoint's 1000.
  setup = train.build(model, _tc(num_train_steps=2), partitioning.make_mesh(partitioning.MeshConfig()))
  mngr = native.checkpoint_manager(tmp_path, read_only=True)
  state, _ = state_lib.restore_state(mngr, 2, setup)
  mngr.close()
  assert int(state.opt_state.count) == 2
