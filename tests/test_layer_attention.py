"""Layer-wise attention pooling (Oh et al. 2022): the equations against NumPy and Hugging Face
hidden states, RReLU noise, gradients, scan, meshes, the SimCSE loss, load-time removal, export."""

import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import synthetic
from st5_jax import SentenceEncoder, configs, losses, optim, partitioning, train
from st5_jax.objectives import Contrastive
from st5_jax.checkpoints import hf, native, tree
from st5_jax.checkpoints.loader import load_model
from st5_jax.model import SentenceT5, init_params
from st5_jax.model.layer_attention import LayerAttentionPooling, RRELU_LOWER, RRELU_UPPER

EVAL_SLOPE = 11.0 / 48.0
SENTENCES = ["A man is playing a guitar.", "Hello world", "", "The quick brown fox jumps over the lazy dog. " * 30,
             "Sentence-T5 turns T5 into a sentence encoder."]


def _lap_config(size="t5_tiny", *, token="first", norm=True, embedding_dim=16, **t5_kw):
  return configs.ST5Config(t5=configs.t5_size(size, **t5_kw), pooling="layer_attention", embedding_dim=embedding_dim,
                           layer_attention_token=token, layer_attention_norm=norm, max_length=32)


# ------------------------------------------------------------------ NumPy re-derivation


def _np_rrelu(x, slope):
  return np.where(x >= 0, x, x * slope)


def _np_layer_attention(states, mask, p, *, token, slopes=None):
  """The official AttentionLayer + MLPLayer (cl/models.py), loop for loop, in float64.

  states: list of N arrays [B, L, D] (h^0..h^L); slopes: None (inference, 11/48) or
  (q [B, N, D], k [B, Q, N, D], v [B, Q, N, D]) for training.
  """
  states = [np.asarray(h, np.float64) for h in states]
  mask = np.asarray(mask, np.float64)
  p = {k: np.asarray(v, np.float64) for k, v in p.items()}
  N, B = len(states), states[0].shape[0]
  idx = np.zeros(B, int) if token == "first" else np.maximum(mask.sum(1).astype(int) - 1, 0)
  source = [h[np.arange(B), idx] for h in states]  # [CLS] of each layer
  target = [(h * mask[..., None]).sum(1) / mask.sum(-1)[:, None] for h in states]  # layer means
  concated = np.stack(target, axis=1)  # [B, N, D]
  outs = []
  for q, src in enumerate(source):
    sq, sk, sv = (EVAL_SLOPE,) * 3 if slopes is None else (slopes[0][:, q], slopes[1][:, q], slopes[2][:, q])
    K = _np_rrelu(concated @ p["key_kernel"], sk)
    V = _np_rrelu(concated @ p["value_kernel"], sv)
    Q = _np_rrelu(src @ p["query_kernel"], sq)
    score = np.einsum("bnd,bd->bn", K, Q) / N
    score = np.exp(score - score.max(-1, keepdims=True))
    score /= score.sum(-1, keepdims=True)
    outs.append((V * score[..., None]).sum(1))
  o = np.stack(outs, axis=1).mean(1)
  cat = np.concatenate([source[-1], o], axis=1)
  return np.tanh(cat @ p["dense_kernel"] + p["dense_bias"])


def _random_states(seed, N=4, B=5, L=7, D=24):  # N != sqrt(D): the 1/N scaling shows
  rng = np.random.default_rng(seed)
  states = rng.normal(size=(N, B, L, D)).astype(np.float32) * np.arange(1, N + 1)[:, None, None, None]
  lengths = np.array([7, 1, 3, 5, 2])[:B]
  mask = np.arange(L)[None, :] < lengths[:, None]
  return states, mask


def _module_params(D, seed=1):
  p = nn.unbox(LayerAttentionPooling().init(jax.random.PRNGKey(seed), jnp.zeros((2, 1, 3, D)), jnp.ones((1, 3), bool)))
  p = p["params"]
  # A non-zero bias, so a dropped bias would show.
  p["dense_bias"] = jax.random.normal(jax.random.PRNGKey(seed + 7), p["dense_bias"].shape) * 0.3
  return p


