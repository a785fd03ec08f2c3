"""st5_jax.quantize: codes equal sentence-transformers' quantize_embeddings; exact search over quantized codes
(Hamming, int8 dot product, float rescoring) equals a NumPy brute force; `st5 index / st5 search --precision`."""

import json

import flax.linen as nn
import jax
import numpy as np
import pytest

from st5_jax import SentenceEncoder, cli, configs, quantize
from st5_jax.checkpoints import native
from st5_jax.model import init_params
from st5_jax.retrieval import index as index_lib
from st5_jax.retrieval import runs
from st5_jax.retrieval.search import search_index


def test_codes_equal_sentence_transformers_quantize_embeddings():
  from sentence_transformers.util.quantization import quantize_embeddings as st_quantize

  rng = np.random.default_rng(0)
  emb = rng.normal(size=(40, 13)).astype(np.float32)  # 13 dims: the last packed byte is padded
  emb[:, 3] = 0.25  # a constant dimension: step 1, not a division by zero
  emb[::2, 5] = 0.0  # exactly zero: a 0 bit (x > 0)
  calibration = rng.normal(scale=0.8, size=(25, 13)).astype(np.float32)
  ranges = np.stack([calibration.min(0) - 0.1, calibration.max(0)]).astype(np.float32)
  for precision in quantize.PRECISIONS:
    for kw in ({}, {"calibration_embeddings": calibration}, {"ranges": ranges}):
      want = st_quantize(emb, precision=precision, **kw)
      got = quantize.quantize_embeddings(emb, precision, **kw)
      assert got.dtype == want.dtype and got.shape == want.shape, (precision, kw)
      np.testing.assert_array_equal(got, want, err_msg=f"{precision} {list(kw)}")
    np.testing.assert_array_equal(quantize.quantize_embeddings(emb[0], precision, ranges=ranges),
                                  st_quantize(emb[0], precision=precision, ranges=ranges))  # one 1-D vector
  # Values outside the ranges clip to 0 / 255; the binary ones pack big-endian and undo exactly.
  assert quantize.quantize_embeddings(emb * 100, "uint8", ranges=ranges).max() == 255
  bits = quantize.unpack(quantize.quantize_embeddings(emb, "binary"), "binary", 13)
  np.testing.assert_array_equal(bits, (emb > 0).astype(np.uint8))
  starts, steps = ranges[0], (ranges[1] - ranges[0]) / 255
  np.testing.assert_allclose(quantize.dequantize(quantize.quantize_embeddings(emb, "int8", ranges=ranges), "int8",
                                                 ranges), np.clip(emb, ranges[0], ranges[1]), atol=steps.max())
  zero_code = quantize.dequantize(np.zeros((1, 13), np.int8), "int8", ranges)[0, 0]
  assert zero_code == pytest.approx(starts[0] + 128 * steps[0])


def test_bad_quantization_input_is_a_clear_error():
  emb = np.ones((3, 8), np.float32)
  with pytest.raises(ValueError, match="precision must be one of float32, int8, uint8, binary, ubinary, got 'int4'"):
    quantize.quantize_embeddings(emb, "int4")
  with pytest.raises(ValueError, match="one embedding need `ranges` or `calibration_embeddings`"):
    quantize.quantize_embeddings(emb[:1], "int8")
  with pytest.raises(ValueError, match=r"ranges must have shape \(2, 8\)"):
    quantize.quantize_embeddings(emb, "uint8", ranges=np.ones((2, 7), np.float32))
  with pytest.raises(TypeError, match="must be float"):
    quantize.quantize_embeddings(emb.astype(np.int8), "binary")
  with pytest.raises(ValueError, match="needs the ranges"):
    quantize.search(emb, quantize.quantize_embeddings(emb, "int8"), 1, precision="int8")


