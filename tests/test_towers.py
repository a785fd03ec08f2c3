"""Asymmetric towers (ST5Config.towers): the model, the loss, loading, encoding, both exports, training."""

from __future__ import annotations

import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import synthetic
from st5_jax import SentenceEncoder, cli, configs, features, flops, optim, partitioning, train
from st5_jax.checkpoints import loader, native, tree
from st5_jax.evaluation import harness
from st5_jax.export import export_model
from st5_jax.model import st5
from st5_jax.objectives import ConsertUnsup, Contrastive, Distill, ObjectiveConfigError, SeedEncoder

T5 = configs.t5_size("t5_tiny", dropout_rate=0.0, vocab_size=384)
TINY = configs.ST5Config(t5=T5, embedding_dim=16)
ASYMMETRIC = ("projection", "separate")
TEXTS = ["A man is playing a guitar.", "Hello world", "", "Sentence-T5 turns T5 into a sentence encoder."]


def _params(cfg, seed=0):
  return jax.device_get(nn.unbox(st5.init_params(cfg, jax.random.PRNGKey(seed))))


_tokens = synthetic.eos_padded_tokens


def test_shared_default_keeps_tree_and_config_json():
  assert configs.ST5Config().towers == "shared"
  assert "towers" not in TINY.to_dict()  # old configs and fingerprints unchanged
  assert configs.ST5Config.from_dict(json.loads(TINY.to_json())) == TINY
  assert sorted(tree.flatten(_params(TINY))) == sorted(tree.flatten(_params(TINY.replace(towers="shared"))))
  assert sorted(_params(TINY)) == ["encoder", "projection_layer", "token_embedder"]
  sep = TINY.replace(towers="separate")
  assert sep.to_dict()["towers"] == "separate" and configs.ST5Config.from_dict(sep.to_dict()) == sep
  with pytest.raises(ValueError, match="towers must be one of"):
    TINY.replace(towers="left")
  with pytest.raises(ValueError, match="needs st5_model.embedding_dim"):
    TINY.replace(towers="projection", embedding_dim=None)
  configs.ST5Config(t5=T5, embedding_dim=None, towers="separate")  # raw mode: separate towers need no projection


@pytest.mark.parametrize("towers", ASYMMETRIC)
def test_sides_param_names_and_inference_towers(towers):
  cfg = TINY.replace(towers=towers)
  params = _params(cfg)
  want = {"projection": ["encoder", "left_projection_layer", "right_projection_layer", "token_embedder"],
          "separate": ["left_tower", "right_tower"]}[towers]
  assert sorted(params) == want
  model, tokens = st5.SentenceT5(cfg), jnp.asarray(_tokens(4, 12, 0))
  with pytest.raises(ValueError, match="side='query' or side='document'"):
    model.apply({"params": params}, tokens)
  q = model.apply({"params": params}, tokens, side="query")
  d = model.apply({"params": params}, tokens, side="document")
  assert not np.allclose(q, d)
  towers_by_side = Contrastive().inference_towers(cfg)
  assert towers_by_side["query"] is not towers_by_side["document"]
  for side, want_emb in (("query", q), ("document", d)):
    tower = towers_by_side[side]
    sub = {k: params[k] for k in tower.param_keys}
    np.testing.assert_allclose(tower.module.apply({"params": sub}, tokens), want_emb, atol=1e-6)


def _loss_numpy(q_BxD, p_BxD, n_BxD, temperature):
  cands = np.concatenate([p_BxD, n_BxD])
  logits = q_BxD @ cands.T / temperature
  logits -= logits.max(axis=1, keepdims=True)
  logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
  return -np.mean(np.diag(logp[:, : len(q_BxD)]))


