"""One definition of what the JAX encoder, the in-loop evaluation and the SavedModel share."""

from __future__ import annotations

import pytest
import sentencepiece as spm

from st5_jax import encoder, inference, vocab
from st5_jax.data import vocabulary
from st5_jax.evaluation import in_training
from st5_jax.export import savedmodel


@pytest.mark.parametrize("fine", [False, True])
@pytest.mark.parametrize("max_length", [5, 8, 96, 128, 512])
def test_bucket_list_is_exactly_the_values_length_bucket_takes(fine, max_length):
  taken = sorted({inference.length_bucket(n, max_length, fine=fine) for n in range(0, max_length + 40)})
  assert inference.length_buckets(max_length, fine=fine) == taken
  for n in range(1, max_length + 1):
    b = inference.length_bucket(n, max_length, fine=fine)
    assert n <= b <= max_length


def test_bucket_values():
  assert inference.length_buckets(128) == [8, 16, 32, 64, 128]
  assert inference.length_buckets(100, fine=True) == [8, 12, 16, 24, 32, 48, 64, 96, 100]
  assert [encoder.length_bucket(n, 128) for n in (1, 8, 9, 17, 100, 129)] == [8, 8, 16, 32, 128, 128]


def test_every_user_imports_the_one_definition():
  assert savedmodel.length_buckets is inference.length_buckets
  assert encoder.length_bucket is in_training.length_bucket is inference.length_bucket
  assert encoder.default_dtype is inference.default_dtype
  assert vocabulary.EXTRA_IDS is vocab.EXTRA_IDS and vocabulary.get_vocabulary().extra_ids == vocab.EXTRA_IDS
  assert inference.default_dtype() == "float32"  # the tests run on CPU


def test_t5_vocabulary_check_is_shared(vocab_path):
  sp = spm.SentencePieceProcessor(model_file=vocab_path)
  vocab.check_t5(sp, where="v", vocab_size=32128)
  with pytest.raises(ValueError, match="pieces but the model embeds only 384 ids"):
    vocab.check_t5(sp, where="v", vocab_size=384)