@pytest.mark.parametrize("token", ["first", "eos"])
def test_pooling_matches_numpy_at_inference(token):
  states, mask = _random_states(0)
  p = _module_params(states.shape[-1])
  got = LayerAttentionPooling(token).apply({"params": p}, jnp.asarray(states), jnp.asarray(mask))
  want = _np_layer_attention(list(states), mask, p, token=token)
  # RReLU's negative side is exercised: about half of the pre-activations are negative.
  assert (np.asarray(states[0][:, 0]) @ np.asarray(p["query_kernel"]) < 0).mean() > 0.3
  np.testing.assert_allclose(np.asarray(got), want, atol=2e-6, rtol=1e-5)
  # The attention weights are sown for analysis: [B, Q, N], rows summing to one.
  _, inter = LayerAttentionPooling(token).apply({"params": p}, jnp.asarray(states), jnp.asarray(mask),
                                                mutable=["intermediates"])
  alpha = np.asarray(inter["intermediates"]["alpha"][0])
  assert alpha.shape == (5, 4, 4)
  np.testing.assert_allclose(alpha.sum(-1), 1.0, atol=1e-6)


@pytest.mark.parametrize("token", ["first", "eos"])
def test_pooling_matches_numpy_in_training_with_the_seeded_slopes(token):
  states, mask = _random_states(1)
  N, B, _, D = states.shape
  p = _module_params(D, seed=2)
  mod = LayerAttentionPooling(token)

  def run(seed):
    return mod.apply({"params": p}, jnp.asarray(states), jnp.asarray(mask), deterministic=False,
                     rngs={"dropout": jax.random.PRNGKey(seed)}, mutable=["intermediates"])

  got, inter = run(3)
  # Re-derive the slopes from the key the module drew from the dropout stream.
  (key,) = inter["intermediates"]["rrelu_key"]
  k_q, k_k, k_v = jax.random.split(key, 3)
  slopes = (np.asarray(jax.random.uniform(k_q, (B, N, D), jnp.float32, RRELU_LOWER, RRELU_UPPER)),
            np.asarray(jax.random.uniform(k_k, (B, N, N, D), jnp.float32, RRELU_LOWER, RRELU_UPPER)),
            np.asarray(jax.random.uniform(k_v, (B, N, N, D), jnp.float32, RRELU_LOWER, RRELU_UPPER)))
  np.testing.assert_allclose(np.asarray(got), _np_layer_attention(list(states), mask, p, token=token, slopes=slopes),
                             atol=2e-6, rtol=1e-5)
  all_slopes = np.concatenate([s.ravel() for s in slopes])
  assert RRELU_LOWER <= all_slopes.min() and all_slopes.max() <= RRELU_UPPER
  assert abs(all_slopes.mean() - EVAL_SLOPE) < 0.01  # U(1/8, 1/3) has mean 11/48
  # Training noise: not the inference output; the same seed repeats; another seed differs.
  det = mod.apply({"params": p}, jnp.asarray(states), jnp.asarray(mask))
  assert np.abs(np.asarray(got) - np.asarray(det)).max() > 1e-4
  np.testing.assert_array_equal(np.asarray(run(3)[0]), np.asarray(got))
  assert np.abs(np.asarray(run(4)[0]) - np.asarray(got)).max() > 1e-4