def _reference_search(queries, codes, k, precision, dim, ranges, multiplier):
  """The plainest NumPy: every score, a stable argsort (ties to the lower index), rescoring by definition."""
  q_codes = quantize.quantize_embeddings(queries, precision, ranges=ranges)
  if precision in quantize.BINARY:
    q_bits = quantize.packed_bits(q_codes, precision)
    d_bits = quantize.packed_bits(codes, precision)
    coarse = -np.unpackbits(q_bits[:, None, :] ^ d_bits[None, :, :], axis=-1).sum(-1).astype(np.int64)  # popcount
  else:
    coarse = q_codes.astype(np.int64) @ codes.astype(np.int64).T
  first = min(k * multiplier if multiplier else k, len(codes))
  cand = np.argsort(-coarse, axis=1, kind="stable")[:, :first]
  if not multiplier:
    return np.take_along_axis(coarse, cand, axis=1).astype(np.float32), cand
  scores, indices = [], []
  for qi, row in enumerate(cand):
    if precision in quantize.BINARY:
      values = np.unpackbits(quantize.packed_bits(codes[row], precision), axis=-1)[:, :dim].astype(np.float64)
    else:
      steps = (ranges[1].astype(np.float32) - ranges[0]) / 255
      steps = np.where(steps == 0, 1, steps)
      values = (codes[row].astype(np.float64) + (128 if precision == "int8" else 0)) * steps + ranges[0]
    rescored = values @ queries[qi].astype(np.float64)
    order = sorted(range(len(row)), key=lambda j: (-rescored[j], row[j]))[:min(k, len(codes))]
    scores.append(rescored[order])
    indices.append(row[order])
  return np.asarray(scores, np.float32), np.asarray(indices)


@pytest.mark.parametrize("precision", ["binary", "ubinary", "int8", "uint8"])
def test_search_over_codes_equals_numpy_brute_force(precision):
  rng = np.random.default_rng(1)
  dim = 20
  docs = rng.normal(size=(300, dim)).astype(np.float32)
  docs[150:] = np.round(docs[150:])  # repeated rows: ties in the first pass and in the rescoring
  docs[200:230] = docs[170:200]
  # Queries in multiples of 1/64 and int8 / uint8 steps of 1/64: every rescored score is exact, so a tie is a
  # tie in both implementations.
  queries = np.round(rng.normal(size=(9, dim)) * 64).astype(np.float32) / 64
  ranges = np.array([[-2] * dim, [-2 + 255 / 64] * dim], np.float32) if precision in quantize.SCALAR else None
  codes = quantize.quantize_embeddings(docs, precision, ranges=ranges)
  for k, multiplier, block in ((10, 0, 64), (10, 1, 300), (10, 4, 64), (7, 3, 17), (500, 2, 128)):
    got_s, got_i = quantize.search(queries, codes, k, precision=precision, dim=dim, ranges=ranges,
                                   rescore_multiplier=multiplier, block_size=block, query_block_size=4)
    if multiplier:  # rescored a few queries at a time: the same
      chunked = quantize.rescore(queries, codes, got_i, precision, dim, ranges, max_bytes=1)
      np.testing.assert_array_equal(chunked, quantize.rescore(queries, codes, got_i, precision, dim, ranges))
    want_s, want_i = _reference_search(queries, codes, k, precision, dim, ranges, multiplier)
    assert got_i.dtype == np.int64 and got_i.shape == (9, min(k, 300))
    np.testing.assert_array_equal(got_i, want_i, err_msg=f"k={k} m={multiplier} block={block}")
    np.testing.assert_allclose(got_s, want_s, rtol=1e-6, atol=1e-6)
  # Rescoring moves the ranking toward the float32 one: more of the exact top 10 than the codes alone find.
  exact = np.argsort(-(queries @ docs.T), axis=1, kind="stable")[:, :10]
  overlap = lambda found: np.mean([len(set(a) & set(b)) for a, b in zip(found, exact)])  # noqa: E731
  coarse = quantize.search(queries, codes, 10, precision=precision, ranges=ranges, rescore_multiplier=0)[1]
  rescored = quantize.search(queries, codes, 10, precision=precision, ranges=ranges, rescore_multiplier=10)[1]
  assert overlap(rescored) >= overlap(coarse)


def _model(directory, vocab_path, **config):
  cfg = configs.ST5Config(t5=configs.t5_size("t5_tiny"), pooling="enc_mean", embedding_dim=16, max_length=32,
                          **config)
  params = jax.device_get(nn.unbox(init_params(cfg, jax.random.PRNGKey(0))))
  native.save_model(directory, cfg, params, step=1, vocab_file=vocab_path)
  return str(directory)


