"""Parity with Hugging Face transformers (PyTorch) and sentence-transformers on tiny T5s."""

import json
import pathlib
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from st5_jax import SentenceEncoder, configs
from st5_jax.checkpoints import loader
from st5_jax.checkpoints import hf, tree
from st5_jax.model import SentenceT5, T5

SENTENCES = ["A man is playing a guitar.", "Hello world", "The quick brown fox jumps over the lazy dog twice.", ""]


def _hf_config(version: str) -> transformers.T5Config:
  common = dict(vocab_size=32128, d_model=32, d_kv=8, num_heads=4, num_layers=2, num_decoder_layers=3,
                dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
  if version == "1.0":
    return transformers.T5Config(d_ff=64, feed_forward_proj="relu", tie_word_embeddings=True, **common)
  return transformers.T5Config(d_ff=48, feed_forward_proj="gated-gelu", tie_word_embeddings=False, **common)


def _save_hf(tmp_path, version, *, fmt="safetensors", seed=0) -> tuple[pathlib.Path, torch.nn.Module]:
  torch.manual_seed(seed)
  model = transformers.T5ForConditionalGeneration(_hf_config(version)).eval()
  with torch.no_grad():  # non-trivial norms, so a missed scale would show
    for name, p in model.named_parameters():
      if "layer_norm" in name:
        p.uniform_(0.5, 1.5)
  out = tmp_path / f"hf_{version}_{fmt}"
  model.save_pretrained(out, safe_serialization=(fmt == "safetensors"))
  if fmt == "bin":
    for f in out.glob("*.safetensors"):
      f.unlink()
    if not list(out.glob("pytorch_model*.bin")):
      torch.save(model.state_dict(), out / "pytorch_model.bin")
  return out, model


def _tokens(vocab_path, texts, length=16):
  from st5_jax import vocab
  tok = vocab.Tokenizer(vocab_path)
  return vocab.pad_batch(tok.encode(texts, max_length=length), length)


@pytest.mark.parametrize("version", ["1.0", "1.1"])
@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_t5_matches_transformers_with_padding(tmp_path, vocab_path, version, fmt):
  folder, ref = _save_hf(tmp_path, version, fmt=fmt)
  cfg, flat, unknown = hf.load_folder(folder)
  assert not unknown
  assert cfg.mlp_activations == (("relu",) if version == "1.0" else ("gelu", "linear"))
  params = tree.unflatten(flat)
  tokens = _tokens(vocab_path, SENTENCES)  # ragged lengths: padding in the batch
  mask = tokens > 0
  dec_in = np.array([[0, 37, 5, 9], [0, 8, 1, 1], [0, 3, 3, 3], [0, 2, 2, 2]], np.int32)

  model = T5(cfg)
  ours_enc = model.apply({"params": params}, jnp.asarray(tokens), method=T5.encode)
  ours_logits = model.apply({"params": params}, jnp.asarray(tokens), jnp.asarray(dec_in))
  ours_dec = model.apply({"params": params}, ours_enc, jnp.asarray(tokens), jnp.asarray(dec_in), method=T5.decode)
  with torch.no_grad():
    out = ref(input_ids=torch.tensor(tokens, dtype=torch.long), attention_mask=torch.tensor(mask, dtype=torch.long),
              decoder_input_ids=torch.tensor(dec_in, dtype=torch.long), output_hidden_states=True)
  np.testing.assert_allclose(np.asarray(ours_enc), out.encoder_last_hidden_state.numpy(), atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(ours_dec), out.decoder_hidden_states[-1].numpy(), atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(ours_logits), out.logits.numpy(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_st5_poolings_match_transformers(tmp_path, vocab_path, version):
  folder, ref = _save_hf(tmp_path, version)
  tokens = _tokens(vocab_path, SENTENCES)
  mask = tokens > 0
  with torch.no_grad():
    enc = ref.encoder(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask.astype(np.int64)))
    enc = enc.last_hidden_state.numpy()
    dec = ref(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask.astype(np.int64)),
              decoder_input_ids=torch.zeros((len(tokens), 1), dtype=torch.long),
              output_hidden_states=True).decoder_hidden_states[-1][:, 0].numpy()
  expected = {
      "enc_first": enc[:, 0],
      "enc_mean": (enc * mask[..., None]).sum(1) / mask.sum(1, keepdims=True),
      "encdec_first": dec,
  }
  for pooling, want in expected.items():
    cfg, params, report, fmt = loader.load_model(folder, pooling=pooling, embedding_dim=None)
    assert fmt == "hf" and cfg.embedding_dim is None
    if pooling != "encdec_first":
      assert any(k.startswith("decoder/") for k in report.unused)
    got = SentenceT5(cfg).apply({"params": params}, jnp.asarray(tokens))
    np.testing.assert_allclose(np.asarray(got), want / np.linalg.norm(want, axis=-1, keepdims=True), atol=1e-5)


def _build_sentence_t5(tmp_path, vocab_path) -> pathlib.Path:
  """A tiny model in the layout of the public sentence-t5 models, saved by sentence-transformers."""
  from sentence_transformers import SentenceTransformer, models

  torch.manual_seed(3)
  t5_dir = tmp_path / "t5_encoder"
  transformers.T5EncoderModel(_hf_config("1.0")).save_pretrained(t5_dir)
  shutil.copyfile(vocab_path, t5_dir / "spiece.model")
  transformers.T5Tokenizer.from_pretrained(t5_dir).save_pretrained(t5_dir)
  word = models.Transformer(str(t5_dir), max_seq_length=24)
  pool = models.Pooling(word.get_embedding_dimension(), pooling_mode="mean")
  dense = models.Dense(32, 16, bias=False, activation_function=torch.nn.Identity())
  st = SentenceTransformer(modules=[word, pool, dense, models.Normalize()], device="cpu")
  out = tmp_path / "sentence_t5_tiny"
  st.save(str(out))
  return out


def test_sentence_transformers_folder_parity(tmp_path, vocab_path):
  from sentence_transformers import SentenceTransformer

  folder = _build_sentence_t5(tmp_path, vocab_path)
  ref = SentenceTransformer(str(folder), device="cpu").encode(SENTENCES, convert_to_numpy=True)
  ours = SentenceEncoder.load(folder)
  assert ours.config.pooling == "enc_mean" and ours.config.embedding_dim == 16
  assert ours.config.max_length == 24
  np.testing.assert_allclose(ours.encode(SENTENCES), ref, atol=1e-5)


def test_public_sentence_t5_layout(tmp_path, vocab_path):
  """The layout of sentence-transformers/sentence-t5-*: legacy module names, .bin Dense."""
  from safetensors.numpy import load_file
  from sentence_transformers import SentenceTransformer

  folder = _build_sentence_t5(tmp_path, vocab_path)
  legacy = {"Transformer": "sentence_transformers.models.Transformer",
            "Pooling": "sentence_transformers.models.Pooling",
            "Dense": "sentence_transformers.models.Dense",
            "Normalize": "sentence_transformers.models.Normalize"}
  modules = json.loads((folder / "modules.json").read_text())
  for m in modules:
    m["type"] = legacy[m["type"].rsplit(".", 1)[-1]]
  (folder / "modules.json").write_text(json.dumps(modules))
  dense = folder / "2_Dense"
  weights = load_file(dense / "model.safetensors")
  torch.save({k: torch.tensor(v) for k, v in weights.items()}, dense / "pytorch_model.bin")
  (dense / "model.safetensors").unlink()
  (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 20, "do_lower_case": False}))
  shutil.copyfile(vocab_path, folder / "spiece.model")
  ours = SentenceEncoder.load(folder)
  assert ours.config.max_length == 20
  ref = SentenceTransformer(str(folder), device="cpu").encode(SENTENCES, convert_to_numpy=True)
  np.testing.assert_allclose(ours.encode(SENTENCES), ref, atol=1e-5)


