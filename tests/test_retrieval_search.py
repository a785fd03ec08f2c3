"""Search: exact top-k against NumPy, over index shards, ANN recall and reload, `st5 search` run files."""

import json
import shutil
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest

from st5_jax import SentenceEncoder, cli, configs
from st5_jax.checkpoints import native
from st5_jax.commands import index as index_command
from st5_jax.model import init_params
from st5_jax.retrieval import ann, runs
from st5_jax.retrieval import index as index_lib
from st5_jax.retrieval.search import exact_search, search_index

# The ANN corpus: 2 * 10^4 unit vectors of dim 64 around 200 random unit centres (Gaussian noise of norm ~1,
# then normalised), 1,000 queries drawn the same way. Measured Recall@100 against exact search (see ann.py):
# IVF at its defaults (nlist 512, nprobe 32) 0.985; HNSW M=16, efConstruction=64, efSearch=128 on the first
# 5,000 documents 0.969. The bounds sit a little below.
IVF_RECALL_BOUND = 0.97
HNSW_RECALL_BOUND = 0.95


def _reference_topk(scores_QxN: np.ndarray, k: int) -> np.ndarray:
  """Indices of the k largest scores per row, ties by lower index: a stable argsort of the negated scores."""
  return np.argsort(-scores_QxN, axis=1, kind="stable")[:, :k]


def test_exact_search_equals_numpy_with_deterministic_ties():
  rng = np.random.default_rng(0)
  # Small integers: every dot product is exact in float32, and ties are everywhere.
  docs = rng.integers(-2, 3, size=(1000, 16)).astype(np.float32)
  queries = rng.integers(-2, 3, size=(37, 16)).astype(np.float32)
  scores = queries @ docs.T
  assert (np.sort(scores, axis=1)[:, 1:] == np.sort(scores, axis=1)[:, :-1]).any(axis=1).all()  # ties
  for k, block, query_block, devices in [(10, 128, 16, None), (100, 1000, 37, 1), (7, 1, 5, None),
                                         (1000, 65536, 1024, None), (5000, 300, 8, 2)]:
    got_s, got_i = exact_search(queries, docs, k, block_size=block, query_block_size=query_block,
                                devices=jax.local_devices()[:devices] if devices else None)
    want_i = _reference_topk(scores, min(k, 1000))
    assert got_i.dtype == np.int64 and got_s.dtype == np.float32 and got_i.shape == (37, min(k, 1000))
    np.testing.assert_array_equal(got_i, want_i, err_msg=f"k={k} block={block}")
    np.testing.assert_array_equal(got_s, np.take_along_axis(scores, want_i, axis=1))
  # approx_max_k (TPU's approximate top-k) is exact on CPU.
  np.testing.assert_array_equal(exact_search(queries, docs, 10, approx=True)[1], _reference_topk(scores, 10))
  with pytest.raises(ValueError, match="k must be >= 1"):
    exact_search(queries, docs, 0)


def test_exact_search_over_index_shards_equals_the_concatenated_matrix(tmp_path):
  rng = np.random.default_rng(1)
  docs = rng.normal(size=(2000, 32)).astype(np.float32)
  docs /= np.linalg.norm(docs, axis=1, keepdims=True)
  queries = docs[rng.integers(0, 2000, 50)] + 0.1 * rng.normal(size=(50, 32)).astype(np.float32)
  ids = [f"d{i}" for i in range(2000)]
  index = index_lib.from_embeddings(str(tmp_path / "idx"), ids, docs, shard_size=300, ann="none")
  assert len(index.manifest["shards"]) == 7 and index.ids == ids
  reopened = index_lib.Index.open(str(tmp_path / "idx"))
  for block in (512, 300, 4096):  # blocks across shard boundaries, on them, over the whole corpus
    got = exact_search(queries, reopened, 100, block_size=block)
    want = exact_search(queries, docs, 100, block_size=block)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])
  np.testing.assert_array_equal(want[1], _reference_topk(queries @ docs.T, 100))