@pytest.mark.parametrize("towers", ASYMMETRIC)
def test_contrastive_loss_equals_numpy_and_grads_reach_both_towers(towers):
  cfg = TINY.replace(towers=towers)
  obj = Contrastive(temperature=0.05)
  params = _params(cfg, seed=1)
  boxed = obj.abstract_params(cfg)
  B = 8
  batch = {features.LEFT: _tokens(B, 12, 1), features.RIGHT: _tokens(B, 16, 2), features.RIGHT_NEG: _tokens(B, 16, 3)}
  model = obj.make_model(cfg)
  tc = train.TrainConfig(num_train_steps=1, global_batch_size=B)
  (loss, _), grads = jax.jit(obj.make_value_and_grad(model, boxed, cfg, tc))(params, batch, jax.random.PRNGKey(0))
  emb = {s: np.asarray(model.apply({"params": params}, batch[s], side=side))
         for s, side in ((features.LEFT, "query"), (features.RIGHT, "document"), (features.RIGHT_NEG, "document"))}
  want = _loss_numpy(emb[features.LEFT], emb[features.RIGHT], emb[features.RIGHT_NEG], 0.05)
  np.testing.assert_allclose(float(loss), want, rtol=1e-5)
  norms = {k: float(np.abs(np.asarray(v)).sum()) for k, v in tree.flatten(grads).items()}
  if towers == "separate":
    for side in ("left_tower", "right_tower"):
      assert norms[f"{side}/projection_layer/kernel"] > 0 and norms[f"{side}/encoder/layers_0/mlp/wo/kernel"] > 0
  else:
    for k in ("left_projection_layer/kernel", "right_projection_layer/kernel", "encoder/layers_0/mlp/wo/kernel",
              "token_embedder/embedding"):
      assert norms[k] > 0, k
  # GradCache (2 chunks) gives the same loss and gradients, each side through its own tower.
  tc2 = train.TrainConfig(num_train_steps=1, global_batch_size=B, grad_cache_chunks=2)
  (loss2, _), grads2 = jax.jit(obj.make_value_and_grad(model, boxed, cfg, tc2))(params, batch, jax.random.PRNGKey(0))
  np.testing.assert_allclose(float(loss2), float(loss), rtol=1e-5)
  for k, g in tree.flatten(grads).items():
    np.testing.assert_allclose(np.asarray(tree.flatten(grads2)[k]), np.asarray(g), atol=1e-5, err_msg=k)


def test_objectives_that_train_one_tower_refuse_in_one_line():
  cfg = TINY.replace(towers="projection")
  tc = train.TrainConfig(num_train_steps=1, global_batch_size=8)
  for obj in (ConsertUnsup(), SeedEncoder()):
    with pytest.raises(ObjectiveConfigError, match="trains one shared tower") as err:
      obj.check(cfg, tc)
    assert "\n" not in str(err.value) and "st5_model.towers" in str(err.value)
  Contrastive().check(cfg, tc)
  Distill().check(cfg, tc)


def test_flops_equal_and_param_count_doubles():
  sep = TINY.replace(towers="separate")
  lengths = {"inputs": 12, "targets": 16}
  assert Contrastive().step_flops(sep, global_batch_size=8, lengths=lengths) == \
      Contrastive().step_flops(TINY, global_batch_size=8, lengths=lengths)
  count = lambda cfg: sum(np.size(v) for v in tree.flatten(_params(cfg)).values())  # noqa: E731
  assert count(sep) == 2 * count(TINY)
  assert count(TINY.replace(towers="projection")) == count(TINY) + 32 * 16
  assert flops.encoder_forward_flops(sep, 12) == flops.encoder_forward_flops(TINY, 12)
  # st5 aot counts parameters (and sizes the optimizer state) from the trainer's boxed tree
  # (train.build's objective.abstract_params): both towers.
  n_params = {name: sum(np.prod(x.shape) for x in jax.tree.leaves(nn.unbox(Contrastive().abstract_params(cfg))))
              for name, cfg in (("sep", sep), ("one", TINY))}
  assert n_params["sep"] == 2 * n_params["one"]


