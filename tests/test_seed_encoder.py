"""SEED-Encoder pre-training: span corruption, the weak decoder, the seed_encoder objective, init_from."""

import json
import pathlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import seqio
import tensorflow as tf

import synthetic
from st5_jax import configs, features, optim, partitioning, train
from st5_jax.objectives import SeedEncoder
from st5_jax.objectives.seed_encoder import objective as seed_objective
from st5_jax.objectives.seed_encoder import objective as seed_encoder
from st5_jax.checkpoints import native, tree
from st5_jax.objectives.seed_encoder import span_corruption as sc
from st5_jax.data.vocabulary import T5Vocabulary
from st5_jax.checkpoints.loader import load_model
from st5_jax.model import t5
from st5_jax.objectives.seed_encoder import weak_decoder as wd
from st5_jax.model.st5 import SentenceT5

GOLDEN = pathlib.Path(__file__).parent / "golden" / "t5_span_corruption.json"
VOCAB = 384
TINY = configs.ST5Config(t5=configs.t5_size("t5_tiny", dropout_rate=0.0, vocab_size=VOCAB), embedding_dim=16)
SEED = SeedEncoder()


# ------------------------------------------------------------- NumPy re-derivations


def np_window_mask(T, k):
  m = np.zeros((T, T), bool)
  for i in range(T):
    for j in range(T):
      m[i, j] = j == 0 or i - k < j <= i
  return m


def np_random_segmentation(num_items, num_segments, uniform):
  """Positive lengths summing to num_items; cut points = the shuffled 1s among num_items-1 slots."""
  cuts = (np.arange(num_items - 1) < num_segments - 1).astype(np.int64)[np.argsort(uniform(num_items - 1))]
  segment_id = np.cumsum(np.concatenate([[0], cuts]))
  return np.bincount(segment_id)


def np_noise_mask(length, density, mean_span, uniform0, uniform1):
  """t5's random_spans_noise_mask; `uniform*`(n) supply the random draws (float32 noise counts, as TF)."""
  n = max(length, 2)
  num_noise = int(np.round(np.float32(n) * np.float32(density)))
  num_noise = min(max(num_noise, 1), n - 1)
  num_spans = max(int(np.round(np.float32(num_noise) / np.float32(mean_span))), 1)
  noise = np_random_segmentation(num_noise, num_spans, uniform0)
  keep = np_random_segmentation(n - num_noise, num_spans, uniform1)
  mask = np.concatenate([np.r_[np.zeros(a, bool), np.ones(b, bool)] for a, b in zip(keep, noise)])
  return mask[:length]


def np_unique_sentinels(tokens, mask, first_sentinel):
  """Each run of masked tokens -> one sentinel (first_sentinel, first_sentinel - 1, ...)."""
  out, sentinel, prev = [], first_sentinel, False
  for tok, m in zip(tokens, mask):
    if m and not prev:
      out.append(sentinel)
      sentinel -= 1
    elif not m:
      out.append(int(tok))
    prev = m
  return out


def np_span_corruption(docs, *, seed, merge, inputs_length, vocab_size=32100):
  """The whole t5 pipeline in NumPy; only the random draws come from TF's stateless ops (same seeds)."""
  tokens_length, _ = sc.random_spans_helper(inputs_length=inputs_length, noise_density=0.15,
                                            mean_noise_span_length=3.0)
  docs = [np.asarray(d) for d in docs if len(d)]
  assert all(len(d) <= sc.MAX_CHUNK_TOKENS for d in docs)  # one chunk per document: start 0
  if merge:
    docs = [np.concatenate(docs)]  # fewer than 128 documents: one concatenation
  segments = [d[s:s + tokens_length] for d in docs for s in range(0, len(d), tokens_length)]
  # seqio hands the k-th random map of a preprocessor the seed pair (Random(N + 2k), Random(N + 2k + 1))
  # per example; denoise is the third map (chunk, split, denoise).
  n = len(segments)
  a = [int(x) for x in tf.data.Dataset.random(seed + 4).take(n).as_numpy_iterator()]
  b = [int(x) for x in tf.data.Dataset.random(seed + 5).take(n).as_numpy_iterator()]
  out = []
  for i, seg in enumerate(segments):
    seeds6 = tf.random.experimental.stateless_split(tf.constant([a[i], b[i]], tf.int64), 6).numpy()
    draws = [lambda m, s=s: tf.random.stateless_uniform([m], seed=s).numpy() for s in seeds6[:2]]
    mask = np_noise_mask(len(seg), 0.15, 3.0, draws[0], draws[1])
    out.append({"inputs": np_unique_sentinels(seg, mask, vocab_size - 1),
                "targets": np_unique_sentinels(seg, ~mask, vocab_size - 1),
                "uncorrupted": seg.tolist()})
  return out


