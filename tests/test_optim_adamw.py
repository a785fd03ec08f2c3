"""AdamW with linear warm-up and decay (optim.AdamWConfig) against PyTorch's AdamW + transformers' schedule,
and on a sharded mesh through the trainer."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import transformers

import synthetic
from st5_jax import configs, optim, partitioning, train
from st5_jax.checkpoints import tree

# Every knob away from its default, so a setting that is ignored shows.
CFG = optim.AdamWConfig(learning_rate=3e-2, warmup_fraction=0.25, weight_decay=0.3, b1=0.8, b2=0.95, eps=1e-4,
                        max_grad_norm=0.5)
STEPS = 12


def _params(rng):
  return {"dense": {"kernel": rng.normal(size=(5, 3)), "bias": rng.normal(size=(3,))},
          "layer_norm": {"scale": 1 + 0.1 * rng.normal(size=(3,))}, "embed": {"embedding": rng.normal(size=(7, 3))}}


def _torch_reference(params, grads, config, steps):
  """sentence-transformers' fit: AdamW param groups (no decay on bias/LayerNorm), clip_grad_norm_, WarmupLinear."""
  named = {f"{a}/{b}": torch.tensor(v, dtype=torch.float64, requires_grad=True)
           for a, d in params.items() for b, v in d.items()}
  no_decay = [p for n, p in named.items() if n.split("/")[-1] in ("bias", "scale")]
  decay = [p for n, p in named.items() if n.split("/")[-1] not in ("bias", "scale")]
  opt = torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                           {"params": no_decay, "weight_decay": 0.0}], lr=config.learning_rate,
                          betas=(config.b1, config.b2), eps=config.eps)
  sched = transformers.get_linear_schedule_with_warmup(opt, int(steps * config.warmup_fraction), steps)
  lrs = []
  for g in grads:
    for n, p in named.items():
      a, b = n.split("/")
      p.grad = torch.tensor(g[a][b], dtype=torch.float64)
    torch.nn.utils.clip_grad_norm_(list(named.values()), config.max_grad_norm)
    lrs.append(opt.param_groups[0]["lr"])
    opt.step()
    sched.step()
  return {n: p.detach().numpy() for n, p in named.items()}, lrs


def test_adamw_matches_torch_adamw_with_transformers_warmup_linear_schedule():
  rng = np.random.default_rng(0)
  params = _params(rng)
  grads = [jax.tree.map(lambda x: 3.0 * rng.normal(size=x.shape), params) for _ in range(STEPS)]
  want, lrs = _torch_reference(params, grads, CFG, STEPS)
  with jax.enable_x64():
    tx, schedule = optim.make_optimizer(CFG, num_train_steps=STEPS)
    p = jax.tree.map(jnp.asarray, params)
    state = tx.init(p)
    for step, g in enumerate(grads):
      assert float(schedule(step)) == pytest.approx(lrs[step], abs=1e-15), step
      updates, state = tx.update(jax.tree.map(jnp.asarray, g), state, p)
      p = optax.apply_updates(p, updates)
    got = {f"{a}/{b}": np.asarray(v) for a, d in p.items() for b, v in d.items()}
  assert lrs[0] == 0.0 and max(lrs) == pytest.approx(CFG.learning_rate)  # warm-up from 0, then decay
  for name in want:
    np.testing.assert_allclose(got[name], want[name], rtol=1e-7, atol=1e-9, err_msg=name)  # float64 rounding


def test_schedule_and_mask_details():
  s = optim.warmup_linear_schedule(learning_rate=1.0, num_train_steps=100, warmup_fraction=0.1)
  assert [float(s(i)) for i in (0, 5, 10, 55, 100, 120)] == pytest.approx([0.0, 0.5, 1.0, 0.5, 0.0, 0.0])
  flat = optim._decay_mask({"a": {"bias": 0, "kernel": 0}, "ln": {"scale": 0}}, ("bias", "scale"))
  assert flat == {"a": {"bias": False, "kernel": True}, "ln": {"scale": False}}
  with pytest.raises(ValueError, match="warmup_fraction"):
    optim.warmup_linear_schedule(learning_rate=1.0, num_train_steps=10, warmup_fraction=1.0)


TINY = configs.ST5Config(t5=configs.t5_size("t5_tiny", dropout_rate=0.0, vocab_size=384), embedding_dim=16)


def _steps(mesh, config):
  tc = train.TrainConfig(num_train_steps=4, global_batch_size=16, checkpoint_every=100, log_every=1, eval_every=-1,
                         optimizer=config)
  setup = train.build(TINY, tc, mesh)
  with jax.set_mesh(mesh):
    state = train.init_state(setup, TINY, seed=0)
    it = synthetic.SyntheticPairs(mesh, 16, 0)
    for _ in range(3):
      state, metrics = setup.step_fn(state, next(it))
  return setup, state, jax.device_get(metrics)