def test_gradient_reaches_every_layer():
  states, mask = _random_states(2)
  p = _module_params(states.shape[-1], seed=3)
  w = jax.random.normal(jax.random.PRNGKey(0), (states.shape[1], states.shape[-1]))

  for deterministic in (True, False):
    def f(s):
      z = LayerAttentionPooling().apply({"params": p}, s, jnp.asarray(mask), deterministic=deterministic,
                                        rngs={"dropout": jax.random.PRNGKey(5)})
      return jnp.sum(z * w)

    g_NxBxLxD = np.asarray(jax.jit(jax.grad(f))(jnp.asarray(states)))
    for n in range(states.shape[0]):  # every layer h^0..h^L, not just the last
      for b in range(states.shape[1]):
        assert np.abs(g_NxBxLxD[n, b]).sum() > 1e-6, (deterministic, n, b)
    # Padding positions get no gradient (masked means, first token / EOS queries).
    assert np.all(g_NxBxLxD[:, ~mask] == 0)

  # Through the whole tower: every parameter (all encoder layers, the head) gets a gradient.
  cfg = _lap_config(vocab_size=384, dropout_rate=0.0)
  params = nn.unbox(init_params(cfg, jax.random.PRNGKey(0)))
  tokens = jnp.array([[37, 182, 5, 1, 0, 0], [100, 1, 0, 0, 0, 0]])
  grads = jax.jit(jax.grad(lambda q: jnp.sum(SentenceT5(cfg).apply(
      {"params": q}, tokens, deterministic=False, rngs={"dropout": jax.random.PRNGKey(1)})[:, :3])))(params)
  for name, g in tree.flatten(grads).items():
    if name != "token_embedder/embedding":  # only the rows of the tokens used
      assert np.all(np.isfinite(g)) and np.abs(g).max() > 0, name


# ------------------------------------------------------------------ the tower


def _hf_encoder(cfg, params, tmp_path):
  """transformers' T5EncoderModel with our encoder weights (an independent implementation)."""
  import transformers
  from safetensors.numpy import save_file

  flat = {k: np.asarray(v, np.float32) for k, v in tree.flatten(params).items()
          if k == "token_embedder/embedding" or k.startswith("encoder/")}
  sd = hf.to_hf_state_dict(flat)
  sd.pop("encoder.embed_tokens.weight", None)
  d = tmp_path / "hf_encoder"
  d.mkdir()
  (d / "config.json").write_text(json.dumps(dict(hf.hf_config_from_t5(cfg.t5, encoder_only=True), dtype="float32")))
  save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
  return transformers.T5EncoderModel.from_pretrained(str(d)).eval()


@pytest.mark.parametrize("token,norm", [("first", True), ("eos", True), ("first", False)])
def test_tower_matches_numpy_on_transformers_hidden_states(tmp_path, token, norm):
  import torch

  cfg = _lap_config(token=token, norm=norm, vocab_size=384, dropout_rate=0.0)
  params = nn.unbox(init_params(cfg, jax.random.PRNGKey(0)))
  # Non-trivial final norm scale and head bias, so skipping either would show.
  params["encoder"]["encoder_norm"]["scale"] = jax.random.uniform(jax.random.PRNGKey(1), (32,), minval=0.5, maxval=1.5)
  params["layer_attention"]["dense_bias"] = jax.random.normal(jax.random.PRNGKey(2), (32,)) * 0.3
  tokens = np.array([[37, 182, 5, 9, 1, 0, 0, 0], [100, 1, 0, 0, 0, 0, 0, 0], [3, 4, 5, 6, 7, 8, 9, 1]], np.int32)
  mask = tokens > 0
  ours = np.asarray(SentenceT5(cfg).apply({"params": params}, jnp.asarray(tokens)))

  ref = _hf_encoder(cfg, params, tmp_path)
  with torch.no_grad():
    out = ref(input_ids=torch.tensor(tokens, dtype=torch.long), attention_mask=torch.tensor(mask, dtype=torch.long),
              output_hidden_states=True)
  hidden = [h.numpy().astype(np.float64) for h in out.hidden_states]
  assert len(hidden) == cfg.t5.num_encoder_layers + 1
  if norm:  # intermediate states through the encoder's final RMS norm (HF's final_layer_norm)
    scale = ref.encoder.final_layer_norm.weight.detach().numpy().astype(np.float64)
    hidden = [h / np.sqrt(np.mean(h ** 2, -1, keepdims=True) + 1e-6) * scale for h in hidden[:-1]] + hidden[-1:]
  z = _np_layer_attention(hidden, mask, params["layer_attention"], token=token)
  emb = z @ np.asarray(params["projection_layer"]["kernel"], np.float64)
  emb /= np.linalg.norm(emb, axis=-1, keepdims=True)
  np.testing.assert_allclose(ours, emb, atol=2e-5, rtol=1e-4)