def test_index_and_search_with_precision_and_prompts(tmp_path, vocab_path, capsys):
  # A model with query / document prompts and a truncate_dim: the index holds encode_document's 12-dim
  # embeddings, the queries get encode_query's; --precision binary writes the packed bits, and
  # `st5 search --precision binary` is the brute force over them, rescored with the float queries.
  model = _model(tmp_path / "model", vocab_path, prompts={"query": "query: ", "document": "passage: "},
                 truncate_dim=12)
  words = "cat dog river bank money music city night road tree light sound".split()
  rng = np.random.default_rng(0)
  texts = [f"{i} {' '.join(rng.choice(words, size=1 + i % 7))}" for i in range(60)]
  (tmp_path / "corpus.tsv").write_text("".join(f"p{i}\t{t}\n" for i, t in enumerate(texts)))
  queries = ["a cat on the river bank", "money in the bank", "music of the city at night", "dog"]
  (tmp_path / "queries.tsv").write_text("".join(f"q{i}\t{q}\n" for i, q in enumerate(queries)))
  out = tmp_path / "idx"
  assert cli.main(["index", "--model", model, "--corpus", str(tmp_path / "corpus.tsv"), "--out", str(out),
                   "--shard_size", "25", "--precision", "binary"]) == 0
  index = index_lib.Index.open(str(out))
  enc = SentenceEncoder.load(model)
  assert index.dim == 12
  np.testing.assert_allclose(index.embeddings(), enc.encode_document(texts), atol=1e-5)
  assert not np.allclose(index.embeddings(), enc.encode(texts), atol=1e-3)  # the prompt changed them
  codes, ranges = index.load_quantized("binary")
  assert ranges is None and codes.dtype == np.int8 and codes.shape == (60, 2)
  np.testing.assert_array_equal(codes, quantize.quantize_embeddings(index.embeddings(), "binary"))
  assert index.quantized_info["precision"] == "binary" and (out / "quantized.npy").is_file()

  assert cli.main(["search", "--index", str(out), "--queries", str(tmp_path / "queries.tsv"), "--k", "5",
                   "--out", str(tmp_path / "run.trec"), "--precision", "binary", "--rescore_multiplier", "3"]) == 0
  assert "(exact binary, rescored top 3k)" in capsys.readouterr().err
  run = runs.read_trec(str(tmp_path / "run.trec"))
  q = enc.encode_query(queries)
  want_s, want_i = _reference_search(q, codes, 5, "binary", 12, None, 3)
  for qi in range(len(queries)):  # a run is {doc: score}; the ranking is by score
    assert set(run[f"q{qi}"]) == {f"p{j}" for j in want_i[qi]}
    np.testing.assert_allclose([run[f"q{qi}"][f"p{j}"] for j in want_i[qi]], want_s[qi], atol=1e-5)

  # Rebuilt as int8 (the finished shards kept): the codes use the corpus's own ranges; the API search is the
  # brute force; a binary search of it is refused in one line naming the fix.
  assert cli.main(["index", "--model", model, "--corpus", str(tmp_path / "corpus.tsv"), "--out", str(out),
                   "--shard_size", "25", "--precision", "int8"]) == 0
  assert "finished by an earlier run, skipped" in capsys.readouterr().err
  index = index_lib.Index.open(str(out))
  codes, ranges = index.load_quantized("int8")
  emb = index.embeddings()
  np.testing.assert_array_equal(ranges, np.stack([emb.min(0), emb.max(0)]))
  np.testing.assert_array_equal(codes, quantize.quantize_embeddings(emb, "int8", calibration_embeddings=emb))
  got = search_index(index, q, 5, precision="int8", rescore_multiplier=2)
  want = _reference_search(q, codes, 5, "int8", 12, ranges, 2)
  np.testing.assert_array_equal(got[1], want[1])
  np.testing.assert_allclose(got[0], want[0], atol=1e-5)
  rc = cli.main(["search", "--index", str(out), "--queries", str(tmp_path / "queries.tsv"), "--out",
                 str(tmp_path / "x.trec"), "--precision", "binary"])
  err = capsys.readouterr().err.strip()
  assert rc == 2 and "holds int8 codes, not binary" in err and "--precision binary" in err
  assert len(err.splitlines()) == 1
  rc = cli.main(["search", "--index", str(out), "--queries", str(tmp_path / "queries.tsv"), "--out",
                 str(tmp_path / "x.trec"), "--rescore_multiplier", "2"])
  assert rc == 2 and "add --precision" in capsys.readouterr().err
  # Back to float32: the quantized copy is gone from the folder and the manifest.
  assert cli.main(["index", "--model", model, "--corpus", str(tmp_path / "corpus.tsv"), "--out", str(out),
                   "--shard_size", "25"]) == 0
  assert not (out / "quantized.npy").exists() and not (out / "quantized_ranges.npy").exists()
  assert "quantized" not in json.loads((out / "manifest.json").read_text())
  capsys.readouterr()