@pytest.fixture(scope="module")
def shared_model(tmp_path_factory, vocab_path):
  d = tmp_path_factory.mktemp("towers") / "shared"
  cfg = configs.ST5Config(t5=configs.t5_size("t5_tiny"), embedding_dim=16, max_length=32)
  native.save_model(d, cfg, _params(cfg, seed=2), step=1, vocab_file=vocab_path)
  return d


@pytest.mark.parametrize("towers", ASYMMETRIC)
def test_init_from_a_shared_checkpoint_starts_both_towers_equal(shared_model, towers):
  cfg, params, _, _ = loader.load_model(shared_model, towers=towers)
  assert cfg.towers == towers
  shared_cfg, shared_params, _, _ = loader.load_model(shared_model)
  tokens = jnp.asarray(_tokens(4, 12, 5))
  ref = st5.SentenceT5(shared_cfg).apply({"params": shared_params}, tokens)
  for side in st5.SIDES:
    np.testing.assert_allclose(st5.SentenceT5(cfg).apply({"params": params}, tokens, side=side), ref, atol=1e-6)
  # A fresh projection is initialised once and copied to both sides (the model starts as one shared tower).
  cfg, params, report, _ = loader.load_model(shared_model, towers=towers, embedding_dim=16, fresh_projection=True,
                                             rng=jax.random.PRNGKey(9))
  flat = tree.flatten(params)
  pairs = {"projection": ("left_projection_layer/kernel", "right_projection_layer/kernel"),
           "separate": ("left_tower/projection_layer/kernel", "right_tower/projection_layer/kernel")}[towers]
  np.testing.assert_array_equal(flat[pairs[0]], flat[pairs[1]])
  assert not np.allclose(flat[pairs[0]], tree.flatten(shared_params)["projection_layer/kernel"])
  assert report.missing_initialised == ["projection_layer/kernel"]
  with pytest.raises(ValueError, match="loads only as"):
    native.save_model(shared_model.parent / f"asym_{towers}", cfg, params, step=1)
    loader.load_model(shared_model.parent / f"asym_{towers}", towers="shared")


def _asymmetric_model(root, towers, vocab_path, prompts=None):
  d = root / f"model_{towers}"
  cfg = configs.ST5Config(t5=configs.t5_size("t5_tiny"), embedding_dim=16, max_length=32, towers=towers,
                          prompts=prompts or {})
  native.save_model(d, cfg, _params(cfg, seed=3), step=1, vocab_file=vocab_path)
  return d, cfg


@pytest.mark.parametrize("towers", ASYMMETRIC)
def test_sentence_transformers_router_equals_our_sides(tmp_path, vocab_path, towers):
  from sentence_transformers import SentenceTransformer

  src, cfg = _asymmetric_model(tmp_path, towers, vocab_path)
  enc = SentenceEncoder.load(src)
  q, d = enc.encode_query(TEXTS), enc.encode_document(TEXTS)
  assert not np.allclose(q, d)
  inp = tmp_path / "in.txt"
  inp.write_text("\n".join(t or " " for t in TEXTS) + "\n")
  lines = inp.read_text().splitlines()
  for side, want in (("query", enc.encode_query(lines)), ("document", enc.encode_document(lines))):
    assert cli.main(["encode", "--model", str(src), "--input", str(inp), "--output", str(tmp_path / side),
                     "--no_progress", "--side", side]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / f"{side}.npy"), want)
  np.testing.assert_array_equal(enc.encode(TEXTS), d)  # no task: the default route, the document tower
  np.testing.assert_array_equal(enc.encode(TEXTS, task="query"), q)
  out = tmp_path / "st"
  export_model(src, format="sentence-transformers", out=out)
  modules = json.loads((out / "modules.json").read_text())
  assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["Router", "Normalize"]
  router = json.loads((out / "router_config.json").read_text())
  assert router["parameters"]["default_route"] == "document"
  shared_t5 = router["structure"]["query"][0] == router["structure"]["document"][0]
  assert shared_t5 == (towers == "projection")
  assert "`" + towers + "` (asymmetric)" in (out / "README.md").read_text()
  model = SentenceTransformer(str(out), device="cpu")
  np.testing.assert_allclose(model.encode_query(TEXTS), q, atol=1e-6, rtol=0)
  np.testing.assert_allclose(model.encode_document(TEXTS), d, atol=1e-6, rtol=0)
  np.testing.assert_allclose(model.encode(TEXTS), d, atol=1e-6, rtol=0)
  back = SentenceEncoder.load(out)  # st5_jax reads the Router folder back as the same towers
  assert back.config.towers == towers
  np.testing.assert_allclose(back.encode_query(TEXTS), q, atol=1e-6)
  np.testing.assert_allclose(back.encode_document(TEXTS), d, atol=1e-6)