def test_norm_option_changes_the_states_read():
  cfg = _lap_config(vocab_size=384, dropout_rate=0.0)
  params = nn.unbox(init_params(cfg, jax.random.PRNGKey(0)))
  tokens = jnp.array([[37, 182, 5, 1]])
  a = SentenceT5(cfg).apply({"params": params}, tokens)
  b = SentenceT5(cfg.replace(layer_attention_norm=False)).apply({"params": params}, tokens)
  assert np.abs(np.asarray(a) - np.asarray(b)).max() > 1e-3


@pytest.mark.parametrize("remat", ["none", "full"])
def test_scanned_equals_unrolled(remat):
  cfg = _lap_config(vocab_size=384, dropout_rate=0.0, remat_policy=remat)
  cfg_scan = cfg.replace(t5=cfg.t5.replace(scan_layers=True))
  params = nn.unbox(init_params(cfg, jax.random.PRNGKey(1)))
  scanned = tree.unflatten(tree.stack_layers({k: np.asarray(v) for k, v in tree.flatten(params).items()}))
  tokens = jnp.array([[37, 1782 % 384, 5, 1, 0, 0], [100, 1, 0, 0, 0, 0]])
  key = jax.random.PRNGKey(3)
  for det in (True, False):  # training too: the same RReLU draw in both
    a = SentenceT5(cfg).apply({"params": params}, tokens, deterministic=det, rngs={"dropout": key})
    b = SentenceT5(cfg_scan).apply({"params": scanned}, tokens, deterministic=det, rngs={"dropout": key})
    np.testing.assert_allclose(a, b, atol=1e-6)

    def loss(c):
      return lambda p: jnp.sum(SentenceT5(c).apply({"params": p}, tokens, deterministic=det, rngs={"dropout": key})[:, 0])

    ga = tree.flatten(jax.grad(loss(cfg))(params))
    gb = tree.unstack_layers({k: np.asarray(v) for k, v in tree.flatten(jax.grad(loss(cfg_scan))(scanned)).items()})
    assert ga.keys() == gb.keys()
    for k, v in ga.items():
      np.testing.assert_allclose(v, gb[k], atol=1e-5, err_msg=k)


@pytest.mark.parametrize("scan", [False, True])
def test_head_parameters_have_logical_axes(scan):
  boxed = init_params(_lap_config(vocab_size=384, scan_layers=scan), jax.random.PRNGKey(0))
  specs = {k: tuple(v) for k, v in tree.flatten(nn.get_partition_spec(boxed)).items()}
  assert specs["layer_attention/query_kernel"] == ("embed", "joined_kv")
  assert specs["layer_attention/key_kernel"] == ("embed", "joined_kv")
  assert specs["layer_attention/value_kernel"] == ("embed", "joined_kv")
  assert specs["layer_attention/dense_kernel"] == ("joined_kv", "embed")
  assert specs["layer_attention/dense_bias"] == ("embed",)
  rules = dict(partitioning.DEFAULT_RULES)
  for spec in specs.values():
    assert all(a in rules for a in spec), spec


# ------------------------------------------------------------------ training on a mesh


LAP_TINY = _lap_config(vocab_size=384, dropout_rate=0.0, scan_layers=True, remat_policy="full")
SIMCSE = dict(objective=Contrastive(loss="simcse", temperature=0.05, hard_negative_weight=1.0))


def _one_step(mesh, model=LAP_TINY):
  tc = train.TrainConfig(num_train_steps=6, global_batch_size=16, checkpoint_every=100, log_every=1, eval_every=-1,
                         optimizer=optim.OptimizerConfig(learning_rate=1e-2, epsilon1=1e-6), **SIMCSE)
  setup = train.build(model, tc, mesh)
  with jax.set_mesh(mesh):
    state = train.init_state(setup, model, seed=0)
    it = synthetic.SyntheticPairs(mesh, 16, 0)
    for _ in range(2):
      state, metrics = setup.step_fn(state, next(it))
  flat = {k: np.asarray(jax.device_get(v)) for k, v in tree.flatten(state.params).items()}
  return setup, flat, jax.device_get(metrics)