def _clustered(n, dim=64, clusters=200, queries=1000, seed=0):
  rng = np.random.default_rng(seed)
  centres = rng.normal(size=(clusters, dim))
  centres /= np.linalg.norm(centres, axis=1, keepdims=True)

  def draw(m):
    x = centres[rng.integers(0, clusters, m)] + rng.normal(size=(m, dim)) / np.sqrt(dim)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)

  return draw(n), draw(queries)


def _recall(found_QxK, exact_QxK):
  return float(np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(found_QxK, exact_QxK)]))


@pytest.fixture(scope="module")
def ann_corpus():
  docs, queries = _clustered(20000)
  _, exact = exact_search(queries, docs, 100)
  return docs, queries, exact


def test_ivf_recall_at_100_and_reload(ann_corpus, tmp_path):
  docs, queries, exact = ann_corpus
  ids = [str(i) for i in range(len(docs))]
  index = index_lib.from_embeddings(str(tmp_path / "ivf"), ids, docs, shard_size=8192, ann="ivf")
  info = index.manifest["ann"]
  assert info["kind"] == "ivf" and info["params"] == {"nlist": 512, "nprobe": 32} and info["file"] == "ann.faiss"
  scores, found = search_index(index, queries, 100, method="ann")
  recall = _recall(found, exact)
  print(f"IVF nlist=512 nprobe=32 Recall@100 {recall:.4f}")
  assert recall > IVF_RECALL_BOUND
  assert _recall(search_index(index, queries, 100, method="ann", ann_params={"nprobe": 4})[1], exact) < recall
  # Saved with the embeddings; reloaded, it answers the same.
  reopened = index_lib.Index.open(str(tmp_path / "ivf"))
  again_s, again = ann.search(reopened.load_ann(), "ivf", info["params"], queries, 100)
  np.testing.assert_array_equal(again, found)
  np.testing.assert_array_equal(again_s, scores)
  np.testing.assert_allclose(scores, np.take_along_axis(queries @ docs.T, found, axis=1), atol=1e-5)


def test_hnsw_recall_and_flat_is_exact(ann_corpus, tmp_path):
  docs, queries, _ = ann_corpus
  docs = docs[:5000]
  exact_scores, exact = exact_search(queries, docs, 100)
  params = {"M": 16, "efConstruction": 64, "efSearch": 128}
  kind, resolved = ann.resolve("hnsw", len(docs), params)
  hnsw = ann.build(kind, resolved, dim=64, n=len(docs), blocks=lambda: [docs[:3000], docs[3000:]])
  recall = _recall(ann.search(hnsw, kind, resolved, queries, 100)[1], exact)
  print(f"HNSW M=16 efConstruction=64 efSearch=128 Recall@100 {recall:.4f}")
  assert recall > HNSW_RECALL_BOUND
  reloaded = ann.from_bytes(ann.to_bytes(hnsw))
  np.testing.assert_array_equal(ann.search(reloaded, kind, resolved, queries, 100)[1],
                                ann.search(hnsw, kind, resolved, queries, 100)[1])
  flat = ann.build("flat", {}, dim=64, n=len(docs), blocks=lambda: [docs])
  flat_scores, flat_found = ann.search(flat, "flat", {}, queries, 100)
  np.testing.assert_allclose(flat_scores, exact_scores, atol=1e-6)  # the same ranking, up to near-ties' order
  assert _recall(flat_found, exact) > 0.999