def test_sentence_transformers_refuses_what_st5_cannot_express(tmp_path, vocab_path):
  folder = _build_sentence_t5(tmp_path, vocab_path)
  modules = json.loads((folder / "modules.json").read_text())
  dense_dir = folder / next(m["path"] for m in modules if m["type"].endswith("Dense"))
  dcfg = json.loads((dense_dir / "config.json").read_text())
  dcfg["activation_function"] = "torch.nn.modules.activation.Tanh"
  (dense_dir / "config.json").write_text(json.dumps(dcfg))
  with pytest.raises(ValueError, match="no bias and no activation"):
    SentenceEncoder.load(folder)


def test_missing_and_misshapen_parameters_are_named(tmp_path, vocab_path):
  folder, _ = _save_hf(tmp_path, "1.0")
  cfg, flat, _ = hf.load_folder(folder)
  st5 = configs.ST5Config(t5=cfg, embedding_dim=None)
  broken = dict(flat)
  del broken["encoder/layers_1/mlp/wo/kernel"]
  broken["encoder/layers_0/attention/query/kernel"] = np.zeros((32, 31), np.float32)
  broken["encoder/adapter/kernel"] = np.zeros((2, 2), np.float32)
  with pytest.raises(tree.ParameterMismatchError) as err:
    tree.assemble(st5, broken, source="test")
  msg = str(err.value)
  assert "encoder/layers_1/mlp/wo/kernel" in msg
  assert "encoder/layers_0/attention/query/kernel: (32, 31)" in msg and "(32, 32)" in msg
  # Unknown names are reported, not silently dropped.
  flat2 = dict(flat, **{"adapter/kernel": np.zeros((2, 2), np.float32)})
  _, report = tree.assemble(st5, flat2, source="test")
  assert report.unexpected == ["adapter/kernel"]
  with pytest.raises(tree.ParameterMismatchError, match="decoder/"):
    tree.assemble(st5.replace(pooling="encdec_first"),
                  {k: v for k, v in flat.items() if not k.startswith("decoder/")}, source="enc-only")