def test_sharded_step_equals_unsharded():
  _, ref, ref_m = _one_step(partitioning.make_mesh(partitioning.MeshConfig(1, 1, 1), devices=jax.devices()[:1]))
  setup, got, m = _one_step(partitioning.make_mesh(partitioning.MeshConfig(2, 2, 2)))
  P = jax.sharding.PartitionSpec
  head = setup.state_shardings.params["layer_attention"]
  assert head["query_kernel"].spec == P("fsdp", "model") and head["dense_kernel"].spec == P("model", "fsdp")
  assert np.isfinite(float(m["loss"]))
  assert float(m["loss"]) == pytest.approx(float(ref_m["loss"]), rel=1e-5)
  for k in ref:
    np.testing.assert_allclose(got[k], ref[k], atol=2e-5, rtol=1e-4, err_msg=k)
  # The head trained: its parameters moved from their initial values.
  init = tree.flatten(jax.device_get(nn.unbox(init_params(LAP_TINY, jax.random.PRNGKey(0)))))
  assert np.abs(got["layer_attention/query_kernel"] - np.asarray(init["layer_attention/query_kernel"])).max() > 1e-4


# ------------------------------------------------------------------ the SimCSE loss


def _np_simcse(z1, z2, z3, temp, weight):
  """cl_forward's loss (cl/models.py), with its weights matrix built the same way."""
  def cos(a, b):
    return (a @ b.T) / np.maximum(np.linalg.norm(a, axis=-1)[:, None] * np.linalg.norm(b, axis=-1)[None, :], 1e-8)

  cos_sim = np.concatenate([cos(z1, z2) / temp, cos(z1, z3) / temp], axis=1)
  n3 = z3.shape[0]
  weights = np.array([[0.0] * (cos_sim.shape[-1] - n3) + [0.0] * i + [weight] + [0.0] * (n3 - i - 1)
                      for i in range(n3)])
  logits = cos_sim + weights
  logits = logits - logits.max(-1, keepdims=True)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  return -np.mean(logp[np.arange(len(z1)), np.arange(len(z1))])


@pytest.mark.parametrize("weight", [0.0, 1.0, 2.5])
def test_simcse_loss_matches_the_official_formula(weight):
  rng = np.random.default_rng(0)
  z1, z2, z3 = (rng.normal(size=(6, 8)) * 3 for _ in range(3))  # not unit length: cosine normalises
  kw = Contrastive(loss="simcse", temperature=0.05, hard_negative_weight=weight).loss_kwargs()
  loss, metrics = losses.in_batch_softmax_loss(jnp.asarray(z1), jnp.asarray(z2), jnp.asarray(z3), **kw)
  assert float(loss) == pytest.approx(_np_simcse(z1, z2, z3, 0.05, weight), rel=1e-5)
  # Metrics report similarities, not the weighted logits.
  unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
  assert float(metrics["hard_negative_similarity"]) == pytest.approx(
      np.mean(np.sum(unit(z1) * unit(z3), -1)), rel=1e-5)


def test_simcse_without_weight_is_the_st5_loss_on_unit_vectors():
  rng = np.random.default_rng(1)
  z = [rng.normal(size=(5, 8)) for _ in range(3)]
  z = [jnp.asarray(x / np.linalg.norm(x, axis=-1, keepdims=True)) for x in z]
  a, _ = losses.in_batch_softmax_loss(*z, temperature=0.05)
  b, _ = losses.in_batch_softmax_loss(*z, temperature=0.05, similarity="cosine", hard_negative_weight=0.0)
  c, _ = losses.in_batch_softmax_loss(*z, temperature=0.05, similarity="cosine", hard_negative_weight=1.0)
  assert float(a) == pytest.approx(float(b), rel=1e-6)
  assert float(c) > float(b)  # a bonus on the hard negative's logit makes the task harder


