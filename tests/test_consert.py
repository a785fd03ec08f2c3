"""ConSERT on the ST5 stack: views, NT-Xent, NLI head, objectives, tasks, global batch."""

import collections
import functools
import itertools
import json
import math
import os
import socket
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import synthetic
from xla_env import xla_flags
from st5_jax import configs, losses, optim, partitioning, train
from st5_jax import vocab as vocab_lib
from st5_jax.checkpoints import tree
from st5_jax.objectives import ConsertJoint, ConsertUnsup
from st5_jax.objectives.consert import augment, objective
from st5_jax.features import LABELS, LEFT, RIGHT
from st5_jax.model import SentenceT5, t5 as t5_lib
from st5_jax.model.st5 import abstract_params
from st5_jax.objectives.consert.model import nli_pair_features

TINY = configs.ST5Config(t5=configs.t5_size("t5_tiny", dropout_rate=0.0, vocab_size=384), embedding_dim=16)
RATES = (0.1, 0.15, 0.2, 0.3, 0.7)


def _mask(lengths, L):
  return np.arange(L)[None, :] < np.asarray(lengths)[:, None]


def _tokens(lengths, L, seed=0, vocab=300):
  rng = np.random.default_rng(seed)
  t = rng.integers(3, vocab, size=(len(lengths), L)).astype(np.int32)
  for r, n in enumerate(lengths):
    t[r, n - 1] = 1
    t[r, n:] = 0
  return t


def _params(cfg, seed=0, objective=None):
  module = SentenceT5(cfg) if objective is None else objective.make_model(cfg)
  return nn.unbox(module.init(jax.random.PRNGKey(seed), jnp.ones((1, 8), jnp.int32))["params"])


def _vg(tc, cfg, module):
  """The objective's (params, batch, key) -> ((loss, metrics), grads), without re-boxing."""
  return tc.objective.make_value_and_grad(module, None, cfg, tc)


# ------------------------------------------------------------------------ augmentations


def test_shuffle_is_a_uniform_per_example_permutation_of_real_positions():
  L = 10
  lengths = [1, 2, 3, 7, 10, 0] * 100
  mask = _mask(lengths, L)
  mask[-1] = [True, False, True, True, False, False, True, False, False, True]  # not a prefix
  pos = np.asarray(augment.shuffle_positions(jnp.asarray(mask), jax.random.PRNGKey(0)))
  for r in range(len(lengths)):
    real = np.flatnonzero(mask[r])
    assert sorted(pos[r, real]) == list(real), r
    pad = np.flatnonzero(~mask[r])
    np.testing.assert_array_equal(pos[r, pad], pad)
  # Per example: the 100 rows of length 3 draw all 6 orders about equally often.
  counts = collections.Counter(tuple(pos[r, :3]) for r in range(len(lengths)) if lengths[r] == 3 and r < 594)
  assert set(counts) == set(itertools.permutations(range(3)))
  assert min(counts.values()) >= 6 and max(counts.values()) <= 30


def test_permuted_relative_bias_equals_bias_of_the_shuffled_sequence():
  B, L, H = 3, 9, 4
  module = t5_lib.RelativePositionBiases(H, 32, 128, bidirectional=True)
  variables = module.init(jax.random.PRNGKey(0), L, L)
  mask = _mask([9, 5, 2], L)
  pos = np.asarray(augment.shuffle_positions(jnp.asarray(mask), jax.random.PRNGKey(3)))
  bias_perm = np.asarray(module.apply(variables, L, L, jnp.asarray(pos)))
  bias_std = np.asarray(module.apply(variables, L, L))[0]
  assert bias_perm.shape == (B, H, L, L)
  # Query i and key j of the faithful shuffle see the bias of positions pi(i), pi(j).
  expected = bias_std[:, pos[:, :, None], pos[:, None, :]].transpose(1, 0, 2, 3)
  np.testing.assert_array_equal(bias_perm, expected)
  assert not np.array_equal(bias_perm[0], np.broadcast_to(bias_std, (H, L, L)))


@pytest.mark.parametrize("pooling,equal", [("enc_mean", True), ("encdec_first", True), ("enc_first", False)])
def test_cheap_token_permutation_equals_the_faithful_shuffle_except_for_first_token_pooling(pooling, equal):
  # Mean pooling and the decoder's cross-attention (no position bias) see the encoder
  # outputs as a set; the first token's output is a different token's after permuting ids.
  cfg = TINY.replace(pooling=pooling)
  L, lengths = 12, [12, 7, 4, 9]
  tokens = _tokens(lengths, L, seed=1)
  mask = tokens > 0
  params = _params(cfg)
  model = SentenceT5(cfg)
  pos = augment.shuffle_positions(jnp.asarray(mask), jax.random.PRNGKey(5))
  shuffled = augment.permute_tokens(jnp.asarray(tokens), pos)
  # Every token output of the faithful form sits at pi(j) in the physically shuffled sequence.
  enc_faithful = model.apply({"params": params}, jnp.asarray(tokens), positions_BxL=pos, method="encode")
  enc_shuffled = model.apply({"params": params}, shuffled, method="encode")
  gathered = jnp.take_along_axis(enc_shuffled, pos[:, :, None], axis=1)
  np.testing.assert_allclose(np.asarray(enc_faithful)[mask], np.asarray(gathered)[mask], atol=1e-5)
  faithful = np.asarray(model.apply({"params": params}, jnp.asarray(tokens), positions_BxL=pos))
  cheap = np.asarray(model.apply({"params": params}, shuffled))
  plain = np.asarray(model.apply({"params": params}, jnp.asarray(tokens)))
  assert np.abs(faithful - plain).max() > 1e-3  # the shuffle changes the sentence embedding
  if equal:
    np.testing.assert_allclose(cheap, faithful, atol=1e-5)
  else:
    assert np.abs(cheap - faithful).max() > 1e-3