def np_decode(inputs, targets, first_sentinel):
  """Undo span corruption: each sentinel in the inputs -> the tokens after it in the targets."""
  spans, cur = {}, None
  for tok in targets:
    if first_sentinel - 100 < tok <= first_sentinel:  # 100 extra ids
      cur = tok
      spans[cur] = []
    else:
      spans[cur].append(tok)
  out = []
  for tok in inputs:
    out.extend(spans[tok] if tok in spans else [tok])
  return out


# ------------------------------------------------------------------- span corruption


def _run_pipeline(docs, vocab_path, *, seed, merge, inputs_length, **kw):
  vocab = T5Vocabulary(vocab_path)
  ds = tf.data.Dataset.from_generator(lambda: ({"targets": np.asarray(d, np.int32)} for d in docs),
                                      output_signature={"targets": tf.TensorSpec([None], tf.int32)})
  feats = {"inputs": seqio.Feature(vocab), "targets": seqio.Feature(vocab)}
  lengths = {"inputs": inputs_length, "targets": inputs_length, **kw.pop("extra_lengths", {})}
  # seqio's seeds become tf.data.Dataset.random op seeds, which combine with TF's global seed:
  # clear one another test may have set, as the golden outputs were recorded without one.
  tf.random.set_seed(None)
  with seqio.utils.map_seed_manager(seed):
    out = sc.span_corruption(ds, sequence_length=lengths, output_features=feats,
                             merge_examples_to_reduce_padding=merge, **kw)
  return [{k: v.tolist() for k, v in sorted(ex.items())} for ex in out.as_numpy_iterator()]


def test_random_spans_helper_lengths():
  # T5's published pre-training shapes: 512 corrupted inputs <- 568 raw tokens, 114 targets.
  assert sc.random_spans_helper(inputs_length=512, noise_density=0.15, mean_noise_span_length=3.0) == (568, 114)
  for L in (8, 16, 33, 64, 100):
    tokens, targets = sc.random_spans_helper(inputs_length=L, noise_density=0.15, mean_noise_span_length=3.0)
    corrupted = lambda t: t - round(t * 0.15) + round(round(t * 0.15) / 3) + 1  # noqa: E731
    assert corrupted(tokens) <= L < corrupted(tokens + 1)  # the longest segment that fits
    assert targets == round(tokens * 0.15) + round(round(tokens * 0.15) / 3) + 1
  assert sc.feature_lengths(16) == {"inputs": 16, "targets": 5, "uncorrupted": 18}


def test_noise_mask_equals_numpy_rederivation():
  # 190 and 350: float32 noise counts (TF's) differ from float64 rounding there.
  for length in [1, 2, 3, 4, 7, 10, 20, 30, 33, 57, 100, 190, 350]:
    for s in range(3):
      seeds = tf.random.experimental.stateless_split(tf.constant([s, length], tf.int64), 2)
      got = sc.random_spans_noise_mask(length, 0.15, seeds).numpy()
      draws = [lambda m, seed=seed: tf.random.stateless_uniform([m], seed=seed).numpy() for seed in seeds]
      np.testing.assert_array_equal(got, np_noise_mask(length, 0.15, 3.0, *draws), err_msg=f"{length} {s}")
      if length >= 2:
        assert 1 <= got.sum() <= length - 1 and not got[0]  # noise exists; the first span is kept text


@pytest.mark.parametrize("merge", [True, False])
def test_span_corruption_equals_numpy_rederivation(vocab_path, merge):
  golden = json.loads(GOLDEN.read_text())
  docs = golden["documents"]
  for seed in (0, 7):
    for L in (16, 32):
      got = _run_pipeline(docs, vocab_path, seed=seed, merge=merge, inputs_length=L,
                          uncorrupted_feature_key="uncorrupted",
                          extra_lengths={"uncorrupted": sc.feature_lengths(L)["uncorrupted"]})
      want = np_span_corruption(docs, seed=seed, merge=merge, inputs_length=L)
      assert got == want, (seed, L)
      tokens_length = sc.feature_lengths(L)["uncorrupted"] - 1
      for ex in got:
        # Inputs fit the inputs length with EOS; decoding the corruption gives back the segment.
        assert len(ex["inputs"]) + 1 <= L and len(ex["uncorrupted"]) <= tokens_length
        assert np_decode(ex["inputs"], ex["targets"], 32099) == ex["uncorrupted"]


def test_span_corruption_equals_t5_reference_outputs(vocab_path):
  """Outputs recorded from t5 0.9.4's own span_corruption (tests/golden/make_t5_span_corruption.py)."""
  golden = json.loads(GOLDEN.read_text())
  assert golden["t5_version"] == "0.9.4" and golden["vocab_size"] == T5Vocabulary(vocab_path).vocab_size
  for case in golden["cases"]:
    args = dict(seed=case["seed"], merge=case["merge"], inputs_length=case["inputs_length"])
    assert _run_pipeline(golden["documents"], vocab_path, **args) == case["examples"], args
    # Keeping the uncorrupted segment changes nothing else (the copy draws no seeds).
    kept = _run_pipeline(golden["documents"], vocab_path, **args, uncorrupted_feature_key="uncorrupted")
    assert [{k: v for k, v in ex.items() if k != "uncorrupted"} for ex in kept] == case["examples"]