def test_loss_options_are_checked():
  with pytest.raises(ValueError, match="loss must be one of"):
    Contrastive(loss="infonce")
  with pytest.raises(ValueError, match="Contrastive.loss = 'simcse'"):
    Contrastive(hard_negative_weight=1.0)
  with pytest.raises(ValueError, match="similarity"):
    losses.in_batch_softmax_loss(jnp.ones((2, 3)), jnp.ones((2, 3)), similarity="l2")
  with pytest.raises(ValueError, match="layer_attention_token"):
    configs.ST5Config(pooling="layer_attention", layer_attention_token="last")


# ------------------------------------------------------------------ load-time removal


@pytest.fixture(scope="module")
def lap_dir(tmp_path_factory, vocab_path):
  """A layer_attention model folder (full T5 vocabulary, so real text encodes)."""
  d = tmp_path_factory.mktemp("lap") / "model"
  cfg = _lap_config()
  params = jax.device_get(nn.unbox(init_params(cfg, jax.random.PRNGKey(4))))
  params["layer_attention"]["dense_bias"] = np.asarray(
      jax.random.normal(jax.random.PRNGKey(5), params["layer_attention"]["dense_bias"].shape) * 0.3)
  native.save_model(d, cfg, params, step=5, vocab_file=vocab_path)
  return d, cfg, params


def _removed_reference(cfg, params, tokens, pooling):
  """The last layer's first token / mean, then the projection and L2 norm: no head."""
  from st5_jax.model import l2_normalize, mean_pool

  enc = SentenceT5(cfg).apply({"params": params}, jnp.asarray(tokens), method=SentenceT5.encode)
  pooled = enc[:, 0] if pooling == "enc_first" else mean_pool(enc, jnp.asarray(tokens) > 0)
  return np.asarray(l2_normalize(pooled @ params["projection_layer"]["kernel"]))


@pytest.mark.parametrize("pooling", ["enc_first", "enc_mean"])
def test_head_removed_at_load_time(lap_dir, pooling):
  d, cfg, params = lap_dir
  full = SentenceEncoder.load(d)
  assert full.config.pooling == "layer_attention"
  removed = SentenceEncoder.load(d, pooling=pooling)
  assert removed.config.pooling == pooling and removed.dim == full.dim == 16
  assert sorted(removed.report.unused) == sorted(f"layer_attention/{k}" for k in params["layer_attention"])
  assert "layer_attention" not in removed.params
  tokens = removed.tokenizer.encode(SENTENCES[:3], max_length=16)
  from st5_jax import vocab
  batch = vocab.pad_batch(tokens, 16)
  np.testing.assert_allclose(removed.encode_tokens(batch), _removed_reference(cfg, params, batch, pooling), atol=1e-5)
  assert np.abs(full.encode(SENTENCES) - removed.encode(SENTENCES)).max() > 1e-3


def test_a_model_without_a_head_is_not_read_with_one(tmp_path, vocab_path):
  cfg = configs.ST5Config(t5=configs.t5_size("t5_tiny"), pooling="enc_mean", embedding_dim=16)
  native.save_model(tmp_path / "m", cfg, jax.device_get(nn.unbox(init_params(cfg, jax.random.PRNGKey(0)))),
                    vocab_file=vocab_path)
  with pytest.raises(ValueError, match="no layer-attention head"):
    SentenceEncoder.load(tmp_path / "m", pooling="layer_attention")
  # The start of training initialises it (train.py's init_from does this).
  loaded, params, report, _ = load_model(tmp_path / "m", pooling="layer_attention", init_missing_head=True,
                                         rng=jax.random.PRNGKey(1))
  assert loaded.pooling == "layer_attention"
  assert sorted(report.missing_initialised) == sorted(f"layer_attention/{k}" for k in params["layer_attention"])