@pytest.mark.parametrize("rate", RATES)
def test_token_cutoff_zeroes_int_n_rate_real_rows_without_rescaling(rate):
  L, D = 40, 8
  lengths = list(range(1, L + 1)) * 3
  mask = _mask(lengths, L)
  x = np.random.default_rng(0).normal(size=(len(lengths), L, D)).astype(np.float32) + 5.0  # no zeros
  out = np.asarray(augment.token_cutoff(jnp.asarray(x), jnp.asarray(mask), jax.random.PRNGKey(1), rate=rate))
  zero_rows = np.all(out == 0, axis=-1)
  for r, n in enumerate(lengths):
    assert zero_rows[r, :n].sum() == int(n * rate), (r, n)
    assert not zero_rows[r, n:].any()
  kept = ~zero_rows
  np.testing.assert_array_equal(out[kept], x[kept])  # untouched rows, padding included: no 1/(1-p)
  # Rows of the same length drop different positions (randomness per example).
  same = [r for r, n in enumerate(lengths) if n == 30]
  assert len({tuple(np.flatnonzero(zero_rows[r])) for r in same}) == len(same)


@pytest.mark.parametrize("rate", RATES)
def test_feature_cutoff_zeroes_int_d_rate_columns_at_every_real_position(rate):
  L, D = 6, 30
  lengths = [6, 3, 1, 6, 5]
  mask = _mask(lengths, L)
  x = np.random.default_rng(1).uniform(1, 2, size=(len(lengths), L, D)).astype(np.float32)
  out = np.asarray(augment.feature_cutoff(jnp.asarray(x), jnp.asarray(mask), jax.random.PRNGKey(2), rate=rate))
  cols = []
  for r, n in enumerate(lengths):
    zero = out[r, :n] == 0
    col_zero = zero.all(axis=0)
    assert col_zero.sum() == int(D * rate)
    assert (zero == col_zero[None, :]).all()  # whole columns, nothing else
    np.testing.assert_array_equal(out[r, :n][:, ~col_zero], x[r, :n][:, ~col_zero])
    np.testing.assert_array_equal(out[r, n:], x[r, n:])  # padding untouched
    cols.append(tuple(np.flatnonzero(col_zero)))
  assert len(set(cols)) > 1


@pytest.mark.parametrize("rate", RATES)
def test_dropout_zeroes_exactly_int_n_d_rate_elements_without_rescaling(rate):
  L, D = 7, 9
  lengths = [7, 1, 4, 7, 2]
  mask = _mask(lengths, L)
  x = np.random.default_rng(2).uniform(1, 2, size=(len(lengths), L, D)).astype(np.float32)
  out = np.asarray(augment.dropout(jnp.asarray(x), jnp.asarray(mask), jax.random.PRNGKey(3), rate=rate))
  for r, n in enumerate(lengths):
    zero = out[r, :n] == 0
    assert zero.sum() == int(n * D * rate), (r, n)
    np.testing.assert_array_equal(out[r, :n][~zero], x[r, :n][~zero])
    np.testing.assert_array_equal(out[r, n:], x[r, n:])


def test_counts_are_python_float64_products_where_float32_differs():
  # int(100 * 0.29) = 28 and int(25 * 32 * 0.29) = 231 in Python; float32 products give 29 and 232.
  assert int(100 * 0.29) != math.floor(np.float32(100) * np.float32(0.29))
  mask = jnp.asarray(_mask([100, 100], 100))
  keep = np.asarray(augment.token_cutoff_keep(mask, jax.random.PRNGKey(0), rate=0.29))
  assert list((~keep).sum(axis=1)) == [28, 28]
  mask = jnp.asarray(_mask([25], 25))
  keep = np.asarray(augment.dropout_keep(mask, jax.random.PRNGKey(0), dim=32, rate=0.29))
  assert int((~keep).sum()) == 231


@pytest.mark.parametrize("rate", RATES)
def test_span_cutoff_keeps_one_contiguous_span(rate):
  L, D = 20, 4
  lengths = list(range(1, L + 1)) * 200
  mask = _mask(lengths, L)
  keep = np.asarray(augment.span_keep(jnp.asarray(mask), jax.random.PRNGKey(4), rate=rate))
  starts = collections.defaultdict(set)
  for r, n in enumerate(lengths):
    span = max(int(n * (1 - rate)), 1)
    idx = np.flatnonzero(keep[r])
    assert len(idx) == span and idx[-1] - idx[0] == span - 1 and idx[-1] < n, (r, n)
    starts[n].add(idx[0])
  for n in (10, 20):  # every start position 0..n-span occurs
    assert starts[n] == set(range(n - max(int(n * (1 - rate)), 1) + 1))
  x = np.random.default_rng(3).normal(size=(len(lengths), L, D)).astype(np.float32)
  pad = np.full((D,), 7.0, np.float32)
  out, attn = augment.span_cutoff(jnp.asarray(x), jnp.asarray(mask), jax.random.PRNGKey(4), rate=rate,
                                  pad_embedding_D=jnp.asarray(pad))
  np.testing.assert_array_equal(np.asarray(attn), keep)
  np.testing.assert_array_equal(np.asarray(out)[keep], x[keep])
  np.testing.assert_array_equal(np.asarray(out)[~keep], np.broadcast_to(pad, ((~keep).sum(), D)))