# For the sharded-vs-one-device comparison: with eps = 1e-4, gradients near eps in size turn the
# reduction-order noise of sharded sums into update differences of up to 8e-4 on an AVX-512 host
# (the first steps are sign-like: d/dg g/(|g|+eps) reaches 1/eps); with 1e-3 the largest is 4e-7.
SHARDED_CFG = dataclasses.replace(CFG, eps=1e-3)


def test_adamw_in_the_trainer_shards_its_moments_like_the_parameters():
  mesh = partitioning.make_mesh(partitioning.MeshConfig(2, 2, 2))
  setup, state, metrics = _steps(mesh, SHARDED_CFG)
  assert float(metrics["learning_rate"]) == pytest.approx(float(optim.warmup_linear_schedule(
      learning_rate=CFG.learning_rate, num_train_steps=4, warmup_fraction=CFG.warmup_fraction)(2)))
  adam = next(s for s in jax.tree.leaves(state.opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
              if isinstance(s, optax.ScaleByAdamState))
  params, mu, nu = tree.flatten(state.params), tree.flatten(adam.mu), tree.flatten(adam.nu)
  sharded = [k for k in params if any(a is not None for a in params[k].sharding.spec)]
  assert len(sharded) > 5
  for k in params:
    assert mu[k].sharding.spec == nu[k].sharding.spec == params[k].sharding.spec, k
  # And the sharded steps equal one device's.
  one = partitioning.make_mesh(partitioning.MeshConfig(1, 1, 1), devices=jax.devices()[:1])
  _, ref, _ = _steps(one, SHARDED_CFG)
  got, want = tree.flatten(jax.device_get(state.params)), tree.flatten(jax.device_get(ref.params))
  for k in want:
    np.testing.assert_allclose(np.asarray(got[k]), np.asarray(want[k]), atol=2e-5, rtol=1e-4, err_msg=k)


def test_adamw_without_bias_correction_matches_transformers_adamw_by_hand():
  """transformers.AdamW(correct_bias=False), ConSERT's optimiser, re-derived in NumPy: no bias correction,
  then weight decay on the updated parameters, after global-norm clipping."""
  config = optim.AdamWConfig(**{**CFG.__dict__, "correct_bias": False})
  rng = np.random.default_rng(1)
  params = _params(rng)
  grads = [jax.tree.map(lambda x: 3.0 * rng.normal(size=x.shape), params) for _ in range(STEPS)]
  warmup = int(STEPS * config.warmup_fraction)
  p = {n: dict(d) for n, d in params.items()}
  m = jax.tree.map(np.zeros_like, params)
  v = jax.tree.map(np.zeros_like, params)
  for step, g in enumerate(grads):
    lr = config.learning_rate * (step / warmup if step < warmup else max(0.0, (STEPS - step) / (STEPS - warmup)))
    norm = np.sqrt(sum((x ** 2).sum() for x in jax.tree.leaves(g)))
    scale = min(1.0, config.max_grad_norm / (norm + 1e-6))  # torch clip_grad_norm_
    for a in p:
      for b in p[a]:
        gg = g[a][b] * scale
        m[a][b] = config.b1 * m[a][b] + (1 - config.b1) * gg
        v[a][b] = config.b2 * v[a][b] + (1 - config.b2) * gg * gg
        p[a][b] = p[a][b] - lr * m[a][b] / (np.sqrt(v[a][b]) + config.eps)
        if b not in ("bias", "scale"):
          p[a][b] = p[a][b] - lr * config.weight_decay * p[a][b]
  with jax.enable_x64():
    tx, _ = optim.make_optimizer(config, num_train_steps=STEPS)
    q = jax.tree.map(jnp.asarray, params)
    state = tx.init(q)
    for g in grads:
      updates, state = tx.update(jax.tree.map(jnp.asarray, g), state, q)
      q = optax.apply_updates(q, updates)
  for a in p:
    for b in p[a]:
      np.testing.assert_allclose(np.asarray(q[a][b]), p[a][b], rtol=1e-6, atol=1e-8, err_msg=f"{a}/{b}")
  # And the corrected form differs (the first steps are up to ~3x larger without the correction).
  tx_c, _ = optim.make_optimizer(CFG, num_train_steps=STEPS)
  with jax.enable_x64():
    r = jax.tree.map(jnp.asarray, params)
    sc = tx_c.init(r)
    for g in grads:
      u, sc = tx_c.update(jax.tree.map(jnp.asarray, g), sc, r)
      r = optax.apply_updates(r, u)
  assert np.abs(np.asarray(r["dense"]["kernel"]) - p["dense"]["kernel"]).max() > 1e-3
