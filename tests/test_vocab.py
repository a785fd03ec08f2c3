import pytest

from st5_jax import paths, vocab


def test_hello_world(vocab_path):
  tok = vocab.Tokenizer(vocab_path)
  assert tok.encode(["Hello world"], max_length=16) == [[8774, 296, vocab.EOS_ID]]


def test_truncation_keeps_eos(vocab_path):
  tok = vocab.Tokenizer(vocab_path)
  (row,) = tok.encode(["a b c d e f g h i j k"], max_length=4)
  assert len(row) == 4 and row[-1] == vocab.EOS_ID
  (empty,) = tok.encode([""], max_length=4)
  assert empty == [vocab.EOS_ID]


def test_pad_batch():
  arr = vocab.pad_batch([[5, 1], [7, 8, 1]], 4)
  assert arr.tolist() == [[5, 1, 0, 0], [7, 8, 1, 0]]


def test_missing_vocab_is_actionable(tmp_path, monkeypatch):
  monkeypatch.delenv("ST5_VOCAB", raising=False)
  monkeypatch.delenv("ST5_DATA_DIR", raising=False)
  with pytest.raises(paths.MissingFileError, match="ST5_VOCAB"):
    paths.vocab_path(model_dir=tmp_path)
  with pytest.raises(paths.MissingFileError, match="does not exist"):
    paths.vocab_path(tmp_path / "nope.model")