def test_fgv_noise_is_eps_times_the_per_token_unit_gradient():
  g = np.random.default_rng(4).normal(size=(2, 5, 6)).astype(np.float32)
  mask = _mask([5, 3], 5)
  noise = np.asarray(augment.fgv_noise(jnp.asarray(g), jnp.asarray(mask), eps=0.5))
  expected = 0.5 * g / (np.linalg.norm(g, axis=-1, keepdims=True) + 1e-10)
  np.testing.assert_allclose(noise[mask], expected[mask], rtol=1e-6)
  assert (noise[~mask] == 0).all()
  np.testing.assert_allclose(np.linalg.norm(noise[mask], axis=-1), 0.5, rtol=1e-6)


@pytest.mark.parametrize("view,rate", [("shuffle", 0.0), ("token_cutoff", 0.15), ("feature_cutoff", 0.2),
                                       ("dropout", 0.2), ("span_cutoff", 0.3), ("none", 0.0)])
def test_objective_views_are_the_pure_augmentations_on_the_embedding_output(view, rate):
  cfg = TINY.replace(pooling="enc_first")
  tokens = jnp.asarray(_tokens([12, 6, 3, 9], 12, seed=2))
  mask = tokens > 0
  params = _params(cfg)
  model = SentenceT5(cfg)
  key = jax.random.PRNGKey(11)
  plan = augment.sample_plan(view, mask, key, rate=rate, dim=cfg.t5.emb_dim)
  got = objective.Tower(model, None, shuffle_tokens=False)(params, tokens, plan, jax.random.PRNGKey(0))
  # The tower's output is the pooled vector before L2 normalisation (SentenceT5.project).
  apply = lambda **kw: model.apply({"params": params}, tokens, method="project", **kw)  # noqa: E731
  x = model.apply({"params": params}, tokens, method="embed_tokens")
  if view == "shuffle":
    want = apply(positions_BxL=augment.shuffle_positions(mask, key))
  elif view == "span_cutoff":
    pad_D = params["token_embedder"]["embedding"][0]
    x_span, attn = augment.span_cutoff(x, mask, key, rate=rate, pad_embedding_D=pad_D)
    want = apply(embeddings_BxLxD=x_span, attention_mask_BxL=attn)
  elif view == "none":
    want = apply()
  else:
    want = apply(embeddings_BxLxD=getattr(augment, view)(x, mask, key, rate=rate))
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6)
  if view != "none":
    assert np.abs(np.asarray(want) - np.asarray(apply())).max() > 1e-4


# ------------------------------------------------------------------------------ NT-Xent


def _nt_xent_numpy(a, b, tau):
  """L_con (mean over the 2N anchors) and its gradient w.r.t. the unnormalised a, b."""
  na, nb = np.linalg.norm(a, axis=1, keepdims=True), np.linalg.norm(b, axis=1, keepdims=True)
  ah, bh = a / na, b / nb
  N = len(a)
  eye = np.eye(N)

  def direction(x, y):  # anchors x, positives y_i, negatives y_j (j != i) and x_k (k != i)
    cross, same = x @ y.T / tau, x @ x.T / tau
    same = np.where(eye > 0, -np.inf, same)
    z = np.concatenate([cross, same], 1)
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    loss = np.mean(np.log(np.exp(z - z.max(1, keepdims=True)).sum(1)) + z.max(1) - np.diag(cross))
    g_cross = (p[:, :N] - eye) / (N * tau)
    g_same = p[:, N:] / (N * tau)
    dx = g_cross @ y + (g_same + g_same.T) @ x
    dy = g_cross.T @ x
    return loss, dx, dy

  la, dah, dbh1 = direction(ah, bh)
  lb, dbh, dah2 = direction(bh, ah)
  dah, dbh = 0.5 * (dah + dah2), 0.5 * (dbh + dbh1)

  def through_norm(xh, n, d):
    return (d - np.sum(xh * d, axis=1, keepdims=True) * xh) / n

  return 0.5 * (la + lb), la, lb, through_norm(ah, na, dah), through_norm(bh, nb, dbh)