def test_span_corruption_in_a_seqio_task_and_bad_lengths(vocab_path):
  vocab = T5Vocabulary(vocab_path)
  name = "test_seed_encoder_span_corruption"
  texts = ["The quick brown fox jumps over the lazy dog near the river bank today, and then it runs "
           "back into the forest where nobody can see it any more.",
           "Sentence encoders map text to vectors.", "Short."]
  out_feats = {k: seqio.Feature(vocab, add_eos=True) for k in ("inputs", "targets", "uncorrupted")}
  seqio.TaskRegistry.remove(name)
  seqio.TaskRegistry.add(
      name, source=seqio.FunctionDataSource(
          lambda split, shuffle_files, seed=None: tf.data.Dataset.from_tensor_slices({"targets": texts}),
          splits=["train"]),
      preprocessors=[seqio.preprocessors.tokenize,
                     seqio.utils.add_kwargs_to_transform(sc.span_corruption, merge_examples_to_reduce_padding=False,
                                                         uncorrupted_feature_key="uncorrupted"),
                     seqio.preprocessors.append_eos_after_trim],
      output_features=out_feats)
  try:
    lengths = sc.feature_lengths(16)
    rows = list(seqio.get_mixture_or_task(name).get_dataset(lengths, split="train", shuffle=False, seed=3)
                .as_numpy_iterator())
    pieces = [len(vocab.encode(t)) for t in texts]
    assert pieces[0] > 17 and max(pieces[1:]) <= 17
    assert len(rows) == sum(-(-n // 17) for n in pieces)  # long texts split into 17-token segments
    for ex in rows:
      assert ex["inputs"][-1] == ex["targets"][-1] == ex["uncorrupted"][-1] == 1  # EOS everywhere
      assert np_decode(ex["inputs"][:-1].tolist(), ex["targets"][:-1].tolist(), 32099) == \
          ex["uncorrupted"][:-1].tolist()
    first = -(-pieces[0] // 17)
    assert vocab.decode(np.concatenate([r["uncorrupted"][:-1] for r in rows[:first]]).tolist()) == texts[0]
    with pytest.raises(ValueError, match=r"sequence_length\['uncorrupted'\] = 10 cannot hold the 17-token"):
      seqio.get_mixture_or_task(name).get_dataset(dict(lengths, uncorrupted=10), split="train", shuffle=False)
    with pytest.raises(ValueError, match="targets length"):
      seqio.get_mixture_or_task(name).get_dataset(dict(lengths, targets=3), split="train", shuffle=False)
  finally:
    seqio.TaskRegistry.remove(name)


# ------------------------------------------------------------------------ the model


def _params(model_config=TINY, seed=SEED, rng=0):
  return nn.unbox(wd.init_params(model_config, seed, jax.random.PRNGKey(rng)))


def _tokens(rng, B, L, lo=3, hi=300, min_len=None):
  t = rng.integers(lo, hi, size=(B, L)).astype(np.int32)
  for r, n in enumerate(rng.integers(min_len or L // 2, L + 1, size=B)):
    t[r, n - 1] = 1
    t[r, n:] = 0
  return t


def _weak_logits(model, params, enc_tokens, weak_inputs, *, interceptor=None):
  def run(p, e, w):
    if interceptor is None:
      return model.apply({"params": p}, e, weak_decoder_input_tokens_BxS=w)[1]
    with nn.intercept_methods(interceptor):  # active while tracing
      return model.apply({"params": p}, e, weak_decoder_input_tokens_BxS=w)[1]
  return jax.jit(run)(params, enc_tokens, weak_inputs)


def _replace_memory(value_fn):
  def icpt(next_fun, args, kwargs, ctx):
    if isinstance(ctx.module, wd.SeedEncoderPretrainer) and ctx.method_name == "memory":
      return value_fn(next_fun(*args, **kwargs))
    return next_fun(*args, **kwargs)
  return icpt


@pytest.mark.parametrize("k", [1, 2, 8])
def test_window_mask_matches_numpy(k):
  for T in (1, 5, 12):
    m = np.asarray(wd.window_mask(T, k))
    np.testing.assert_array_equal(m, np_window_mask(T, k))
    assert m[:, 0].all()  # the start token is always visible
    assert (m.sum(1) == np.minimum(np.arange(T) + 1, k + (np.arange(T) >= k))).all()


@pytest.mark.parametrize("layers,k", [(1, 1), (1, 2), (2, 2), (3, 2), (1, 8)])
def test_prediction_sees_only_the_window_and_the_vector(layers, k):
  """With the memory vector fixed, output i changes with input j iff (window mask ^ layers)[i, j]."""
  T = 12
  seed = SeedEncoder(num_layers=layers, window=k)
  model, params = wd.SeedEncoderPretrainer(TINY, seed), _params(seed=seed)
  rng = np.random.default_rng(layers * 10 + k)
  enc = np.repeat(_tokens(rng, 1, 10), T + 1, axis=0)
  base = rng.integers(3, 300, size=T).astype(np.int32)
  base[0] = 0
  weak = np.repeat(base[None], T + 1, axis=0)
  for j in range(T):  # row j + 1 changes input token j
    weak[j + 1, j] = (weak[j + 1, j] + 7) % 300 + 3
  fixed = jnp.asarray(rng.normal(size=(1, 32)), jnp.float32)
  logits = np.asarray(_weak_logits(model, params, enc, weak,
                                   interceptor=_replace_memory(lambda m: jnp.broadcast_to(fixed, m.shape))))
  reach = np.linalg.matrix_power(np_window_mask(T, k).astype(np.int64), layers) > 0
  for j in range(T):
    changed = np.abs(logits[j + 1] - logits[0]).max(-1) > 1e-6
    unchanged = (logits[j + 1] == logits[0]).all(-1)
    np.testing.assert_array_equal(changed, reach[:, j], err_msg=f"input {j}")
    np.testing.assert_array_equal(unchanged, ~reach[:, j], err_msg=f"input {j}")
  if layers == 1 and k == 2:  # the paper's claim: x_t is predicted from x_{t-1}, x_{t-2} and BOS only
    assert reach[5].nonzero()[0].tolist() == [0, 4, 5]


def test_weak_decoder_logits_are_the_tied_embedding_over_sqrt_d():
  """Output projection tied to the token embeddings with T5's 1/sqrt(d) rescaling, re-derived in NumPy from
  the weak decoder's final layer-norm output."""
  seed = SeedEncoder(num_layers=1, window=2)
  model, params = wd.SeedEncoderPretrainer(TINY, seed), _params(seed=seed)
  rng = np.random.default_rng(5)
  enc, weak = _tokens(rng, 2, 10), _tokens(rng, 2, 6)
  (_, logits), state = model.apply({"params": params}, enc, weak_decoder_input_tokens_BxS=weak,
                                   capture_intermediates=True, mutable=["intermediates"])
  y = np.asarray(state["intermediates"]["weak_decoder"]["decoder_norm"]["__call__"][0], np.float64)
  emb = np.asarray(params["token_embedder"]["embedding"], np.float64)
  want = np.einsum("btd,vd->btv", y, emb) / np.sqrt(TINY.t5.emb_dim)
  np.testing.assert_allclose(np.asarray(logits), want, rtol=1e-4, atol=1e-5)


def _dec_loss(model, params, enc, weak_targets, interceptor=None):
  logits = _weak_logits(model, params, enc, seed_encoder.shift_right(weak_targets), interceptor=interceptor)
  nll, _, count = seed_encoder.token_cross_entropy(logits, weak_targets)
  return nll / count


@pytest.mark.parametrize("pooling,memory", [("enc_first", "pooled"), ("enc_mean", "projected"),
                                            ("encdec_first", "pooled")])
def test_weak_decoder_reads_the_encoder_only_through_one_memory_slot(pooling, memory):
  cfg = TINY.replace(pooling=pooling)
  seed = SeedEncoder(num_layers=2, memory=memory)
  model, params = wd.SeedEncoderPretrainer(cfg, seed), _params(cfg, seed)
  rng = np.random.default_rng(1)
  enc, weak = _tokens(rng, 3, 10), _tokens(rng, 3, 9)
  # Cross-attention keys/values: one slot of the memory's width, in every layer.
  seen = []

  def record(next_fun, args, kwargs, ctx):
    if isinstance(ctx.module, t5.MultiHeadAttention) and ctx.module.path[0] == "weak_decoder":
      seen.append((ctx.module.path[-1], args[1].shape))
    return next_fun(*args, **kwargs)

  _weak_logits(model, params, enc, weak, interceptor=record)
  width = 16 if memory == "projected" else 32
  assert sorted(seen) == [("encoder_decoder_attention", (3, 1, width))] * 2 + [("self_attention", (3, 9, 32))] * 2
  # Gradients of L_dec reach the encoder outputs exactly as the pooling spreads them.
  delta0 = jnp.zeros((3, 10, 32), jnp.float32)

  def loss_with_delta(delta, memory_fn=lambda m: m):
    def icpt(next_fun, args, kwargs, ctx):
      out = next_fun(*args, **kwargs)
      if isinstance(ctx.module, t5.Encoder) and ctx.method_name == "__call__":
        return out + delta
      if isinstance(ctx.module, wd.SeedEncoderPretrainer) and ctx.method_name == "memory":
        return memory_fn(out)
      return out
    return _dec_loss(model, params, enc, weak, interceptor=icpt)

  g = np.asarray(jax.jit(jax.grad(loss_with_delta))(delta0))
  valid = enc > 0
  assert np.abs(g[~valid]).max() == 0  # padding never reaches the vector
  if pooling == "enc_first":
    assert np.abs(g[:, 1:]).max() == 0 and np.abs(g[:, 0]).min() > 0
  elif pooling == "enc_mean":  # the same gradient at every real token, scaled 1/n
    for r in range(3):
      rows = g[r][valid[r]]
      np.testing.assert_allclose(rows, np.broadcast_to(rows[0], rows.shape), rtol=1e-5, atol=1e-12)
      assert np.abs(rows).max() > 0
  else:
    assert (np.abs(g[valid]).max(-1) > 0).all()  # the T5 decoder's first output reads every token
  # A constant memory cuts the encoder off from L_dec entirely; zeroing it changes L_dec.
  g_cut = jax.jit(jax.grad(lambda d: loss_with_delta(d, jax.lax.stop_gradient)))(delta0)
  assert np.abs(np.asarray(g_cut)).max() == 0
  zeroed = loss_with_delta(delta0, jnp.zeros_like)
  assert abs(float(zeroed) - float(loss_with_delta(delta0))) > 1e-4


def test_tied_embedding_is_one_parameter_with_gradients_from_both_uses():
  model, params = wd.SeedEncoderPretrainer(TINY, SEED), _params()
  flat = tree.flatten(params)
  vocab_shaped = [k for k, v in flat.items() if VOCAB in v.shape]
  assert vocab_shaped == ["token_embedder/embedding"]  # no embedding or output matrix of its own
  rng = np.random.default_rng(2)
  enc, weak = _tokens(rng, 2, 8), _tokens(rng, 2, 8)

  def split_loss(e_in, e_out):
    """L_dec with the embedding's input lookups reading e_in and the tied logits reading e_out."""
    def icpt(next_fun, args, kwargs, ctx):
      if isinstance(ctx.module, t5.Embed) and ctx.method_name == "__call__":
        return jnp.take(e_in, args[0], axis=0)
      if isinstance(ctx.module, t5.Embed) and ctx.method_name == "attend":
        return jnp.einsum("bld,vd->blv", args[0].astype(jnp.float32), e_out)
      return next_fun(*args, **kwargs)
    return _dec_loss(model, params, enc, weak, interceptor=icpt)

  E = params["token_embedder"]["embedding"]
  g_in, g_out = jax.jit(jax.grad(split_loss, argnums=(0, 1)))(E, E)

  def full_loss(e):
    p = dict(params, token_embedder={"embedding": e})
    return _dec_loss(model, p, enc, weak)

  g = jax.jit(jax.grad(full_loss))(E)
  assert np.abs(np.asarray(g_in)).max() > 0 and np.abs(np.asarray(g_out)).max() > 0
  np.testing.assert_allclose(np.asarray(g), np.asarray(g_in) + np.asarray(g_out), rtol=1e-5, atol=1e-8)
  # Rows of tokens used nowhere as input get gradient through the output projection only.
  unused = np.setdiff1d(np.arange(VOCAB), np.concatenate([enc.ravel(), weak.ravel(), [0]]))
  assert np.abs(np.asarray(g_in)[unused]).max() == 0 and np.abs(np.asarray(g)[unused]).min() > 0


@pytest.mark.parametrize("size,pooling", [("t5_tiny", "enc_mean"), ("t5_tiny", "encdec_first"),
                                          ("t5_1_1_tiny", "enc_first")])
def test_parameter_tree_is_sentence_t5s_plus_the_weak_decoder(size, pooling):
  cfg = configs.ST5Config(t5=configs.t5_size(size, vocab_size=VOCAB, dropout_rate=0.0), pooling=pooling,
                          embedding_dim=16)
  got = set(tree.flatten(nn.unbox(wd.abstract_params(cfg, SEED))))
  st5_encdec = set(tree.flatten(nn.unbox(SentenceT5(cfg.replace(pooling="encdec_first")).init(
      jax.random.PRNGKey(0), jnp.ones((1, 4), jnp.int32))["params"])))
  weak = {k for k in got if k.startswith("weak_decoder/")}
  # T5.1.1's span decoder has its own output layer (as in T5X checkpoints); T5 1.0 ties it.
  untied = {"decoder/logits_dense/kernel"} if size == "t5_1_1_tiny" else set()
  assert got - weak == st5_encdec | untied
  # Its own relative-position table and final norm, and 3 layers shaped like the T5 decoder's.
  block = {k.split("/", 2)[2] for k in got if k.startswith("decoder/layers_0/")}
  assert weak == {"weak_decoder/relpos_bias/rel_embedding", "weak_decoder/decoder_norm/scale"} | {
      f"weak_decoder/layers_{i}/{b}" for i in range(3) for b in block}
  # Every parameter carries logical axis names.
  boxed = jax.tree.leaves(wd.abstract_params(cfg, SEED), is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
  assert all(isinstance(b, nn.LogicallyPartitioned) for b in boxed)


def test_scanned_and_rematerialised_weak_decoder_match_the_loop():
  seed = SeedEncoder(num_layers=3, window=2)
  params = _params(seed=seed)
  scanned_cfg = TINY.replace(t5=TINY.t5.replace(scan_layers=True, remat_policy="full"))
  flat = tree.stack_layers(tree.flatten(params))
  weak = {k: v for k, v in flat.items() if k.startswith("weak_decoder/layers_")}
  flat = {k: v for k, v in flat.items() if k not in weak}
  for rest in {k.split("/", 2)[2] for k in weak}:
    flat[f"weak_decoder/layers/{rest}"] = np.stack([weak[f"weak_decoder/layers_{i}/{rest}"] for i in range(3)])
  stacked = tree.unflatten(flat)
  assert set(tree.flatten(stacked)) == set(tree.flatten(_params(scanned_cfg, seed)))
  rng = np.random.default_rng(3)
  enc, weak_in = _tokens(rng, 2, 8), _tokens(rng, 2, 7)
  want = _weak_logits(wd.SeedEncoderPretrainer(TINY, seed), params, enc, weak_in)
  got = _weak_logits(wd.SeedEncoderPretrainer(scanned_cfg, seed), stacked, enc, weak_in)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_memory_and_bad_configs():
  with pytest.raises(ValueError, match="needs a projection"):
    _params(TINY.replace(embedding_dim=None), SeedEncoder(memory="projected"))
  for bad, msg in [(dict(num_layers=0), "num_layers"), (dict(window=0), "window"),
                   (dict(memory="cls"), "memory must be one of"), (dict(decoder_loss_weight=-1), ">= 0")]:
    with pytest.raises(ValueError, match=msg):
      SeedEncoder(**bad)
  mesh = partitioning.make_mesh(partitioning.MeshConfig(8, 1, 1))
  with pytest.raises(ValueError, match="objective must be an objective such as .*got 'mlm'"):
    train.build(TINY, _tc(objective="mlm"), mesh)
  with pytest.raises(ValueError, match="grad_cache_chunks applies to the contrastive"):
    train.build(TINY, _tc(grad_cache_chunks=2), mesh)
  with pytest.raises(ValueError, match="needs the objective.s value_and_grad"):
    train.make_train_step(None, None, _tc(), None)


# ------------------------------------------------------------------------- the loss


def test_loss_equals_numpy_cross_entropy():
  rng = np.random.default_rng(4)
  span_logits, weak_logits = rng.normal(size=(3, 5, 11)), rng.normal(size=(3, 6, 11))
  span_t, weak_t = rng.integers(1, 11, size=(3, 5)), rng.integers(1, 11, size=(3, 6))
  span_t[0, 3:] = 0
  weak_t[2, 1:] = 0

  def ce(logits, t):
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, t[..., None], -1)[..., 0]
    w = t > 0
    return nll[w].mean(), (logits.argmax(-1) == t)[w].mean()

  (ls, acc_s), (ld, acc_d) = ce(span_logits, span_t), ce(weak_logits, weak_t)
  for w in (0.5, 2.0):
    loss, m = seed_encoder.seed_encoder_loss(jnp.asarray(span_logits, jnp.float32), jnp.asarray(span_t),
                                             jnp.asarray(weak_logits, jnp.float32), jnp.asarray(weak_t),
                                             decoder_loss_weight=w)
    np.testing.assert_allclose(float(loss), ls + w * ld, rtol=1e-5)
    np.testing.assert_allclose([float(m["span_loss"]), float(m["dec_loss"]), float(m["accuracy"]),
                                float(m["dec_accuracy"])], [ls, ld, acc_s, acc_d], rtol=1e-5)
  loss, m = seed_encoder.seed_encoder_loss(jnp.asarray(span_logits, jnp.float32), jnp.asarray(span_t), None, None,
                                           decoder_loss_weight=1.0)
  np.testing.assert_allclose(float(loss), ls, rtol=1e-5)
  assert "dec_loss" not in m
  np.testing.assert_array_equal(np.asarray(seed_encoder.shift_right(jnp.asarray([[5, 6, 1, 0]]))), [[0, 5, 6, 1]])


# ------------------------------------------------------------------- training


class SyntheticSpanCorruption(synthetic.SyntheticPairs):
  """Seed-encoder batches from random texts, corrupted by the NumPy span corruption above."""

  def __init__(self, mesh, global_batch_size, seed, *, inputs_length=16, vocab=300, sentinel=VOCAB - 1, cycle=None):
    super().__init__(mesh, global_batch_size, seed, cycle=cycle)
    self.lengths = sc.feature_lengths(inputs_length)
    self.vocab, self.sentinel = vocab, sentinel

  def _global_batch(self, i):
    rng = np.random.default_rng([self.seed, i])
    rows = {k: np.zeros((self.B, n), np.int32) for k, n in self.lengths.items()}
    for r in range(self.B):
      text = rng.integers(3, self.vocab, size=rng.integers(6, self.lengths["uncorrupted"]))
      mask = np_noise_mask(len(text), 0.15, 3.0, rng.random, rng.random)
      for key, toks in (("inputs", np_unique_sentinels(text, mask, self.sentinel)),
                        ("targets", np_unique_sentinels(text, ~mask, self.sentinel)), ("uncorrupted", list(text))):
        rows[key][r, :len(toks) + 1] = toks + [1]
    return {seed_objective.MODEL_FEATURE_NAMES[k]: v for k, v in rows.items()}


def _tc(**kw):
  base = dict(num_train_steps=20, global_batch_size=16, checkpoint_every=100, log_every=1, eval_every=-1,
              objective=SeedEncoder(num_layers=1),
              optimizer=optim.OptimizerConfig(learning_rate=1e-2, epsilon1=1e-6))
  base.update(kw)
  return train.TrainConfig(**base)


def _steps(mesh_config, n, tc=None, devices=None, cycle=None):
  mesh = partitioning.make_mesh(mesh_config, devices=devices)
  tc = tc or _tc()
  setup = train.build(TINY, tc, mesh)
  with jax.set_mesh(mesh):
    state = train.init_state(setup, TINY, seed=0)
    it = SyntheticSpanCorruption(mesh, 16, 0, cycle=cycle)
    first = jax.tree.map(np.asarray, jax.device_get(state.params))
    metrics = []
    for _ in range(n):
      state, m = setup.step_fn(state, next(it))
      metrics.append({k: float(v) for k, v in jax.device_get(m).items()})
  return first, {k: np.asarray(v) for k, v in tree.flatten(jax.device_get(state.params)).items()}, metrics


def test_objective_trains_sharded_like_unsharded():
  _, ref, ref_m = _steps(partitioning.MeshConfig(1, 1, 1), 2, devices=jax.devices()[:1])
  first, got, m = _steps(partitioning.MeshConfig(2, 2, 2), 2)
  for a, b in zip(ref_m, m):
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    assert a["loss"] == pytest.approx(a["span_loss"] + a["dec_loss"], rel=1e-6)
  for k in ref:
    np.testing.assert_allclose(got[k], ref[k], atol=2e-5, rtol=1e-4, err_msg=k)
  # Both terms train their parts: the weak decoder, the T5 decoder and the shared encoder all moved.
  moved = {k for k, v in tree.flatten(first).items() if not np.array_equal(v, got[k])}
  for part in ("weak_decoder/layers_0/encoder_decoder_attention/value/kernel", "decoder/layers_0/mlp/wi/kernel",
               "encoder/layers_0/mlp/wi/kernel", "token_embedder/embedding"):
    assert part in moved
  assert "projection_layer/kernel" not in moved  # memory="pooled": the projection is unused here


def test_objective_loss_goes_down_and_weight_zero_skips_the_weak_decoder():
  _, _, m = _steps(partitioning.MeshConfig(8, 1, 1), 20, cycle=2)
  assert {"loss", "span_loss", "dec_loss", "accuracy", "dec_accuracy", "grad_norm", "learning_rate"} <= set(m[0])
  assert np.mean([r["span_loss"] for r in m[-2:]]) < 0.7 * np.mean([r["span_loss"] for r in m[:2]])
  # Random texts through a 32-wide bottleneck: the weak decoder learns slowly (ln 297 = 5.69 without
  # the vector); it must still improve.
  assert np.mean([r["dec_loss"] for r in m[-2:]]) < np.mean([r["dec_loss"] for r in m[:2]]) - 0.4
  first, last, m0 = _steps(partitioning.MeshConfig(8, 1, 1), 2,
                           tc=_tc(objective=SeedEncoder(num_layers=1, decoder_loss_weight=0.0)))
  assert "dec_loss" not in m0[0] and m0[0]["loss"] == m0[0]["span_loss"]
  weak = [k for k in last if k.startswith("weak_decoder/")]
  assert weak and all(np.array_equal(tree.flatten(first)[k], last[k]) for k in weak)


def test_missing_features_are_named():
  mesh = partitioning.make_mesh(partitioning.MeshConfig(8, 1, 1))
  setup = train.build(TINY, _tc(), mesh)
  with jax.set_mesh(mesh):
    state = train.init_state(setup, TINY, seed=0)
    batch = next(SyntheticSpanCorruption(mesh, 16, 0))
    del batch[seed_objective.WEAK_DECODER_TARGETS]
    with pytest.raises(KeyError, match="missing \\['weak_decoder_target_tokens'\\]"):
      setup.step_fn(state, batch)


@pytest.mark.parametrize("pooling", ["enc_mean", "encdec_first"])
def test_pretrained_work_dir_initialises_an_st5_run(tmp_path, vocab_path, pooling):
  model = TINY.replace(pooling=pooling)
  pre = tmp_path / "pretrain"
  result = train.train(workdir=pre, model_config=model, train_config=_tc(num_train_steps=2),
                       make_iterator=lambda mesh, b, s: SyntheticSpanCorruption(mesh, b, s),
                       vocab_file=vocab_path, progress=False)
  assert result.step == 2 and native.read_config(pre) == model
  _, stored, _ = native.load_params(pre)
  stored = {k: np.asarray(v) for k, v in tree.flatten(stored).items()}
  assert any(k.startswith("weak_decoder/") for k in stored)
  # Loading for ST5: everything of SentenceT5 comes from the work dir; the weak decoder (and the
  # T5 decoder, unless encdec_first pools with it) is reported unused and dropped.
  cfg, params, report, fmt = load_model(str(pre), pooling=pooling, embedding_dim=16)
  flat = tree.flatten(params)
  assert fmt == "native" and not report.missing_initialised and not report.unexpected
  assert not any(k.startswith("weak_decoder/") for k in flat)
  assert {k for k in stored if k.startswith("weak_decoder/")} <= set(report.unused)
  assert any(k.startswith("decoder/") for k in flat) == (pooling == "encdec_first")
  for k, v in flat.items():
    np.testing.assert_array_equal(v, stored[k], err_msg=k)
  # ... and `run.init_from` trains the contrastive objective from it with a fresh optimizer.
  st5_dir = tmp_path / "st5"
  tc = train.TrainConfig(num_train_steps=2, global_batch_size=16, checkpoint_every=100, eval_every=-1,
                         optimizer=optim.OptimizerConfig(learning_rate=1e-2))
  r = train.train(workdir=st5_dir, model_config=model, train_config=tc, make_iterator=synthetic.factory(),
                  init_from=str(pre), vocab_file=vocab_path, progress=False)
  assert r.step == 2 and r.summary["init_from"] == str(pre)
  _, after, step = native.load_params(st5_dir)
  after = tree.flatten(after)
  assert step == 2 and set(after) == set(flat)
  assert not np.array_equal(np.asarray(after["encoder/layers_0/mlp/wi/kernel"]),
                            stored["encoder/layers_0/mlp/wi/kernel"])


def test_scanned_weak_decoder_names_stack_and_unstack():
  """A scanned seed_encoder model's parameter names are stack_layers of the unrolled ones (weak decoder too)."""
  seed_cfg = SeedEncoder(num_layers=2)

  def names(scan):
    cfg = TINY.replace(t5=TINY.t5.replace(scan_layers=scan, remat_policy="full" if scan else "none"))
    boxed = seed_cfg.abstract_params(cfg)
    return {k: v.shape for k, v in tree.flatten(nn.unbox(boxed)).items()}

  unrolled, scanned = names(False), names(True)
  assert any(k.startswith("weak_decoder/layers_1/") for k in unrolled)
  stacked = tree.stack_layers({k: np.zeros(s) for k, s in unrolled.items()})
  assert {k: v.shape for k, v in stacked.items()} == scanned
  assert set(tree.unstack_layers(stacked)) == set(unrolled)


def test_weak_decoder_reconstructs_the_uncorrupted_text_not_the_corrupted_input():
  """SEED-Encoder's weak decoder target is the original text (paper eq. 3; the official code's decoder
  labels are the input ids before MLM masking). Re-derived in NumPy from the model's logits: the loss
  is the cross-entropy against `uncorrupted`, and would differ with the corrupted inputs as targets."""
  obj = SeedEncoder(num_layers=1, decoder_loss_weight=0.7, window=2)
  tc = _tc(objective=obj)
  mesh = partitioning.make_mesh(partitioning.MeshConfig(1, 1, 1), devices=jax.devices()[:1])
  batch = jax.device_get(next(SyntheticSpanCorruption(mesh, 8, 3)))
  enc, tgt, weak = (np.asarray(batch[k]) for k in (seed_objective.ENCODER_INPUTS, seed_objective.DECODER_TARGETS,
                                                   seed_objective.WEAK_DECODER_TARGETS))
  assert not np.array_equal(enc[:, :weak.shape[1]], weak)  # sentinels in the inputs, none in the text
  model = obj.make_model(TINY)
  boxed = obj.abstract_params(TINY)
  params = nn.unbox(obj.init_params(TINY, jax.random.PRNGKey(0)))
  (loss, m), _ = obj.make_value_and_grad(model, boxed, TINY, tc)(params, batch, jax.random.PRNGKey(1))

  def numpy_ce(logits, t):
    logits = np.asarray(logits, np.float64)
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    nll = -np.take_along_axis(logp, t[..., None], -1)[..., 0]
    return nll[t > 0].mean()

  def weak_loss(targets):
    shifted = np.concatenate([np.zeros_like(targets[:, :1]), targets[:, :-1]], axis=1)
    _, weak_logits = model.apply({"params": params}, enc, decoder_input_tokens_BxT=seed_objective.shift_right(tgt),
                                 weak_decoder_input_tokens_BxS=shifted, deterministic=True)
    return numpy_ce(weak_logits, targets)

  want = weak_loss(weak)
  assert float(m["dec_loss"]) == pytest.approx(want, rel=1e-4)
  wrong = weak_loss(enc[:, :weak.shape[1]])
  assert abs(wrong - want) > 1e-2
  assert float(loss) == pytest.approx(float(m["span_loss"]) + 0.7 * want, rel=1e-4)
