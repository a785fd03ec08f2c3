"""tokenizer.json-only folders (transformers 5, SentenceTransformer.save): same tokens as spiece.model."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import sentencepiece as spm
import transformers

from st5_jax import SentenceEncoder, paths, vocab
from st5_jax.evaluation import readers


@pytest.fixture(scope="module")
def tokenizer_json_dir(tmp_path_factory, vocab_path):
  src = tmp_path_factory.mktemp("spiece")
  shutil.copyfile(vocab_path, src / "spiece.model")
  out = tmp_path_factory.mktemp("tokjson")
  transformers.T5Tokenizer.from_pretrained(str(src)).save_pretrained(str(out))
  assert (out / "tokenizer.json").is_file() and not (out / "spiece.model").exists()  # what transformers 5 writes
  return out


def test_every_stsb_sentence_tokenises_as_with_spiece_model(tokenizer_json_dir, vocab_path, data_dir):
  ref = spm.SentencePieceProcessor(model_file=vocab_path)
  ours = vocab.Tokenizer(str(tokenizer_json_dir / "tokenizer.json"))
  assert ours.sp.get_piece_size() == ref.get_piece_size() == 32000
  assert [ours.sp.id_to_piece(i) for i in range(32000)] == [ref.id_to_piece(i) for i in range(32000)]
  sentences = []
  for split in ("train", "dev", "test"):
    pairs = readers.read_stsb(data_dir, split=split)
    sentences += list(pairs.sents1) + list(pairs.sents2)
  sentences += ["  leading,  doubled   and trailing spaces  ", "ﬁ ① Ｆｕｌｌｗｉｄｔｈ", "tab\there", ""]
  assert len(sentences) > 17000
  want = ref.encode(sentences, out_type=int)
  got = ours.sp.encode(sentences, out_type=int)
  mismatches = [(s, w, g) for s, w, g in zip(sentences, want, got) if w != g]
  assert not mismatches, mismatches[:3]
  assert ours.encode(["Hello world"], max_length=8) == [[8774, 296, vocab.EOS_ID]]


def test_unsupported_tokenizer_json_is_refused_clearly(tmp_path, tokenizer_json_dir):
  data = json.loads((tokenizer_json_dir / "tokenizer.json").read_text())
  data["model"] = {"type": "BPE", "vocab": {}, "merges": []}
  (tmp_path / "tokenizer.json").write_text(json.dumps(data))
  with pytest.raises(ValueError, match="only Unigram"):
    vocab.model_proto(tmp_path / "tokenizer.json")


def test_hf_folder_with_only_tokenizer_json_loads_and_exports(tmp_path, tokenizer_json_dir, vocab_path, monkeypatch):
  import torch

  from st5_jax.export import export_model
  from st5_jax.export.savedmodel import SavedModelEncoder

  torch.manual_seed(0)
  folder = tmp_path / "hf_t5"
  cfg = transformers.T5Config(vocab_size=32128, d_model=32, d_kv=8, num_heads=4, num_layers=2, d_ff=64,
                              feed_forward_proj="relu", dropout_rate=0.0, pad_token_id=0, eos_token_id=1)
  transformers.T5EncoderModel(cfg).save_pretrained(folder)
  shutil.copyfile(tokenizer_json_dir / "tokenizer.json", folder / "tokenizer.json")
  monkeypatch.delenv("ST5_VOCAB", raising=False)
  monkeypatch.delenv("ST5_DATA_DIR", raising=False)
  assert paths.vocab_path(model_dir=folder).endswith("tokenizer.json")

  sentences = ["Hello world", "A man is playing a guitar.", "  spaced   out  "]
  enc = SentenceEncoder.load(folder, pooling="enc_mean")
  with_spiece = SentenceEncoder.load(folder, pooling="enc_mean", vocab=vocab_path)
  assert enc.tokenize(sentences) == with_spiece.tokenize(sentences)
  want = with_spiece.encode(sentences)
  np.testing.assert_allclose(enc.encode(sentences), want, atol=1e-6)

  out = tmp_path / "sm"
  export_model(str(folder), format="savedmodel", out=str(out), pooling="enc_mean", platforms=("cpu",))
  assert (out / "assets" / "spiece.model").read_bytes() == vocab.model_proto(folder / "tokenizer.json")
  sm = SentenceEncoder.load(out)
  assert isinstance(sm, SavedModelEncoder)
  assert sm.tokenize(sentences) == with_spiece.tokenize(sentences)  # the in-graph tokenizer agrees
  np.testing.assert_allclose(sm.encode(sentences), want, atol=1e-5)