@pytest.mark.parametrize("n,tau", [(6, 0.1), (1, 0.1), (16, 0.05)])
def test_nt_xent_loss_and_gradient_match_numpy(n, tau):
  rng = np.random.default_rng(n)
  a = rng.normal(size=(n, 5)) * 3
  b = a + rng.normal(size=(n, 5))
  loss, la, lb, ga, gb = _nt_xent_numpy(a, b, tau)
  (l, m), (ja, jb) = jax.value_and_grad(lambda x, y: losses.nt_xent_loss(x, y, temperature=tau), argnums=(0, 1),
                                        has_aux=True)(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32))
  assert float(l) == pytest.approx(loss, rel=1e-5)
  assert float(m["loss_a"]) == pytest.approx(la, rel=1e-5) and float(m["loss_b"]) == pytest.approx(lb, rel=1e-5)
  np.testing.assert_allclose(np.asarray(ja), ga, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(np.asarray(jb), gb, rtol=1e-4, atol=1e-6)


def test_nt_xent_has_2n_minus_2_negatives():
  # Orthogonal anchors, identical views: each anchor sees its positive at cosine 1 and
  # 2N-2 negatives at cosine 0, so L = log(e^{1/t} + (2N-2)) - 1/t exactly.
  N, tau = 5, 0.5
  x = jnp.eye(N, 8)
  loss, m = losses.nt_xent_loss(x, x, temperature=tau)
  assert float(loss) == pytest.approx(math.log(math.exp(1 / tau) + 2 * N - 2) - 1 / tau, rel=1e-5)
  assert float(m["accuracy"]) == 1.0


# ------------------------------------------------------------------------------ NLI head


def test_nli_head_features_parameters_and_logical_axes():
  u, v = np.random.default_rng(5).normal(size=(2, 3, 4)).astype(np.float32)
  want = np.concatenate([u, v, np.abs(u - v), np.maximum(u, v) ** 2], axis=1)
  np.testing.assert_allclose(np.asarray(nli_pair_features(jnp.asarray(u), jnp.asarray(v))), want, rtol=1e-6)

  cfg, joint = TINY, ConsertJoint()
  boxed = joint.abstract_params(cfg)
  specs = {k: tuple(s) for k, s in tree.flatten(nn.get_partition_spec(boxed)).items()}
  assert specs["nli_classifier/kernel"] == ("nli_features", "nli_classes")
  assert specs["nli_classifier/bias"] == ("nli_classes",)
  shapes = tree.flatten(nn.unbox(boxed))
  assert shapes["nli_classifier/kernel"].shape == (4 * 16, 3) and shapes["nli_classifier/bias"].shape == (3,)
  assert "nli_classifier/kernel" not in tree.flatten(nn.unbox(abstract_params(TINY)))
  params = _params(cfg, objective=joint)
  model = joint.make_model(cfg)
  u16, v16 = (jnp.asarray(np.random.default_rng(6).normal(size=(3, 16)), jnp.float32) for _ in range(2))
  logits = model.apply({"params": params}, u16, v16, method="classify")
  w, bias = params["nli_classifier"]["kernel"], params["nli_classifier"]["bias"]
  np.testing.assert_allclose(np.asarray(logits), np.asarray(nli_pair_features(u16, v16)) @ np.asarray(w) + bias,
                             rtol=1e-5, atol=1e-6)
  # The tower's output does not depend on the head.
  np.testing.assert_array_equal(np.asarray(model.apply({"params": params}, jnp.ones((2, 5), jnp.int32))),
                                np.asarray(SentenceT5(TINY).apply({"params": {k: v for k, v in params.items()
                                                                             if k != "nli_classifier"}},
                                                                  jnp.ones((2, 5), jnp.int32))))
  with pytest.raises(ValueError, match="nli_classes"):
    ConsertJoint(nli_classes=1)


# ---------------------------------------------------------------------------- objectives


def _tc(objective, views=("none", 0.0, "none", 0.0), **kw):
  """A TrainConfig with a ConSERT objective; its settings as keywords (view1=..., weight=..., nli_classes=...)."""
  fields = {"view1", "view1_rate", "view2", "view2_rate", "temperature", "weight", "shuffle", "nli_classes"}
  settings = dict(view1=views[0], view1_rate=views[1], view2=views[2], view2_rate=views[3])
  settings.update({k: kw.pop(k) for k in list(kw) if k in fields})
  cls = {"consert_unsup": ConsertUnsup, "consert_joint": ConsertJoint}.get(objective)
  base = dict(num_train_steps=8, global_batch_size=16, checkpoint_every=100, log_every=1, eval_every=-1,
              objective=cls(**settings) if cls else objective,
              optimizer=optim.OptimizerConfig(learning_rate=1e-2, epsilon1=1e-6))
  base.update(kw)
  return train.TrainConfig(**base)


def _batch(kind, B=16, seed=0):
  mesh = partitioning.make_mesh(partitioning.MeshConfig(1, 1, 1), devices=jax.devices()[:1])
  cls = synthetic.SyntheticSentences if kind == "sentences" else synthetic.SyntheticNliPairs
  return jax.device_get(next(cls(mesh, B, seed)))


@pytest.mark.parametrize("objective_name,views,model", [
    ("consert_unsup", ("shuffle", 0.0, "feature_cutoff", 0.2), TINY.replace(pooling="enc_first")),
    ("consert_joint", ("none", 0.0, "token_cutoff", 0.1), TINY),
    ("consert_joint", ("span_cutoff", 0.2, "dropout", 0.2), TINY),
])
def test_grad_cache_equals_the_full_batch_gradient(objective_name, views, model):
  batch = _batch("sentences" if objective_name == "consert_unsup" else "nli")
  tc = _tc(objective_name, views)
  params = _params(model, objective=tc.objective)
  sm = tc.objective.make_model(model)
  key = jax.random.PRNGKey(3)
  full = _vg(tc, model, sm)
  cached = _vg(_tc(objective_name, views, grad_cache_chunks=4), model, sm)
  (loss, metrics), grads = jax.jit(full)(params, batch, key)
  (loss_c, metrics_c), grads_c = jax.jit(cached)(params, batch, key)
  assert float(loss_c) == pytest.approx(float(loss), rel=1e-5)
  for k in metrics:
    assert float(metrics_c[k]) == pytest.approx(float(metrics[k]), rel=1e-5, abs=1e-6), k
  flat, flat_c = tree.flatten(grads), tree.flatten(grads_c)
  assert flat.keys() == flat_c.keys()
  for k in flat:
    np.testing.assert_allclose(flat_c[k], flat[k], atol=1e-5, rtol=1e-4, err_msg=k)
  if objective_name == "consert_joint":
    assert np.abs(flat["nli_classifier/kernel"]).max() > 0


def test_joint_loss_is_cross_entropy_plus_weighted_nt_xent_directions():
  model = TINY
  batch = _batch("nli")
  tc = _tc("consert_joint", ("none", 0.0, "token_cutoff", 0.1), weight=0.25, temperature=0.07)  # not the defaults
  params = _params(model, objective=tc.objective)
  sm = tc.objective.make_model(model)
  key = jax.random.PRNGKey(4)
  (loss, metrics), _ = _vg(tc, model, sm)(params, batch, key)
  # Recompute from the towers: CE of the first views, + 0.25 (loss_a + loss_b) per side at tau 0.07.
  spec = tc.objective.spec(model, tc)
  tower = objective.Tower(sm, None, shuffle_tokens=spec.shuffle_tokens)
  embs, normed = {}, {}
  for n, (tokens, plan, k) in objective.plan_towers(spec, batch, key, dim=32).items():
    seen, hooks = tower.inputs(params, tokens, plan)
    run = functools.partial(sm.apply, {"params": params}, seen, deterministic=False, rngs={"dropout": k}, **hooks)
    embs[n] = np.asarray(run(method="project"), np.float64)  # pooled + projected, before normalisation
    normed[n] = np.asarray(run(), np.float64)  # what inference returns
    # The raw vector is the inference output before its L2 normalisation, and far from unit length.
    np.testing.assert_allclose(embs[n] / np.linalg.norm(embs[n], axis=1, keepdims=True), normed[n], atol=1e-5)
    assert np.abs(np.linalg.norm(embs[n], axis=1) - 1).min() > 0.2

  def numpy_ce(u, v):  # ConSERT's head: softmax over W [u, v, |u - v|, max(u, v)^2] + b (the official code)
    f = np.concatenate([u, v, np.abs(u - v), np.maximum(u, v) ** 2], axis=1)
    logits = f @ np.asarray(params["nli_classifier"]["kernel"], np.float64) + np.asarray(
        params["nli_classifier"]["bias"], np.float64)
    logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    return -np.mean(logp[np.arange(16), batch[LABELS]])

  ce = numpy_ce(embs["premise1"], embs["hypothesis1"])
  # The head reads the un-normalised vectors: the normalised ones give another loss.
  assert abs(numpy_ce(normed["premise1"], normed["hypothesis1"]) - ce) > 1e-3
  con = sum(2 * _nt_xent_numpy(embs[f"{s}1"], embs[f"{s}2"], 0.07)[0] for s in ("premise", "hypothesis"))
  assert float(metrics["nli_loss"]) == pytest.approx(ce, rel=1e-5)
  assert float(loss) == pytest.approx(ce + 0.25 * con, rel=1e-5)
  assert not np.allclose(embs["premise1"], embs["premise2"])


def test_adversarial_view_perturbs_the_first_view_by_fgv_of_the_nli_gradient():
  model = TINY
  batch = _batch("nli")
  tc = _tc("consert_joint", ("none", 0.0, "adversarial", 0.5))
  params = _params(model, objective=tc.objective)
  sm = tc.objective.make_model(model)
  spec = tc.objective.spec(model, tc)
  tower = objective.Tower(sm, None, shuffle_tokens=spec.shuffle_tokens)
  towers = objective.plan_towers(spec, batch, jax.random.PRNGKey(5), dim=32)
  embs = objective._adversarial_embeddings(tower, spec, params, batch, towers)
  # By hand: gradient of the NLI cross-entropy w.r.t. both sides' embedding outputs.
  emb = lambda t: sm.apply({"params": params}, t, method="embed_tokens")  # noqa: E731
  xp, xh = emb(batch[LEFT]), emb(batch[RIGHT])

  def ce(xp, xh):  # on the un-normalised tower outputs, as the official head
    u = sm.apply({"params": params}, batch[LEFT], embeddings_BxLxD=xp, method="project")
    v = sm.apply({"params": params}, batch[RIGHT], embeddings_BxLxD=xh, method="project")
    logits = sm.apply({"params": params}, u, v, method="classify")
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(16), batch[LABELS]])

  gp, gh = jax.grad(ce, argnums=(0, 1))(xp, xh)
  for side, x, g, tok in (("premise", xp, gp, batch[LEFT]), ("hypothesis", xh, gh, batch[RIGHT])):
    mask = tok > 0
    want = sm.apply({"params": params}, tok, embeddings_BxLxD=x + augment.fgv_noise(g, mask, eps=0.5),
                    method="project")
    np.testing.assert_allclose(np.asarray(embs[f"{side}2"]), np.asarray(want), atol=1e-5)
    np.testing.assert_allclose(np.asarray(embs[f"{side}1"]),
                               np.asarray(sm.apply({"params": params}, tok, method="project")), atol=1e-6)
    assert np.abs(np.asarray(embs[f"{side}2"]) - np.asarray(embs[f"{side}1"])).max() > 1e-3
  (loss, m), grads = jax.jit(_vg(tc, model, sm))(params, batch, jax.random.PRNGKey(5))
  assert np.isfinite(float(loss)) and all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))


