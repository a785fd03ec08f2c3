"""SentenceEncoder: order, batching, length buckets, native model folders, the CLI."""

import jax
import numpy as np
import pytest

from st5_jax import SentenceEncoder, cli, configs, vocab
from st5_jax.checkpoints import native
from st5_jax.inference import length_bucket
from st5_jax.model import init_params

import flax.linen as nn

TEXTS = ["short", "a much longer sentence with quite a few more words in it than the others",
         "medium length sentence here", "", "short", "Hello world"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, vocab_path):
  cfg = configs.ST5Config(t5=configs.t5_size("t5_tiny"), pooling="enc_mean", embedding_dim=16, max_length=32)
  params = jax.device_get(nn.unbox(init_params(cfg, jax.random.PRNGKey(0))))
  d = tmp_path_factory.mktemp("native_model")
  native.save_model(d, cfg, params, step=7, vocab_file=vocab_path)
  return d


def test_native_round_trip_and_vocab_travels(model_dir, monkeypatch):
  monkeypatch.delenv("ST5_VOCAB")
  monkeypatch.delenv("ST5_DATA_DIR")
  enc = SentenceEncoder.load(model_dir)  # vocab found in the folder itself
  assert enc.source.startswith("native:") and enc.dim == 16
  emb = enc.encode(TEXTS)
  assert emb.shape == (6, 16) and emb.dtype == np.float32
  np.testing.assert_allclose(np.linalg.norm(emb, axis=-1), 1, atol=1e-5)
  np.testing.assert_allclose(emb[0], emb[4], atol=1e-6)  # same text, same embedding


def test_batching_and_order_do_not_change_embeddings(model_dir):
  enc = SentenceEncoder.load(model_dir)
  full = enc.encode(TEXTS, batch_size=64)
  one_by_one = np.stack([enc.encode([t])[0] for t in TEXTS])
  np.testing.assert_allclose(full, one_by_one, atol=1e-5)
  np.testing.assert_allclose(enc.encode(TEXTS, batch_size=2), full, atol=1e-5)
  rev = enc.encode(TEXTS[::-1])
  np.testing.assert_allclose(rev[::-1], full, atol=1e-5)
  assert enc.encode([]).shape == (0, 16)


def test_single_string_and_sentence_transformers_keywords(model_dir, vocab_path, capsys):
  import torch

  enc = SentenceEncoder.load(model_dir)
  full = enc.encode(TEXTS)
  one = enc.encode("Hello world")  # as SentenceTransformer.encode: a string gives a 1-D vector
  assert one.shape == (16,) and one.dtype == np.float32
  np.testing.assert_allclose(one, full[-1], atol=1e-5)
  np.testing.assert_allclose(enc.encode(TEXTS, batch_size=2, show_progress_bar=True, convert_to_numpy=True),
                             full, atol=1e-5)
  assert "encode" in capsys.readouterr().err  # show_progress_bar drew tqdm's bar
  rows = enc.encode(TEXTS, convert_to_numpy=False)
  assert isinstance(rows, list) and len(rows) == 6 and rows[1].shape == (16,)
  tensor = enc.encode(TEXTS, convert_to_tensor=True)
  assert isinstance(tensor, torch.Tensor) and tuple(tensor.shape) == (6, 16)
  np.testing.assert_allclose(tensor.numpy(), full, atol=1e-5)
  assert tuple(enc.encode("Hello world", convert_to_tensor=True).shape) == (16,)
  with pytest.raises(TypeError, match="device"):
    enc.encode(TEXTS, device="cpu")
  with pytest.raises(TypeError, match="strings"):
    enc.encode([1, 2])
  # normalize_embeddings matters for a model that does not normalise (normalize=False).
  raw = SentenceEncoder(enc.config.replace(normalize=False), enc.params, tokenizer=vocab.Tokenizer(vocab_path))
  plain = raw.encode(TEXTS)
  assert not np.allclose(np.linalg.norm(plain, axis=1), 1, atol=1e-3)
  normed = raw.encode(TEXTS, normalize_embeddings=True)
  np.testing.assert_allclose(normed, plain / np.linalg.norm(plain, axis=1, keepdims=True), rtol=1e-5)


def test_truncation_to_max_length(model_dir):
  enc = SentenceEncoder.load(model_dir, max_length=8)
  long = " ".join(["word"] * 100)
  tokens = enc.tokenize([long])[0]
  assert len(tokens) == 8 and tokens[-1] == vocab.EOS_ID
  # The truncated text embeds as exactly the text that fits: its first 7 pieces and EOS.
  fits = " ".join(["word"] * 7)
  assert enc.tokenize([fits])[0] == tokens
  emb = enc.encode([long, fits, "word word word"])
  np.testing.assert_allclose(emb[0], emb[1], atol=1e-6)
  assert not np.allclose(emb[0], emb[2], atol=1e-3)


def test_length_buckets():
  assert [length_bucket(n, 128) for n in (1, 8, 9, 17, 100, 129)] == [8, 8, 16, 32, 128, 128]
  assert length_bucket(70, 96) == 96


def test_encode_command(model_dir, tmp_path):
  inp = tmp_path / "sentences.txt"
  inp.write_text("\n".join(TEXTS) + "\n")
  out = tmp_path / "emb.npy"
  assert cli.main(["encode", "--model", str(model_dir), "--input", str(inp), "--output", str(out),
                   "--no_progress"]) == 0
  emb = np.load(out)
  np.testing.assert_allclose(emb, SentenceEncoder.load(model_dir).encode(TEXTS), atol=1e-6)


def test_half_written_checkpoint_is_never_restored(model_dir, tmp_path):
  import shutil
  d = tmp_path / "copy"
  shutil.copytree(model_dir, d)
  # A crash mid-save leaves an uncommitted temporary step directory behind.
  (d / "checkpoints" / "9.orbax-checkpoint-tmp-1234").mkdir()
  _, _, step = native.load_params(d)
  assert step == 7
