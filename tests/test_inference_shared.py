"""One definition of what the JAX encoder, the in-loop evaluation and the SavedModel share."""

from __future__ import annotations

import ast
import pathlib

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
  assert vocabulary.get_vocabulary().extra_ids == vocab.EXTRA_IDS
  assert inference.default_dtype() == "float32"  # the tests run on CPU


def test_t5_vocabulary_check_is_shared(vocab_path):
  sp = spm.SentencePieceProcessor(model_file=vocab_path)
  vocab.check_t5(sp, where="v", vocab_size=32128)
  with pytest.raises(ValueError, match="pieces but the model embeds only 384 ids"):
    vocab.check_t5(sp, where="v", vocab_size=384)


def test_each_shared_name_is_defined_once_in_the_package():
  """A second definition (a copy in the SavedModel or data code) fails here, not in a drift bug later."""
  shared = {"EXTRA_IDS", "EOS_ID", "MIN_LENGTH_BUCKET", "MIN_BUCKET", "_EOS_ID", "length_bucket", "length_buckets",
            "default_dtype", "check_t5"}
  where = {}
  for f in sorted((pathlib.Path(__file__).resolve().parents[1] / "st5_jax").rglob("*.py")):
    for node in ast.parse(f.read_text(encoding="utf-8")).body:
      names = [node.name] if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else [
          t.id for t in getattr(node, "targets", [getattr(node, "target", None)]) if isinstance(t, ast.Name)]
      for name in set(names) & shared:
        where.setdefault(name, []).append(f.name)
  assert {k: v for k, v in where.items() if len(v) > 1} == {}
  assert where["length_bucket"] == where["default_dtype"] == ["inference.py"] and where["EXTRA_IDS"] == ["vocab.py"]