@pytest.mark.parametrize("objective_name,views,model,chunks", [
    ("consert_unsup", ("feature_cutoff", 0.2, "shuffle", 0.0), TINY, 0),
    ("consert_joint", ("none", 0.0, "token_cutoff", 0.1), TINY.replace(pooling="enc_first"), 2),
])
def test_objectives_train_through_build_on_a_mesh(objective_name, views, model, chunks):
  mesh = partitioning.make_mesh(partitioning.MeshConfig(4, 2, 1))
  tc = _tc(objective_name, views, global_batch_size=32, grad_cache_chunks=chunks)
  setup = train.build(model, tc, mesh)
  data = (synthetic.SyntheticSentences if objective_name == "consert_unsup" else synthetic.SyntheticNliPairs)
  with jax.set_mesh(mesh):
    state = train.init_state(setup, model, seed=0)
    it = data(mesh, 32, 0, cycle=1)
    history = []
    for _ in range(6):
      state, m = setup.step_fn(state, next(it))
      history.append({k: float(v) for k, v in jax.device_get(m).items()})
  assert all(np.isfinite(h["loss"]) and h["grad_norm"] > 0 for h in history)
  # Fixed data, fresh views every step: the loss falls on average.
  assert np.mean([h["loss"] for h in history[-3:]]) < 0.9 * np.mean([h["loss"] for h in history[:3]])
  assert {"loss", "accuracy", "grad_norm", "learning_rate"} <= history[0].keys()
  if objective_name == "consert_joint":
    assert {"nli_loss", "nt_xent_premise", "nt_xent_hypothesis"} <= history[0].keys()
    sharding = state.params["nli_classifier"]["kernel"].sharding
    assert sharding.is_fully_replicated