def test_savedmodel_has_a_signature_per_side(tmp_path, vocab_path):
  import tensorflow as tf

  src, cfg = _asymmetric_model(tmp_path, "separate", vocab_path, prompts={"query": "query: ", "topic": "topic: "})
  enc = SentenceEncoder.load(src)
  q, d = enc.encode_query(TEXTS), enc.encode_document(TEXTS)
  out = tmp_path / "sm"
  export_model(src, format="savedmodel", out=out, platforms=["cpu"])
  sm = tf.saved_model.load(str(out))
  inputs = tf.constant(TEXTS)
  np.testing.assert_allclose(sm.signatures["encode_query"](inputs=inputs)["outputs"].numpy(), q, atol=1e-5)
  np.testing.assert_allclose(sm.signatures["encode_document"](inputs=inputs)["outputs"].numpy(), d, atol=1e-5)
  np.testing.assert_allclose(sm.signatures["serving_default"](inputs=inputs)["outputs"].numpy(), d, atol=1e-5)
  # Prompt signatures: "query" on the query tower, any other name on the default route's.
  np.testing.assert_allclose(sm.signatures["prompt_query"](inputs=inputs)["outputs"].numpy(), q, atol=1e-5)
  np.testing.assert_allclose(sm.signatures["prompt_topic"](inputs=inputs)["outputs"].numpy(),
                             enc.encode(TEXTS, prompt_name="topic"), atol=1e-5)
  back = SentenceEncoder.load(out)  # the SavedModel encoder, by side
  np.testing.assert_allclose(back.encode_query(TEXTS), q, atol=1e-5)
  np.testing.assert_allclose(back.encode_document(TEXTS), d, atol=1e-5)
  cfg_back, params, _, fmt = loader.load_model(out)  # and its variables read back as the same towers
  assert fmt == "savedmodel" and cfg_back.towers == "separate"
  np.testing.assert_allclose(
      st5.SentenceT5(cfg_back).apply({"params": params}, jnp.asarray(_tokens(2, 8, 0)), side="query"),
      enc.encode_tokens(_tokens(2, 8, 0), side="query"), atol=1e-6)


def test_retrieval_evaluation_encodes_each_side_with_its_tower(tmp_path, vocab_path, data_dir):
  src, _ = _asymmetric_model(tmp_path, "projection", vocab_path)
  enc = SentenceEncoder.load(src)
  seen = {"query": [], "document": [], "encode": []}

  def spy(name, fn):
    def run(texts):
      seen[name].extend(texts)
      return fn(texts)
    return run

  harness.evaluate(spy("encode", enc.encode), ["TREC-QA-dev"], data_dir,
                   encode_query=spy("query", enc.encode_query), encode_document=spy("document", enc.encode_document))
  assert seen["query"] and seen["document"] and not seen["encode"]