def test_ann_defaults_and_deterministic_ivf_bytes(tmp_path):
  assert ann.resolve("auto", 99_999) == ("none", {})
  assert index_command._ANN_CHOICES == ann.CHOICES  # pylint: disable=protected-access  (the flag's copy)
  assert ann.resolve("auto", 100_000) == ("ivf", {"nlist": 1024, "nprobe": 64})
  assert ann.resolve("ivf", 10**6)[1] == {"nlist": 4096, "nprobe": 256}
  assert ann.resolve("hnsw", 10, {"efSearch": 64, "M": None}) == ("hnsw", {"M": 32, "efConstruction": 200,
                                                                           "efSearch": 64})
  with pytest.raises(ValueError, match="nprobe is not a parameter of an hnsw index"):
    ann.resolve("hnsw", 10, {"nprobe": 3})
  with pytest.raises(ValueError, match="nlist=64 is more lists than the 50 documents"):
    ann.resolve("ivf", 50, {"nlist": 64})
  docs, _ = _clustered(2000, dim=16, clusters=20, queries=1, seed=3)
  ids = [f"x{i}" for i in range(2000)]
  a = index_lib.from_embeddings(str(tmp_path / "a"), ids, docs, shard_size=700, ann="ivf", ann_params={"nlist": 16})
  index_lib.from_embeddings(str(tmp_path / "b"), ids, docs, shard_size=700, ann="ivf", ann_params={"nlist": 16})
  assert a.manifest["ann"]["params"] == {"nlist": 16, "nprobe": 8}
  assert (tmp_path / "a" / "ann.faiss").read_bytes() == (tmp_path / "b" / "ann.faiss").read_bytes()
  # Asked again with another kind: the shards stay, the ANN index is replaced.
  c = index_lib.from_embeddings(str(tmp_path / "a"), ids, docs, shard_size=700, ann="flat")
  assert c.manifest["ann"]["kind"] == "flat" and c.manifest["shards"] == a.manifest["shards"]
  d = index_lib.from_embeddings(str(tmp_path / "a"), ids, docs, shard_size=700, ann="none")
  assert d.manifest["ann"] is None and not (tmp_path / "a" / "ann.faiss").exists()
  with pytest.raises(FileNotFoundError, match="has no ANN index"):
    d.load_ann()


# ------------------------------------------------------------------------------------------------ st5 search


def _model(directory, vocab_path, seed):
  cfg = configs.ST5Config(t5=configs.t5_size("t5_tiny"), pooling="enc_mean", embedding_dim=16, max_length=32)
  params = jax.device_get(nn.unbox(init_params(cfg, jax.random.PRNGKey(seed))))
  native.save_model(directory, cfg, params, step=1, vocab_file=vocab_path)
  return str(directory)


QUERIES = ["a cat on the river bank", "money in the bank", "music of the city at night", "dog"]


