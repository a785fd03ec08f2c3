"""Prompts and truncate_dim in the exports: a real SentenceTransformer and the SavedModel's signatures give
what our encode gives with the same prompt; the model card lists them."""

import json

import flax.linen as nn
import jax
import numpy as np
import pytest

from st5_jax import SentenceEncoder, cli, configs
from st5_jax.checkpoints import native
from st5_jax.export import export_model
from st5_jax.model import init_params

LONG = "The quick brown fox jumps over the lazy dog. " * 40  # past max_length with or without a prompt
SENTENCES = ["A man is playing a guitar.", "Hello world", "", LONG, "naïve café — ünïcödé"]
PROMPTS = {"query": "query: ", "passage": "passage: ", "classify": "Classify the topic: "}
# Measured max |difference| 1.9e-7 (torch and TF float32 against JAX on CPU); tests/test_export_sentence_transformers.py
# allows 1e-5 for its other towers.
ATOL = 1e-6


@pytest.fixture(scope="module")
def source(tmp_path_factory, vocab_path):
  cfg = configs.ST5Config(t5=configs.t5_size("t5_tiny"), pooling="enc_mean", embedding_dim=16, max_length=24,
                          prompts=PROMPTS, default_prompt_name="classify")
  params = jax.device_get(nn.unbox(init_params(cfg, jax.random.PRNGKey(3))))
  d = tmp_path_factory.mktemp("export_prompts") / "model"
  native.save_model(d, cfg, params, step=2, vocab_file=vocab_path)
  return d


def test_sentence_transformers_export_carries_prompts_and_truncate_dim(source, tmp_path):
  from sentence_transformers import SentenceTransformer

  out = tmp_path / "st"
  assert cli.main(["export", "--model", str(source), "--format", "sentence-transformers", "--out", str(out),
                   "--prompt", "query=search_query: ", "--truncate_dim", "8"]) == 0
  prompts = {**PROMPTS, "query": "search_query: "}
  assert json.loads((out / "config_sentence_transformers.json").read_text()) == {
      "prompts": prompts, "default_prompt_name": "classify", "similarity_fn_name": "cosine", "truncate_dim": 8}
  ours = SentenceEncoder.load(source)
  st = SentenceTransformer(str(out), device="cpu")
  # sentence-transformers adds an empty "document" prompt (and "query", had the model none): encode_document
  # then adds no prompt, and neither does ours for a model without a "document" prompt.
  assert st.prompts == {**prompts, "document": ""} and st.default_prompt_name == "classify" and st.truncate_dim == 8
  # sentence-transformers slices after its Normalize module; with normalize_embeddings=True it renormalises,
  # which is what st5_jax's truncate_dim does.
  for theirs, mine in [
      (st.encode(SENTENCES, prompt_name="query", normalize_embeddings=True),
       ours.encode(SENTENCES, prompt="search_query: ", truncate_dim=8)),
      (st.encode(SENTENCES, normalize_embeddings=True), ours.encode(SENTENCES, truncate_dim=8)),  # default prompt
      (st.encode_query(SENTENCES, normalize_embeddings=True), ours.encode(SENTENCES, prompt="search_query: ",
                                                                          truncate_dim=8)),
      (st.encode_document(SENTENCES, normalize_embeddings=True), ours.encode(SENTENCES, prompt="", truncate_dim=8)),
      (st.encode_document(SENTENCES, normalize_embeddings=True), ours.encode_document(SENTENCES, truncate_dim=8)),
      (st.encode(SENTENCES, prompt="", normalize_embeddings=True), ours.encode(SENTENCES, prompt="", truncate_dim=8)),
  ]:
    assert theirs.shape == (5, 8)
    np.testing.assert_allclose(theirs, mine, atol=ATOL, rtol=0)
  # Without normalize_embeddings, sentence-transformers keeps the prefix of the unit vector (norm < 1).
  full = ours.encode(SENTENCES, prompt_name="passage")
  np.testing.assert_allclose(st.encode(SENTENCES, prompt_name="passage"), full[:, :8], atol=ATOL, rtol=0)
  assert np.all(np.linalg.norm(full[:, :8], axis=1) < 0.999)
  # st5_jax reads the folder back with its prompts and truncate_dim.
  back = SentenceEncoder.load(out)
  assert back.prompts == prompts and back.default_prompt_name == "classify" and back.dim == 8
  np.testing.assert_allclose(back.encode_query(SENTENCES), ours.encode(SENTENCES, prompt="search_query: ",
                                                                       truncate_dim=8), atol=ATOL, rtol=0)
  card = (out / "README.md").read_text()
  for text in ("## Prompts", '| `query` | `"search_query: "` |', '| `classify` | `"Classify the topic: "` |',
               "`encode` without a prompt uses `classify`", "the first 8 of 16 dimensions, renormalised",
               "(enc_mean, 8 dimensions)", 'prompt_name="classify"'):
    assert text in card, text


def test_savedmodel_has_a_signature_per_prompt_and_truncates_in_the_graph(source, tmp_path):
  import tensorflow as tf

  from st5_jax.export.savedmodel import SavedModelEncoder, read_metadata

  out = tmp_path / "sm"
  summary = export_model(source, format="savedmodel", out=out, platforms=("cpu",), truncate_dim=12)
  assert summary["output_dim"] == 12 and summary["truncate_dim"] == 12
  meta = read_metadata(out)
  assert meta["prompt_signatures"] == {"prompt_classify": "classify", "prompt_passage": "passage",
                                       "prompt_query": "query"}
  assert meta["default_prompt_name"] == "classify" and meta["truncate_dim"] == 12
  ours = SentenceEncoder.load(source)
  model = tf.saved_model.load(str(out))
  x = tf.constant(SENTENCES)
  for name in PROMPTS:
    got = model.signatures[f"prompt_{name}"](inputs=x)["outputs"].numpy()
    np.testing.assert_allclose(got, ours.encode(SENTENCES, prompt_name=name, truncate_dim=12), atol=ATOL, rtol=0)
  default = ours.encode(SENTENCES, truncate_dim=12)  # the default prompt, 12 dimensions renormalised
  np.testing.assert_allclose(model(x)[0].numpy(), default, atol=ATOL, rtol=0)
  np.testing.assert_allclose(model.signatures["serving_default"](inputs=x)["outputs"].numpy(), default,
                             atol=ATOL, rtol=0)
  np.testing.assert_allclose(np.linalg.norm(default, axis=1), 1, atol=1e-6)
  assert model(tf.constant([], tf.string))[0].shape == (0, 12)
  # SentenceEncoder.load gives the SavedModelEncoder: the same prompts and keywords as the JAX encoder.
  sm = SentenceEncoder.load(out)
  assert isinstance(sm, SavedModelEncoder) and sm.dim == 12 and sm.prompts == PROMPTS
  np.testing.assert_allclose(sm.encode_query(SENTENCES), ours.encode_query(SENTENCES, truncate_dim=12),
                             atol=ATOL, rtol=0)
  np.testing.assert_allclose(sm.encode(SENTENCES), default, atol=ATOL, rtol=0)
  np.testing.assert_allclose(sm.encode(SENTENCES, truncate_dim=4, prompt=""),
                             ours.encode(SENTENCES, truncate_dim=4, prompt=""), atol=ATOL, rtol=0)
  card = (out / "README.md").read_text()
  assert '`model.signatures["prompt_classify"]' in card and "prepend the default prompt `classify`" in card
