"""The real legacy T5X checkpoints in ../shared/fixtures, checked against transformers."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from st5_jax.checkpoints import loader
from st5_jax.checkpoints import hf, t5x, tree
from st5_jax.model import SentenceT5, T5

DUAL = "t5x_tiny_dual_encoder_checkpoint_1000"  # T5 1.0 dual encoder, zarr arrays + projection
ENCDEC = "t5x_test_t5_tiny.checkpoint_0"  # T5.1.1 encoder-decoder, all inline


def _hf_model(cfg, flat, *, encoder_only):
  hf_cfg = transformers.T5Config(**{k: v for k, v in hf.hf_config_from_t5(cfg, encoder_only=encoder_only).items()
                                    if k != "architectures"})
  cls = transformers.T5EncoderModel if encoder_only else transformers.T5ForConditionalGeneration
  model = cls(hf_cfg).eval()
  sd = {k: torch.tensor(v) for k, v in hf.to_hf_state_dict(flat).items()}
  lm_head = sd.pop("lm_head.weight", None)
  missing, unexpected = model.load_state_dict(sd, strict=False)
  if lm_head is not None:
    # transformers 5 ties lm_head to the embedding; T5.1.1 needs them separate.
    model.lm_head.weight = torch.nn.Parameter(lm_head)
  # Only tied copies may be absent.
  assert set(missing) <= {"decoder.embed_tokens.weight", "lm_head.weight", "encoder.embed_tokens.weight"}, missing
  assert not [k for k in unexpected if not k.startswith("decoder")] or not encoder_only
  return model


def _tokens(vocab_path):
  from st5_jax import vocab
  tok = vocab.Tokenizer(vocab_path)
  return vocab.pad_batch(tok.encode(["Sentence one.", "A longer second sentence here", "x"], max_length=12), 12)


def test_dual_encoder_fixture(fixtures_dir, vocab_path):
  path = fixtures_dir / DUAL
  assert loader.detect_format(path) == "t5x"
  cfg, proj_dim, flat = t5x.load(path)
  assert (cfg.emb_dim, cfg.num_heads, cfg.head_dim, cfg.mlp_dim, cfg.num_encoder_layers) == (4, 2, 2, 8, 2)
  assert cfg.mlp_activations == ("relu",) and proj_dim == 768
  assert flat["token_embedder/embedding"].shape == (32128, 4)  # read from zarr via tensorstore

  st5_cfg, params, report, fmt = loader.load_model(path)
  assert st5_cfg.embedding_dim == 768 and not report.unexpected and not report.missing_initialised
  tokens = _tokens(vocab_path)
  ours = np.asarray(SentenceT5(st5_cfg).apply({"params": params}, jnp.asarray(tokens)))

  ref = _hf_model(cfg, flat, encoder_only=True)
  mask = tokens > 0
  with torch.no_grad():
    hidden = ref(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask.astype(np.int64))).last_hidden_state.numpy()
  pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
  projected = pooled @ flat["projection_layer/kernel"]
  want = projected / np.linalg.norm(projected, axis=-1, keepdims=True)
  np.testing.assert_allclose(ours, want, atol=1e-5)


def test_t5_1_1_encoder_decoder_fixture(fixtures_dir, vocab_path):
  path = fixtures_dir / ENCDEC
  assert loader.detect_format(path) == "t5x"
  cfg, proj_dim, flat = t5x.load(path)
  assert (cfg.emb_dim, cfg.num_heads, cfg.head_dim, cfg.mlp_dim) == (8, 4, 3, 16)
  assert cfg.mlp_activations == ("gelu", "linear") and not cfg.logits_via_embedding and proj_dim is None
  tokens = _tokens(vocab_path)
  dec_in = np.array([[0, 5, 6], [0, 7, 1], [0, 1, 1]], np.int32)
  params = tree.unflatten(flat)
  enc = T5(cfg).apply({"params": params}, jnp.asarray(tokens), method=T5.encode)
  logits = T5(cfg).apply({"params": params}, jnp.asarray(tokens), jnp.asarray(dec_in))

  ref = _hf_model(cfg, flat, encoder_only=False)
  mask = tokens > 0
  with torch.no_grad():
    out = ref(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask.astype(np.int64)),
              decoder_input_ids=torch.tensor(dec_in))
  np.testing.assert_allclose(np.asarray(enc), out.encoder_last_hidden_state.numpy(), atol=1e-5)
  np.testing.assert_allclose(np.asarray(logits), out.logits.numpy(), atol=1e-4)

  # As a sentence encoder: all three poolings load (the decoder only for encdec_first) and equal
  # transformers' hidden states pooled by hand: first token, masked mean, and the decoder's
  # output for the start token 0 alone.
  hidden = out.encoder_last_hidden_state.numpy()
  with torch.no_grad():
    dec = ref(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask.astype(np.int64)),
              decoder_input_ids=torch.zeros((3, 1), dtype=torch.long), output_hidden_states=True)
  pooled = {"enc_first": hidden[:, 0], "enc_mean": (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True),
            "encdec_first": dec.decoder_hidden_states[-1][:, 0].numpy()}
  for pooling, want in pooled.items():
    st5_cfg, p, report, _ = loader.load_model(path, pooling=pooling)
    assert "decoder/logits_dense/kernel" in report.unused
    emb = SentenceT5(st5_cfg).apply({"params": p}, jnp.asarray(tokens))
    assert emb.shape == (3, 8)
    np.testing.assert_allclose(emb, want / np.linalg.norm(want, axis=-1, keepdims=True), atol=1e-5, err_msg=pooling)


def test_not_a_checkpoint_is_a_clear_error(tmp_path):
  bogus = tmp_path / "checkpoint"
  bogus.write_bytes(b"not msgpack at all")
  with pytest.raises(ValueError, match="Cannot tell the format"):
    loader.detect_format(tmp_path)
  with pytest.raises(FileNotFoundError, match="does not exist"):
    loader.detect_format(tmp_path / "nothing")