def test_st5_search_writes_a_trec_run_that_parses_back(tmp_path, vocab_path, capsys):
  model = _model(tmp_path / "model", vocab_path, seed=0)
  words = "cat dog river bank money music city night road tree light sound".split()
  rng = np.random.default_rng(0)
  with open(tmp_path / "corpus.tsv", "w") as f:
    for i in range(120):
      f.write(f"p{i}\t{i} {' '.join(rng.choice(words, size=1 + i % 9))}\n")  # unique texts: no tied scores
  out = tmp_path / "idx"
  index_lib.build_index(model, [str(tmp_path / "corpus.tsv")], str(out), shard_size=50, ann="flat")
  (tmp_path / "queries.tsv").write_text("".join(f"q{i}\t{q}\n" for i, q in enumerate(QUERIES)))

  rc = cli.main(["search", "--index", str(out), "--queries", str(tmp_path / "queries.tsv"), "--k", "10",
                 "--out", str(tmp_path / "run.trec"), "--jsonl", str(tmp_path / "run.jsonl"), "--tag", "mine",
                 "--query_max_length", "4"])
  err = capsys.readouterr().err
  assert rc == 0 and "4 queries x 120 documents, top 10 (exact)" in err
  run = runs.read_trec(str(tmp_path / "run.trec"))
  assert runs.read_jsonl(str(tmp_path / "run.jsonl")) == run
  assert all(line.split()[5] == "mine" for line in (tmp_path / "run.trec").read_text().splitlines())
  # The same as the sentence encoder's queries (truncated to 4 tokens) against the index's embeddings.
  index = index_lib.Index.open(str(out))
  q = SentenceEncoder.load(model, max_length=4).encode(QUERIES)
  want_s, want_i = exact_search(q, index.embeddings(), 10)
  assert list(run) == ["q0", "q1", "q2", "q3"]
  for qi, qid in enumerate(run):
    assert set(run[qid]) == {index.ids[j] for j in want_i[qi]}
    np.testing.assert_allclose([run[qid][index.ids[j]] for j in want_i[qi]], want_s[qi], atol=1e-5)
  full = SentenceEncoder.load(model).encode(QUERIES)
  assert not np.allclose(full, q, atol=1e-3)  # --query_max_length changed the long queries

  rc = cli.main(["search", "--index", str(out), "--queries", str(tmp_path / "queries.tsv"), "--k", "10",
                 "--out", str(tmp_path / "approx.trec"), "--approx", "--query_max_length", "4"])
  assert rc == 0 and "(approx)" in capsys.readouterr().err
  assert runs.read_trec(str(tmp_path / "approx.trec")) == run  # approx_max_k is exact on CPU

  rc = cli.main(["search", "--index", str(out), "--queries", str(tmp_path / "queries.tsv"), "--k", "10",
                 "--out", str(tmp_path / "ann.trec"), "--ann"])
  assert rc == 0 and "(ann flat)" in capsys.readouterr().err
  ann_run = runs.read_trec(str(tmp_path / "ann.trec"))
  assert {k: set(v) for k, v in ann_run.items()} == {
      f"q{i}": {index.ids[j] for j in row} for i, row in enumerate(exact_search(full, index.embeddings(), 10)[1])}

  # The model folder changed since the index was built: refused, unless --model says which one.
  shutil.rmtree(model)
  _model(tmp_path / "model", vocab_path, seed=1)
  rc = cli.main(["search", "--index", str(out), "--queries", str(tmp_path / "queries.tsv"), "--out",
                 str(tmp_path / "x.trec")])
  err = capsys.readouterr().err.strip()
  assert rc == 2 and "is not the one" in err and "its parameters changed" in err and len(err.splitlines()) == 1
  rc = cli.main(["search", "--index", str(out), "--queries", str(tmp_path / "queries.tsv"), "--out",
                 str(tmp_path / "x.trec"), "--nprobe", "3"])
  assert rc == 2 and "add --ann" in capsys.readouterr().err
  manifest = json.loads((out / "manifest.json").read_text())
  assert manifest["corpus"]["files"][0]["format"] == "tsv" and manifest["ann"]["kind"] == "flat"