@pytest.mark.parametrize("kw,model,match", [
    (dict(objective="simcse"), TINY, "objective must be an objective such as"),
    (dict(objective="consert_joint", view1="cutout"), TINY, "ConsertJoint.view1 must be one of"),
    (dict(view1="cutout"), TINY, "ConsertUnsup.view1 must be one of"),
    (dict(view2="token_cutoff", view2_rate=0.0), TINY, r"ConsertUnsup.view2_rate must be in \(0, 1\)"),
    (dict(view1="adversarial", view1_rate=1.0), TINY, "only be the second view"),
    (dict(view2="adversarial", view2_rate=1.0), TINY, r"use @ConsertJoint\(\)"),
    (dict(objective="consert_joint", nli_classes=1), TINY, "ConsertJoint.nli_classes must be at least 2"),
    (dict(shuffle="tokens"), TINY.replace(pooling="enc_first"), "not enc_first"),
    (dict(objective="consert_joint", view2="adversarial", view2_rate=1.0, grad_cache_chunks=2), TINY, "GradCache"),
    (dict(weight=0.0), TINY, "ConsertUnsup.weight must be > 0"),
    (dict(temperature=0.0), TINY, "ConsertUnsup.temperature must be > 0"),
])
def test_bad_consert_configs_are_refused_at_build(kw, model, match):
  mesh = partitioning.make_mesh(partitioning.MeshConfig(1, 1, 1), devices=jax.devices()[:1])
  with pytest.raises(ValueError, match=match):
    train.build(model, _tc(kw.pop("objective", "consert_unsup"), **kw), mesh)


# ---------------------------------------------------------- checkpoints, export, continuation