def test_train_a_head_from_a_checkpoint_without_one(tmp_path, vocab_path):
  base = configs.ST5Config(t5=configs.t5_size("t5_tiny", vocab_size=384, dropout_rate=0.0), embedding_dim=16)
  base_params = jax.device_get(nn.unbox(init_params(base, jax.random.PRNGKey(0))))
  native.save_model(tmp_path / "base", base, base_params, vocab_file=vocab_path)
  tc = train.TrainConfig(num_train_steps=2, global_batch_size=16, checkpoint_every=100, log_every=1, eval_every=-1,
                         **SIMCSE)
  res = train.train(workdir=tmp_path / "work", model_config=base.replace(pooling="layer_attention"), train_config=tc,
                    make_iterator=synthetic.factory(), vocab_file=vocab_path, progress=False,
                    init_from=str(tmp_path / "base"))
  assert res.step == 2 and np.isfinite(res.summary["final_metrics"]["loss"])
  _, trained, _ = native.load_params(tmp_path / "work")
  assert set(trained["layer_attention"]) == {"query_kernel", "key_kernel", "value_kernel", "dense_kernel", "dense_bias"}


# ------------------------------------------------------------------ export


def test_savedmodel_export_matches(lap_dir, tmp_path):
  import tensorflow as tf
  import tensorflow_text  # noqa: F401

  from st5_jax.export import export_model

  d, cfg, _ = lap_dir
  out = tmp_path / "sm"
  summary = export_model(d, format="savedmodel", out=out, platforms=("cpu",))
  assert summary["pooling"] == "layer_attention"
  ours = SentenceEncoder.load(d).encode(SENTENCES)
  got = tf.saved_model.load(str(out))(tf.constant(SENTENCES))[0].numpy()
  np.testing.assert_allclose(got, ours, atol=1e-5, rtol=0)
  card = (out / "README.md").read_text()
  assert "`layer_attention`: layer-wise attention pooling" in card and "removes that attention head" not in card
  # st5_jax reads the head back from the SavedModel's variables.
  config, params, _, fmt = load_model(out)
  assert fmt == "savedmodel" and config.pooling == "layer_attention" and "layer_attention" in params
  np.testing.assert_allclose(SentenceEncoder(config, params, tokenizer=SentenceEncoder.load(d).tokenizer)
                             .encode(SENTENCES), ours, atol=1e-5)


@pytest.mark.parametrize("pooling", [None, "enc_first"])
def test_sentence_transformers_export_is_the_removed_form(lap_dir, tmp_path, pooling):
  from sentence_transformers import SentenceTransformer

  from st5_jax.export import export_model

  d, cfg, _ = lap_dir
  out = tmp_path / "st"
  summary = export_model(d, format="sentence-transformers", out=out, pooling=pooling)
  expected = pooling or "enc_mean"  # the default removed form (measured best, docs/results.md)
  assert summary["pooling"] == expected and summary["output_dim"] == cfg.output_dim
  modules = [m["type"].rsplit(".", 1)[-1] for m in json.loads((out / "modules.json").read_text())]
  assert modules == ["Transformer", "Pooling", "Dense", "Normalize"]
  st = SentenceTransformer(str(out), device="cpu")
  ours = SentenceEncoder.load(d, pooling=expected).encode(SENTENCES)
  np.testing.assert_allclose(st.encode(SENTENCES, convert_to_numpy=True), ours, atol=1e-5, rtol=0)
  card = (out / "README.md").read_text()
  assert "## Pooling differs from training" in card and "trained with `layer_attention` pooling" in card
  assert f"pools with `{expected}`" in card and "removes that attention head" in card


def test_sentence_transformers_refuses_the_full_head(lap_dir, tmp_path):
  from st5_jax.export import sentence_transformers
  from st5_jax.export.sentence_transformers import UnsupportedExportError

  _, cfg, params = lap_dir
  with pytest.raises(UnsupportedExportError, match="removed-at-inference"):
    sentence_transformers.export(config=cfg, flat=tree.flatten(params), vocab_file="unused", out=tmp_path / "x")
  assert not (tmp_path / "x").exists()
