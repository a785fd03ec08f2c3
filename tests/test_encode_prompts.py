"""encode's prompts (saved with the model by gin), encode_query / encode_document, truncate_dim and precision;
`st5 encode` with them; `st5 eval`'s retrieval sides use the prompts."""

import argparse
import json

import flax.linen as nn
import gin
import jax
import numpy as np
import pytest

from st5_jax import SentenceEncoder, cli, configs, gin_config, quantize
from st5_jax.checkpoints import native
from st5_jax.commands import eval as eval_command
from st5_jax.model import init_params

TEXTS = ["A man is playing a guitar.", "Hello world", "", "Sentence-T5 turns T5 into a sentence encoder.",
         "naïve café"]
PROMPTS = {"query": "query: ", "document": "passage: ", "classify": "Classify the topic: "}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, vocab_path):
  """A t5_tiny model whose prompts come from gin, as a training run writes its st5_config.json."""
  gin.clear_config()
  gin.parse_config("st5_model.size = 't5_tiny'\nst5_model.embedding_dim = 16\nst5_model.max_length = 32\n"
                   f"st5_model.prompts = {PROMPTS!r}\nst5_model.default_prompt_name = 'classify'\n")
  cfg = gin_config.st5_model()
  gin.clear_config()
  params = jax.device_get(nn.unbox(init_params(cfg, jax.random.PRNGKey(0))))
  d = tmp_path_factory.mktemp("prompts") / "model"
  native.save_model(d, cfg, params, step=1, vocab_file=vocab_path)
  return d


def test_prompts_are_saved_with_the_model_and_a_model_without_them_is_unchanged(model_dir):
  saved = json.loads((model_dir / native.CONFIG_FILE).read_text())
  assert saved["prompts"] == PROMPTS and saved["default_prompt_name"] == "classify" and "truncate_dim" not in saved
  enc = SentenceEncoder.load(model_dir)
  assert enc.prompts == PROMPTS and enc.default_prompt_name == "classify" and enc.truncate_dim is None
  assert configs.ST5Config.from_dict(saved) == enc.config.replace(t5=enc.config.t5)
  # Without prompts the config writes the keys it always wrote (index fingerprints stay what they were).
  plain = configs.ST5Config(t5=configs.t5_size("t5_tiny"), embedding_dim=16)
  assert set(plain.to_dict()) == {"t5", "pooling", "embedding_dim", "normalize", "max_length",
                                  "layer_attention_token", "layer_attention_norm"}
  with pytest.raises(ValueError, match=r"default_prompt_name 'doc' is not one of the prompts \(classify, document, "
                                       r"query\)"):
    enc.config.replace(default_prompt_name="doc")
  with pytest.raises(ValueError, match="truncate_dim must be between 1 and the embedding size 16, got 17"):
    enc.config.replace(truncate_dim=17)


def test_prompts_encode_query_and_encode_document_as_sentence_transformers(model_dir):
  enc = SentenceEncoder.load(model_dir)
  raw = enc.encode(TEXTS, prompt="")  # an explicit empty prompt overrides the default one
  np.testing.assert_allclose(enc.encode(TEXTS), enc.encode(["Classify the topic: " + t for t in TEXTS], prompt=""),
                             atol=1e-6)  # the default prompt, prepended as text
  assert not np.allclose(enc.encode(TEXTS), raw, atol=1e-3)
  np.testing.assert_allclose(enc.encode(TEXTS, prompt_name="query"), enc.encode(["query: " + t for t in TEXTS],
                                                                                prompt=""), atol=1e-6)
  np.testing.assert_allclose(enc.encode(TEXTS, prompt="q: ", prompt_name="document"),  # prompt wins, as in ST
                             enc.encode(["q: " + t for t in TEXTS], prompt=""), atol=1e-6)
  np.testing.assert_allclose(enc.encode_query(TEXTS), enc.encode(TEXTS, prompt_name="query"), atol=1e-6)
  np.testing.assert_allclose(enc.encode_document(TEXTS), enc.encode(TEXTS, prompt_name="document"), atol=1e-6)
  np.testing.assert_allclose(enc.encode_document(TEXTS, prompt_name="query"), enc.encode_query(TEXTS), atol=1e-6)
  # Without "query" / "document" prompts both add none, not the default prompt, and "passage" is not a
  # document prompt: what a SentenceTransformer loaded from the folder does (its empty "query" / "document").
  other = SentenceEncoder(enc.config.replace(prompts={"classify": "Classify the topic: ", "passage": "p: "}),
                          enc.params, tokenizer=enc.tokenizer)
  np.testing.assert_allclose(other.encode(TEXTS), enc.encode(TEXTS), atol=1e-6)
  np.testing.assert_allclose(other.encode_query(TEXTS), raw, atol=1e-6)
  np.testing.assert_allclose(other.encode_document(TEXTS), raw, atol=1e-6)
  # The prompt is tokenised with the text and counts in max_length: 7 pieces of prompt and EOS fill 8 tokens.
  short = enc.with_max_length(8)
  long_prompt = "one two three four five six seven eight "
  assert len(short.tokenize([long_prompt + "Hello"])[0]) == 8
  emb = short.encode(TEXTS, prompt=long_prompt)
  np.testing.assert_allclose(emb, np.repeat(emb[:1], len(TEXTS), axis=0), atol=1e-6)
  with pytest.raises(ValueError, match=r"prompt_name 'passage' is not one of the model's prompts \('classify', "
                                       r"'document', 'query'\)"):
    enc.encode(TEXTS, prompt_name="passage")