def test_joint_model_loads_without_its_head_exports_and_continues_unsupervised(tmp_path, vocab_path):
  from st5_jax.checkpoints import native
  from st5_jax.encoder import SentenceEncoder
  from st5_jax.export.api import export_model

  joint_cfg = configs.ST5Config(t5=configs.t5_size("t5_tiny", dropout_rate=0.0), embedding_dim=16)
  mesh = partitioning.MeshConfig(data=-1, fsdp=2)
  joint_dir = tmp_path / "joint"
  train.train(workdir=joint_dir, model_config=joint_cfg, train_config=_tc("consert_joint", ("none", 0.0, "token_cutoff", 0.1),
                                                                            num_train_steps=2),
              make_iterator=synthetic.nli_factory(), mesh_config=mesh, vocab_file=vocab_path, progress=False)
  saved_cfg, saved, _ = native.load_params(joint_dir)
  assert saved_cfg == joint_cfg and set(saved["nli_classifier"]) == {"kernel", "bias"}

  sentences = ["A man is playing a guitar.", "Two dogs run on the beach.", "Nobody is here."]
  enc = SentenceEncoder.load(str(joint_dir))
  assert "nli_classifier" not in enc.params
  emb = enc.encode(sentences)
  tower = {k: v for k, v in saved.items() if k != "nli_classifier"}
  tokens = jnp.asarray(vocab_lib.pad_batch(enc.tokenizer.encode(sentences, max_length=128), 16))
  direct = SentenceT5(joint_cfg).apply({"params": tower}, tokens)
  np.testing.assert_allclose(emb, np.asarray(direct), atol=1e-5)

  for fmt in ("sentence-transformers", "savedmodel"):
    out = tmp_path / fmt
    export_model(str(joint_dir), format=fmt, out=out, platforms=("cpu",))
    np.testing.assert_allclose(SentenceEncoder.load(str(out)).encode(sentences), emb, atol=1e-5, err_msg=fmt)

  # init_from keeps the head for a joint run, drops it for NT-Xent only, initialises a fresh one
  # from a model without it.
  joint_init = ConsertJoint().init_from(str(joint_dir), joint_cfg, init_projection="auto", seed=0)
  np.testing.assert_array_equal(joint_init["nli_classifier"]["kernel"], np.asarray(saved["nli_classifier"]["kernel"]))
  unsup_cfg = joint_cfg
  assert "nli_classifier" not in ConsertUnsup().init_from(str(joint_dir), unsup_cfg, init_projection="auto", seed=0)
  fresh = ConsertJoint().init_from(str(tmp_path / "sentence-transformers"), joint_cfg, init_projection="auto",
                                   seed=0)
  assert fresh["nli_classifier"]["kernel"].shape == (64, 3)

  # joint-unsup: NT-Xent only, started from the joint work dir.
  cont = train.train(workdir=tmp_path / "joint_unsup", model_config=unsup_cfg,
                     train_config=_tc("consert_unsup", ("none", 0.0, "shuffle", 0.0), num_train_steps=2),
                     make_iterator=synthetic.sentences_factory(), mesh_config=mesh, vocab_file=vocab_path,
                     progress=False, init_from=str(joint_dir))
  assert cont.step == 2 and cont.summary["init_from"] == str(joint_dir)
  assert np.isfinite(cont.summary["final_metrics"]["loss"])

  # A work dir written before the NLI head moved to the objective (2026-12) has `nli_classes` in
  # its config: it still loads (the head reported unused) and exports.
  cfg_path = joint_dir / native.CONFIG_FILE
  old = json.loads(cfg_path.read_text())
  old["nli_classes"] = 3
  cfg_path.write_text(json.dumps(old))
  np.testing.assert_allclose(SentenceEncoder.load(str(joint_dir)).encode(sentences), emb, atol=1e-5)
  export_model(str(joint_dir), format="sentence-transformers", out=tmp_path / "old_st", platforms=("cpu",))
  np.testing.assert_allclose(SentenceEncoder.load(str(tmp_path / "old_st")).encode(sentences), emb, atol=1e-5)


# ------------------------------------------------------------------- global batch, 2 processes

WORKER = os.path.join(os.path.dirname(__file__), "consert_multihost_worker.py")


def _worker_env(devices, **extra):
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags(devices),
             JAX_ENABLE_COMPILATION_CACHE="false")  # no cache guard here: see conftest.py
  env.update(extra)
  return env