def test_help_imports_neither_jax_nor_faiss():
  code = ("import sys; from st5_jax import cli; cli.build_parser(); "
          "print(sorted(m for m in ('jax', 'faiss', 'numpy', 'st5_jax.retrieval.index') if m in sys.modules))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
  assert out.stdout.strip() == "[]"


@pytest.fixture(scope="module")
def trecqa_index(tmp_path_factory, vocab_path, data_dir):
  """(model, index folder) of `st5 index --corpus TREC-QA` (1393 documents, 3 shards of <= 500)."""
  tmp_path = tmp_path_factory.mktemp("trecqa")
  model = _model(tmp_path / "model", vocab_path, seed=0)
  out = tmp_path / "idx"
  assert cli.main(["index", "--model", model, "--corpus", "TREC-QA", "--out", str(out), "--shard_size", "500",
                   "--data_dir", str(data_dir)]) == 0
  return model, out


def test_index_and_search_a_retrieval_task_score_as_st5_eval(trecqa_index, tmp_path, data_dir, capsys):
  # `--corpus TREC-QA` / `--queries TREC-QA`: the evaluation set's corpus and queries, scored against its qrels,
  # the same figures as the harness with the same model (MRR@10 within float noise of near ties).
  from st5_jax.evaluation import harness  # pylint: disable=g-import-not-at-top

  model, out = trecqa_index
  assert (out / "task_TREC-QA_corpus.jsonl").read_text().count("\n") == 1393
  metrics_file = tmp_path / "m.json"
  assert cli.main(["search", "--index", str(out), "--queries", "TREC-QA", "--out", str(tmp_path / "run.trec"),
                   "--data_dir", str(data_dir), "--metrics", str(metrics_file)]) == 0
  assert "MRR@10" in capsys.readouterr().err
  got = json.loads(metrics_file.read_text())
  enc = SentenceEncoder.load(model)
  want = harness.evaluate(lambda t: enc.encode(t), ["TREC-QA"], data_dir)["tasks"]["TREC-QA"]
  assert got["n_queries"] == want["n_queries"] == 89
  for m in ("MRR@10", "nDCG@10", "Recall@100"):
    assert got[m] == pytest.approx(want[m], abs=2e-3), m
  rc = cli.main(["search", "--index", str(out), "--queries", str(out / "task_TREC-QA_corpus.jsonl"), "--out",
                 str(tmp_path / "x.trec"), "--metrics", str(metrics_file)])
  assert rc == 2 and "--metrics needs --queries TASK" in capsys.readouterr().err


def _files(folder):
  """name -> (bytes, mtime in ns) of every file in the folder."""
  return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


def test_a_task_index_is_one_set_alone_and_another_set_leaves_it_untouched(trecqa_index, tmp_path, data_dir, capsys):
  model, out = trecqa_index
  before = _files(out)
  assert "task_TREC-QA_corpus.jsonl" in before and "manifest.json" in before
  # Another set into the TREC-QA index: refused before anything is written (no WikiQA file, nothing rewritten).
  rc = cli.main(["index", "--model", model, "--corpus", "WikiQA", "--out", str(out), "--shard_size", "500",
                 "--data_dir", str(data_dir)])
  err = capsys.readouterr().err.strip()
  assert rc == 2 and len(err.splitlines()) == 1, err
  assert "holds an index of another corpus" in err and "task_TREC-QA_corpus.jsonl" in err, err
  assert "WikiQA's corpus" in err and "Pass another --out" in err, err
  assert _files(out) == before
  # Two sets, or a set and a file, in one index: refused up front (TREC-QA's and SemEval2016-B's ids collide).
  (tmp_path / "extra.tsv").write_text("x1\tan extra document\n")
  for corpus in (["WikiQA,TREC-QA"], ["trecqa", str(tmp_path / "extra.tsv")]):
    argv = ["index", "--model", model, "--out", str(tmp_path / "two"), "--data_dir", str(data_dir)]
    rc = cli.main(argv + [a for c in corpus for a in ("--corpus", c)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "a retrieval set's corpus is indexed alone" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "two").exists()
  # The same set again (by its alias): every shard kept, the same bytes, the corpus file not even rewritten.
  rc = cli.main(["index", "--model", model, "--corpus", "trecqa", "--out", str(out), "--shard_size", "500",
                 "--data_dir", str(data_dir)])
  assert rc == 0 and "skipped 3 finished shards" in capsys.readouterr().err
  after = _files(out)
  assert {k: v[0] for k, v in after.items()} == {k: v[0] for k, v in before.items()}
  assert after["task_TREC-QA_corpus.jsonl"] == before["task_TREC-QA_corpus.jsonl"]


def test_search_with_a_task_refuses_an_index_of_another_corpus(trecqa_index, tmp_path, data_dir, capsys):
  # WikiQA's queries against the TREC-QA index: its qrels name documents the index lacks (measures near zero).
  model, out = trecqa_index
  rc = cli.main(["search", "--index", str(out), "--queries", "WikiQA", "--out", str(tmp_path / "run.trec"),
                 "--data_dir", str(data_dir), "--metrics", str(tmp_path / "m.json")])
  err = capsys.readouterr().err.strip()
  assert rc == 2 and len(err.splitlines()) == 1, err
  assert f"{out} holds another corpus than WikiQA's" in err and "task_TREC-QA_corpus.jsonl: 1393 documents" in err
  assert f"`st5 index --model {model} --corpus WikiQA --out {out}_WikiQA --data_dir {data_dir}`" in err, err
  assert not (tmp_path / "run.trec").exists() and not (tmp_path / "m.json").exists()


def _beir_folder(folder, texts):
  """A BEIR folder: documents doc0.. with titles, two queries judged against doc0 and doc3."""
  (folder / "qrels").mkdir(parents=True)
  (folder / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"doc{i}", "title": f"t{i}", "text": t}) + "\n"
                                               for i, t in enumerate(texts)))
  (folder / "queries.jsonl").write_text('{"_id": "q0", "text": "a cat by the river"}\n'
                                        '{"_id": "q1", "text": "money in the bank"}\n')
  (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq0\tdoc0\t1\nq1\tdoc3\t1\n")
  return str(folder)


def test_search_with_a_beir_set_accepts_its_folder_indexed_by_path(tmp_path, vocab_path, capsys):
  # A BEIR folder indexed by its path holds the set's documents in another file than `--corpus beir:F` writes:
  # accepted (the same measures), unless the documents differ or the file changed after indexing.
  model = _model(tmp_path / "model", vocab_path, seed=1)
  texts = ["the cat sat by the river", "a dog in the city", "night music", "money kept in a bank", "a tree"]
  folder = _beir_folder(tmp_path / "beir", texts)
  measures = []
  for name, corpus in (("by_path", folder), ("by_set", f"beir:{folder}")):
    assert cli.main(["index", "--model", model, "--corpus", corpus, "--out", str(tmp_path / name),
                     "--shard_size", "2"]) == 0
    rc = cli.main(["search", "--index", str(tmp_path / name), "--queries", f"beir:{folder}", "--k", "3", "--out",
                   str(tmp_path / f"{name}.trec"), "--metrics", str(tmp_path / f"{name}.json")])
    assert rc == 0, capsys.readouterr().err
    measures.append(json.loads((tmp_path / f"{name}.json").read_text()))
  assert measures[0]["n_queries"] == 2 and measures[0] == measures[1]
  # `--corpus beir:F`'s index moved elsewhere (its manifest names the old file): known by its corpus fingerprint.
  shutil.move(tmp_path / "by_set", tmp_path / "moved")
  rc = cli.main(["search", "--index", str(tmp_path / "moved"), "--queries", f"beir:{folder}", "--out",
                 str(tmp_path / "moved.trec")])
  assert rc == 0, capsys.readouterr().err
  # Another folder: the same ids and count, one text differs.
  other = _beir_folder(tmp_path / "other", texts[:4] + ["a bush"])
  rc = cli.main(["search", "--index", str(tmp_path / "by_path"), "--queries", f"beir:{other}", "--out",
                 str(tmp_path / "x.trec")])
  err = capsys.readouterr().err.strip()
  assert rc == 2 and f"holds another corpus than beir:{other}'s" in err and "--corpus beir:" in err, err
  # The indexed file edited afterwards (the set now reads the new text): the index holds the old one.
  (tmp_path / "beir" / "corpus.jsonl").write_text((tmp_path / "other" / "corpus.jsonl").read_text())
  rc = cli.main(["search", "--index", str(tmp_path / "by_path"), "--queries", f"beir:{folder}", "--out",
                 str(tmp_path / "x.trec")])
  err = capsys.readouterr().err.strip()
  assert rc == 2 and f"holds another corpus than beir:{folder}'s" in err, err