def test_truncate_dim_keeps_the_first_dimensions_renormalised(model_dir, vocab_path):
  enc = SentenceEncoder.load(model_dir)
  full = enc.encode(TEXTS)
  want = full[:, :6] / np.linalg.norm(full[:, :6], axis=1, keepdims=True)
  got = enc.encode(TEXTS, truncate_dim=6)
  assert got.shape == (5, 6) and got.dtype == np.float32
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1, atol=1e-6)
  loaded = SentenceEncoder.load(model_dir, truncate_dim=6)  # the model's default, as SentenceTransformer(truncate_dim=)
  assert loaded.dim == 6
  np.testing.assert_allclose(loaded.encode(TEXTS), want, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(loaded.encode(TEXTS, truncate_dim=16), full, atol=1e-6)  # the keyword overrides it
  with pytest.raises(ValueError, match="truncate_dim 17 is larger than the embedding size 16"):
    enc.encode(TEXTS, truncate_dim=17)
  # A model that does not normalise: the first dimensions as they are (sentence-transformers' truncation);
  # normalize_embeddings=True then normalises the truncated vectors.
  raw = SentenceEncoder(enc.config.replace(normalize=False), enc.params, tokenizer=enc.tokenizer)
  plain = raw.encode(TEXTS)
  np.testing.assert_array_equal(raw.encode(TEXTS, truncate_dim=6), plain[:, :6])
  np.testing.assert_allclose(raw.encode(TEXTS, truncate_dim=6, normalize_embeddings=True),
                             plain[:, :6] / np.linalg.norm(plain[:, :6], axis=1, keepdims=True), rtol=1e-6)


def test_precision_gives_the_quantize_codes(model_dir):
  enc = SentenceEncoder.load(model_dir)
  emb = enc.encode(TEXTS, truncate_dim=12)
  calibration = enc.encode(["a calibration sentence", "another one", "and a third"], truncate_dim=12)
  for precision in quantize.PRECISIONS:
    got = enc.encode(TEXTS, truncate_dim=12, precision=precision, calibration_embeddings=calibration)
    want = quantize.quantize_embeddings(emb, precision, calibration_embeddings=calibration)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want, err_msg=precision)
  ranges = quantize.quantization_ranges(calibration)
  np.testing.assert_array_equal(enc.encode(TEXTS[0], truncate_dim=12, precision="uint8", ranges=ranges),
                                quantize.quantize_embeddings(emb[:1], "uint8", ranges=ranges)[0])  # one string
  assert enc.encode(TEXTS, precision="ubinary").shape == (5, 2)
  with pytest.raises(ValueError, match="precision must be one of float32, int8, uint8, binary, ubinary"):
    enc.encode(TEXTS, precision="fp16")


def test_encode_command_with_prompt_truncate_dim_and_precision(model_dir, tmp_path, capsys):
  inp = tmp_path / "sentences.txt"
  inp.write_text("\n".join(TEXTS) + "\n")
  enc = SentenceEncoder.load(model_dir)
  calibration = enc.encode(["a calibration sentence", "another one", "and a third"], truncate_dim=8)
  np.save(tmp_path / "calib.npy", calibration)
  np.save(tmp_path / "ranges.npy", quantize.quantization_ranges(calibration))
  out = tmp_path / "q.npy"
  for extra in (["--calibration_embeddings", str(tmp_path / "calib.npy")], ["--ranges", str(tmp_path / "ranges.npy")]):
    assert cli.main(["encode", "--model", str(model_dir), "--input", str(inp), "--output", str(out), "--no_progress",
                     "--prompt_name", "query", "--truncate_dim", "8", "--precision", "int8", *extra]) == 0
    np.testing.assert_array_equal(np.load(out), enc.encode_query(TEXTS, truncate_dim=8, precision="int8",
                                                                 calibration_embeddings=calibration))
  assert cli.main(["encode", "--model", str(model_dir), "--input", str(inp), "--output", str(out), "--no_progress",
                   "--prompt", "q: ", "--precision", "ubinary"]) == 0
  np.testing.assert_array_equal(np.load(out), enc.encode(TEXTS, prompt="q: ", precision="ubinary"))
  assert "uint8 (5, 2)" in capsys.readouterr().err
  rc = cli.main(["encode", "--model", str(model_dir), "--input", str(inp), "--output", str(out),
                 "--prompt_name", "doc"])
  err = capsys.readouterr().err.strip()
  assert rc == 2 and "prompt_name 'doc' is not one of the model's prompts ('classify', 'document', 'query')" in err
  assert len(err.splitlines()) == 1
  rc = cli.main(["encode", "--model", str(model_dir), "--input", str(inp), "--output", str(out),
                 "--ranges", str(tmp_path / "ranges.npy")])
  assert rc == 2 and "--precision is float32" in capsys.readouterr().err


def test_eval_retrieval_sides_use_the_query_and_document_prompts(model_dir):
  enc = SentenceEncoder.load(model_dir)
  args = argparse.Namespace(query_max_length=None, document_max_length=12, batch_size=8)
  sides = eval_command.side_encoders(enc, args)
  np.testing.assert_allclose(sides["encode_query"](TEXTS), enc.encode_query(TEXTS), atol=1e-6)
  np.testing.assert_allclose(sides["encode_document"](TEXTS), enc.with_max_length(12).encode_document(TEXTS),
                             atol=1e-6)
  plain = SentenceEncoder(enc.config.replace(prompts={}, default_prompt_name=None), enc.params,
                          tokenizer=enc.tokenizer)
  assert set(eval_command.side_encoders(plain, args)) == {"encode_document"}  # as before prompts