def test_index_search_mining_and_st5_eval_use_each_sides_tower(tmp_path, vocab_path):
  import argparse

  from st5_jax.commands import eval as eval_cmd
  from st5_jax.retrieval import index as index_lib

  src, _ = _asymmetric_model(tmp_path, "separate", vocab_path)
  enc = SentenceEncoder.load(src)
  q, d = enc.encode_query(TEXTS), enc.encode_document(TEXTS)
  mesh_encoder = index_lib.MeshEncoder(index_lib.load_model(str(src)), batch_size=2)
  # st5 index (documents), st5 search and dense mining (queries) encode through MeshEncoder by side.
  np.testing.assert_allclose(mesh_encoder.encode(TEXTS, side="query"), q, atol=1e-5)
  np.testing.assert_allclose(mesh_encoder.encode(TEXTS, side="document"), d, atol=1e-5)
  np.testing.assert_allclose(mesh_encoder.encode(TEXTS), d, atol=1e-5)  # the default route
  # st5 eval: the retrieval sides of a model without prompts, and a per-task prompt on a side.
  args = argparse.Namespace(query_max_length=None, document_max_length=None, batch_size=8)
  sides = eval_cmd.side_encoders(enc, args)
  np.testing.assert_allclose(sides["encode_query"](TEXTS), q, atol=1e-6)
  np.testing.assert_allclose(sides["encode_document"](TEXTS), d, atol=1e-6)
  prompted = eval_cmd.prompted_encoder(enc, args)
  np.testing.assert_allclose(prompted("q: ", "query")(TEXTS), enc.encode_query(TEXTS, prompt="q: "), atol=1e-6)
  np.testing.assert_allclose(prompted("q: ", "document")(TEXTS), enc.encode_document(TEXTS, prompt="q: "),
                             atol=1e-6)


def test_a_teacher_with_two_towers_is_refused(tmp_path, vocab_path):
  from st5_jax.objectives.distill import teacher  # pylint: disable=g-import-not-at-top

  src, _ = _asymmetric_model(tmp_path, "projection", vocab_path)
  with pytest.raises(ValueError, match="use a teacher with one tower") as e:
    teacher.load_teacher(str(src))
  assert "\n" not in str(e.value)
  out = tmp_path / "st"
  export_model(src, format="sentence-transformers", out=out)
  with pytest.raises(ValueError, match="use a teacher with one tower"):
    teacher.load_teacher(str(out), backend="sentence-transformers")


def test_train_separate_towers_on_a_sharded_mesh(tmp_path, vocab_path):
  cfg = TINY.replace(towers="separate")
  mesh = partitioning.make_mesh(partitioning.MeshConfig(2, 2, 2))
  boxed = Contrastive().abstract_params(cfg)
  specs = tree.flatten(partitioning.param_specs(boxed))
  for side in ("left_tower", "right_tower"):
    spec = specs[f"{side}/encoder/layers_0/mlp/wi/kernel"]
    assert "fsdp" in str(spec) and "model" in str(spec), spec
    assert tuple(specs[f"{side}/projection_layer/kernel"]) == ("fsdp", None)
  proj = tree.flatten(partitioning.param_specs(Contrastive().abstract_params(TINY.replace(towers="projection"))))
  for side in ("left", "right"):  # [embed, affinity]: the shared tower's projection's axes
    assert tuple(proj[f"{side}_projection_layer/kernel"]) == ("fsdp", None)
  tc = train.TrainConfig(num_train_steps=3, global_batch_size=16, checkpoint_every=100, log_every=1, eval_every=-1,
                         optimizer=optim.OptimizerConfig(learning_rate=1e-2))
  result = train.train(workdir=tmp_path / "w", model_config=cfg, train_config=tc, make_iterator=synthetic.factory(),
                       mesh_config=partitioning.MeshConfig(2, 2, 2), vocab_file=vocab_path, progress=False)
  assert result.step == 3
  del mesh
  _, params, _ = native.load_params(tmp_path / "w")
  assert sorted(params) == ["left_tower", "right_tower"]
  enc = SentenceEncoder.load(tmp_path / "w")
  assert enc.config.towers == "separate"
  assert not np.allclose(enc.encode_query(TEXTS), enc.encode_document(TEXTS))