def test_nt_xent_is_over_the_global_batch_across_two_processes(tmp_path):
  import consert_multihost_worker as worker

  steps = 3
  one_json = tmp_path / "one.json"
  subprocess.run([sys.executable, WORKER, str(tmp_path / "one"), str(one_json), str(steps)], env=_worker_env(4),
                 check=True, capture_output=True, timeout=900)
  two_json = tmp_path / "two.json"
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  procs = [subprocess.Popen([sys.executable, WORKER, str(tmp_path / "two"), str(two_json), str(steps)],
                            env=_worker_env(2, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2",
                                            JAX_PROCESS_ID=str(i)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(2)]
  for p in procs:
    _, err = p.communicate(timeout=900)
    assert p.returncode == 0, err.decode()[-4000:]
  one, two = json.loads(one_json.read_text()), json.loads(two_json.read_text())
  assert (two["processes"], two["devices"], two["local_devices"]) == (2, 4, 2)
  assert len(two["losses"]) == steps
  np.testing.assert_allclose(two["losses"], one["losses"], rtol=1e-5)

  # Step 1 recomputed in this process on the whole global batch: the two processes' loss is the
  # global one (each anchor against all 2 x 16 - 2 negatives), not a mean of per-process losses.
  tc = worker.train_config(steps)
  model = SentenceT5(worker.MODEL)
  params = nn.unbox(model.init(jax.random.PRNGKey(tc.seed), jnp.ones((1, 8), jnp.int32))["params"])
  mesh1 = partitioning.make_mesh(partitioning.MeshConfig(1, 1, 1), devices=jax.devices()[:1])
  batch = jax.device_get(next(synthetic.SyntheticSentences(mesh1, 16, tc.seed)))
  key = jax.random.fold_in(jax.random.PRNGKey(tc.seed), 0)
  (loss, _), _ = _vg(tc, worker.MODEL, model)(params, batch, key)
  assert two["losses"][0] == pytest.approx(float(loss), rel=1e-5)
  spec = tc.objective.spec(worker.MODEL, tc)
  tower = objective.Tower(model, None, shuffle_tokens=spec.shuffle_tokens)
  embs = {n: tower(params, *t) for n, t in objective.plan_towers(spec, batch, key, dim=32).items()}
  per_process = np.mean([0.3 * float(losses.nt_xent_loss(embs["view1"][h], embs["view2"][h], temperature=0.1)[0])
                         for h in (slice(0, 8), slice(8, 16))])
  assert abs(per_process - two["losses"][0]) > 0.05 * abs(two["losses"][0])


# ---------------------------------------------------------------------------------- tasks


def test_sts_sentences_task_is_the_papers_89192_sentences(data_dir):
  import seqio
  from st5_jax.objectives.consert import tasks
  from st5_jax.evaluation import readers

  sents = tasks.sts_sentences(str(data_dir))
  assert len(sents) == 89_192  # the paper's count: every pair's two sentences, duplicates kept
  assert len(set(sents)) == 47_408
  # STS15/16 lines without a gold score are part of it (8500 - 3000 and 9183 - 1186 pairs).
  scored = sum(len(readers.read_sts(data_dir, year=y)) for y in readers.STS_SUBSETS)
  assert scored == 3108 + 1500 + 3750 + 3000 + 1186
  evaluated = set()
  for y in readers.STS_SUBSETS:
    p = readers.read_sts(data_dir, year=y)
    evaluated |= set(p.sents1) | set(p.sents2)
  for split in ("train", "dev", "test"):
    p = readers.read_stsb(data_dir, split=split)
    evaluated |= set(p.sents1) | set(p.sents2)
  assert evaluated <= set(sents)  # transductive: the evaluation texts themselves

  task = seqio.get_mixture_or_task(tasks.STS_SENTENCES)
  for split, n in (("train", 89_192), ("unique", 47_408)):
    assert int(task.source.get_dataset(split, shuffle=False).cardinality()) == n
    assert task.num_input_examples(split) == n
  vocab = task.output_features["inputs"].vocabulary
  ds = task.get_dataset(sequence_length={"inputs": 8}, split="unique", shuffle=False)
  for ex, text in zip(ds.take(3).as_numpy_iterator(), list(dict.fromkeys(sents))[:3]):
    tokens = ex["inputs"]
    assert tokens[-1] == 1 and len(tokens) <= 8  # EOS kept after truncation
    assert tokens[:-1].tolist() == list(vocab.encode(text))[:len(tokens) - 1]
  with pytest.raises(ValueError, match="splits 'train' and 'unique'"):
    task.source.get_dataset("validation")


def test_snli_devtest_pairs_task_labels(data_dir):
  import seqio
  from st5_jax.objectives.consert import tasks

  task = seqio.get_mixture_or_task(tasks.SNLI_DEVTEST_PAIRS)
  folder = data_dir / "nli" / "snli_senteval_devtest"
  for split, part in (("train", "dev"), ("validation", "test")):
    ds = task.source.get_dataset(split, shuffle=False)
    labels = np.concatenate([b["label"] for b in ds.batch(20000).as_numpy_iterator()])
    names = (folder / f"labels.{part}").read_text().split()
    np.testing.assert_array_equal(labels, [tasks.LABEL2INT[n] for n in names])
    first = next(ds.as_numpy_iterator())
    assert first["inputs"].decode() == " ".join((folder / f"s1.{part}").read_text().split("\n")[0].split())
  ex = next(task.get_dataset(sequence_length={"inputs": 64, "targets": 64}, split="train",
                             shuffle=False).as_numpy_iterator())
  assert ex["inputs"][-1] == 1 and ex["targets"][-1] == 1 and ex["label"].dtype == np.int32
  assert int(task.source.get_dataset("all", shuffle=False).cardinality()) == 9842 + 9824


def test_snli_mnli_pairs_task_reads_the_users_jsonl(tmp_path, monkeypatch):
  import seqio
  from st5_jax.objectives.consert import tasks
  from st5_jax.errors import InputFileError

  monkeypatch.setenv("ST5_DATA_DIR", str(tmp_path))
  task = seqio.get_mixture_or_task(tasks.SNLI_MNLI_PAIRS)
  with pytest.raises(InputFileError, match="snli_full,mnli_full"):
    task.source.get_dataset("train")
  rows = {tasks.SNLI_TRAIN: [("A dog runs.", "An animal moves.", "entailment"), ("A cat.", "A cow.", "-"),
                             ("Kids play.", "Nobody plays.", "contradiction")],
          tasks.MNLI_TRAIN: [("Prices rose.", "Costs went up a lot.", "neutral")]}
  for rel, rs in rows.items():
    path = tmp_path / rel
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps({"sentence1": a, "sentence2": b, "gold_label": c}) + "\n" for a, b, c in rs))
  got = list(task.source.get_dataset("train", shuffle=False).as_numpy_iterator())
  assert [(g["inputs"].decode(), g["targets"].decode(), int(g["label"])) for g in got] == [
      ("A dog runs.", "An animal moves.", 1), ("Kids play.", "Nobody plays.", 0),
      ("Prices rose.", "Costs went up a lot.", 2)]  # the pair without a gold label is dropped
