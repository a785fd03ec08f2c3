"""Faults: a poisoned batch or parameter stops the run at the right step, no poisoned checkpoint."""

import json

import numpy as np
import pytest

import synthetic
from st5_jax import configs, features, hooks, optim, partitioning, train
from st5_jax.checkpoints import native, tree

TINY = configs.ST5Config(t5=configs.t5_size("t5_tiny", dropout_rate=0.0, vocab_size=384), embedding_dim=16)


class PoisonedPairs(synthetic.SyntheticPairs):
  """Batch `poison_at` holds one token id past the vocabulary (a corrupt cache, a wrong
  vocabulary): the embedding lookup (jnp.take, fill mode) gives NaN, so the loss is NaN."""

  def __init__(self, *a, poison_at, bad_id=384, **kw):
    super().__init__(*a, **kw)
    self.poison_at, self.bad_id = poison_at, bad_id

  def _global_batch(self, i):
    b = super()._global_batch(i)
    if i == self.poison_at:
      b[features.RIGHT][3, 2] = self.bad_id
    return b


def _tc(**kw):
  base = dict(num_train_steps=12, global_batch_size=16, checkpoint_every=2, keep_checkpoints=10, log_every=10,
              eval_every=-1, optimizer=optim.OptimizerConfig(learning_rate=1e-2))
  base.update(kw)
  return train.TrainConfig(**base)


def _run(workdir, vocab_path, data, tc=None, **kw):
  return train.train(workdir=workdir, model_config=TINY, train_config=tc or _tc(), make_iterator=data,
                     mesh_config=partitioning.MeshConfig(), vocab_file=vocab_path, progress=False, **kw)


def _steps(workdir):
  return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


def _all_finite(workdir, step):
  _, params, _ = native.load_params(workdir / "checkpoints" / str(step))
  return all(np.all(np.isfinite(np.asarray(v))) for v in tree.flatten(params).values())


@pytest.mark.parametrize("bad_id", [384, 10**6])
def test_poisoned_batch_is_named_and_never_saved(tmp_path, vocab_path, bad_id):
  # Batch index 4 is step 5: steps 5 and 6 are NaN; step 6 is a checkpoint step (and the first
  # log step after it), which must not be saved, and the error must name step 5, not 6.
  data = lambda mesh, b, seed: PoisonedPairs(mesh, b, seed, poison_at=4, bad_id=bad_id)  # noqa: E731
  with pytest.raises(hooks.NonFiniteLossError, match=r"at step 5;") as err:
    _run(tmp_path, vocab_path, data)
  assert _steps(tmp_path) == [2, 4]
  assert all(_all_finite(tmp_path, s) for s in (2, 4))
  assert "last good checkpoint is step 4" in str(err.value)
  assert "token ids outside the vocabulary" in str(err.value)
  # Nothing was logged past the poisoned step either.
  rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert all(np.isfinite(r["train/loss"]) for r in rows if "train/loss" in r)


def test_clean_rerun_resumes_from_the_last_good_checkpoint(tmp_path, vocab_path):
  """After a poisoned run, a rerun with clean data restores step 4 and ends where a clean run does."""
  clean = synthetic.factory()
  poisoned = lambda mesh, b, seed: PoisonedPairs(mesh, b, seed, poison_at=6)  # noqa: E731
  with pytest.raises(hooks.NonFiniteLossError, match=r"at step 7;"):
    _run(tmp_path / "a", vocab_path, poisoned, tc=_tc(num_train_steps=8))
  assert _steps(tmp_path / "a") == [2, 4, 6]
  r = _run(tmp_path / "a", vocab_path, clean, tc=_tc(num_train_steps=8))
  assert r.step == 8
  _run(tmp_path / "b", vocab_path, clean, tc=_tc(num_train_steps=8))
  _, pa, _ = native.load_params(tmp_path / "a")
  _, pb, _ = native.load_params(tmp_path / "b")
  fa, fb = tree.flatten(pa), tree.flatten(pb)
  for k in fb:
    np.testing.assert_array_equal(np.asarray(fa[k]), np.asarray(fb[k]), err_msg=k)


@pytest.mark.parametrize("value", [np.inf, np.nan])
def test_poisoned_parameter_stops_at_the_first_step(tmp_path, vocab_path, value):
  """A model to start from with one Inf/NaN weight: step 1 is refused and no checkpoint is written."""
  src = tmp_path / "src"
  _run(src, vocab_path, synthetic.factory(), tc=_tc(num_train_steps=2))
  _, params, _ = native.load_params(src)
  params = {k: np.asarray(v) for k, v in tree.flatten(params).items()}
  key = "encoder/layers_0/mlp/wi/kernel"
  params[key] = params[key].copy()
  params[key][0, 0] = value
  bad = tmp_path / "bad_model"
  native.save_model(bad, TINY, tree.unflatten(params), vocab_file=vocab_path)
  wd = tmp_path / "run"
  with pytest.raises(hooks.NonFiniteLossError, match=r"at step 1;.*last good checkpoint is step None"):
    _run(wd, vocab_path, synthetic.factory(), init_from=str(bad))
  assert not (wd / "checkpoints").exists() or _steps(wd) == []
