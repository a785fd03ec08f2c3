"""SentenceEncoder.encode's length buckets and pipelined batches (docs/performance.md)."""

from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np
import pytest

from st5_jax import configs, vocab
from st5_jax.encoder import SentenceEncoder, encode_length_bucket
from st5_jax.model import init_params


def test_encode_length_buckets():
  assert [encode_length_bucket(n, 256) for n in (1, 8, 9, 12, 13, 17, 25, 33, 49, 65, 97, 129, 193, 300)] == [
      8, 8, 12, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 256]
  assert encode_length_bucket(70, 96) == 96 and encode_length_bucket(97, 100) == 100
  for n in range(9, 513):
    b = encode_length_bucket(n, 1 << 20)
    assert n <= b <= 1.5 * n, n  # never more than 1.5x the longest row


@pytest.fixture(scope="module")
def encoder(vocab_path):
  cfg = configs.ST5Config(t5=configs.t5_size("t5_tiny"), pooling="enc_mean", embedding_dim=16, max_length=64)
  params = jax.device_get(nn.unbox(init_params(cfg, jax.random.PRNGKey(0))))
  return SentenceEncoder(cfg, params, tokenizer=vocab.Tokenizer(vocab_path))


def test_pipelined_batches_equal_each_sentence_alone(encoder):
  rng = np.random.default_rng(0)
  words = "the a man woman dog plays runs on in park with guitar red blue quickly tomorrow".split()
  texts = [" ".join(rng.choice(words, size=n)) for n in rng.integers(1, 40, size=23)]
  got = encoder.encode(texts, batch_size=4)  # 6 batches in flight one after another, several buckets
  rows = encoder.tokenize(texts)
  assert len({encode_length_bucket(len(r), 64) for r in rows}) >= 3
  # Each sentence alone, padded to exactly its own length: no bucket, no batch mates.
  want = np.stack([encoder.encode_tokens(vocab.pad_batch([r], len(r)))[0] for r in rows])
  np.testing.assert_allclose(got, want, atol=1e-5)