def test_export_names_round_trip(tmp_path):
  folder, ref = _save_hf(tmp_path, "1.1")
  _, flat, _ = hf.load_folder(folder)
  sd = hf.to_hf_state_dict(flat)
  ref_sd = {k: v.numpy() for k, v in ref.state_dict().items()}
  for k, v in sd.items():
    np.testing.assert_array_equal(v, ref_sd[k], err_msg=k)
  missing = set(ref_sd) - set(sd) - {"decoder.embed_tokens.weight"}
  assert not missing


def test_fresh_projection_for_contrastive_training(tmp_path):
  folder, _ = _save_hf(tmp_path, "1.0")
  cfg, params, report, _ = loader.load_model(folder, embedding_dim=24)
  assert report.missing_initialised == ["projection_layer/kernel"]
  assert params["projection_layer"]["kernel"].shape == (32, 24)
  assert np.std(params["projection_layer"]["kernel"]) > 0


@pytest.mark.parametrize("acts", [("relu",), ("gelu_exact",), ("gelu",), ("gelu", "linear"), ("relu", "linear")])
def test_hf_config_round_trips_activations(acts):
  cfg = configs.t5_size("t5_tiny").replace(mlp_activations=acts)
  back = hf.t5_config_from_hf(hf.hf_config_from_t5(cfg, encoder_only=True))
  assert back.mlp_activations == acts
  # ...and transformers agrees on the function it builds.
  hf_cfg = transformers.T5Config(**{k: v for k, v in hf.hf_config_from_t5(cfg, encoder_only=True).items()
                                    if k != "architectures"})
  assert hf_cfg.is_gated_act == (len(acts) == 2)
  assert hf_cfg.dense_act_fn == {"relu": "relu", "gelu_exact": "gelu", "gelu": "gelu_new"}[acts[0]]


def test_unrepresentable_activations_are_refused():
  with pytest.raises(ValueError, match="no Hugging Face"):
    hf.hf_config_from_t5(configs.t5_size("t5_tiny").replace(mlp_activations=("gelu_exact", "linear")),
                         encoder_only=True)
