"""`st5 data mine`: BM25 against a NumPy Lucene BM25, each false-negative filter, the output and its counts,
two processes writing the one-process bytes, resuming, dense mining against the model's own embeddings."""

import json
import os
import random
import socket
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest

from xla_env import xla_flags
from st5_jax import SentenceEncoder, cli, configs
from st5_jax.checkpoints import native
from st5_jax.data import registry
from st5_jax.data.offline import mine as mine_lib
from st5_jax.model import init_params
from st5_jax.retrieval import bm25

WORDS = "sky blue sea green tree river stone bird song night light city road music paper water".split()


def _texts(n, seed, lo=2, hi=7):
  rng = random.Random(seed)
  return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi))) for _ in range(n)]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  """pairs.jsonl (16 queries: a duplicate query, a string pos, a bad row), corpus.jsonl (60 documents, ties)."""
  root = tmp_path_factory.mktemp("mine")
  docs = _texts(56, 0) + ["sky blue", "sky blue", "Sky, BLUE!", "river stone"]  # equal documents: score ties
  (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n"
                                             for i, t in enumerate(docs)))
  queries = _texts(15, 1, 2, 3)
  positives = [f"{q} {extra}" for q, extra in zip(queries, _texts(15, 2, 1, 4))]  # a positive shares the words
  lines = [json.dumps({"query": q, "pos": [p]}) for q, p in zip(queries, positives)]
  lines[3] = json.dumps({"query": queries[3], "pos": positives[3]})  # a single string: FlagEmbedding's input allows it
  lines[4] = json.dumps({"query": queries[4], "pos": [positives[4]], "neg": "old"})  # an existing neg is not read
  lines.insert(5, json.dumps({"query": "sky blue", "neg": ["x"]}))  # no pos: a bad row
  lines.append(json.dumps({"query": queries[0], "pos": ["sky blue", positives[0]]}))  # the same query again
  lines.append(json.dumps({"query": "sky blue river", "pos": ["sky blue"]}))
  (root / "pairs.jsonl").write_text("\n".join(lines) + "\n")
  return root


def _numpy_bm25(docs, query, k1, b, *, other=None):
  """Lucene's BM25 written out (the formula in st5_jax/retrieval/bm25.py): float64 [N] over `docs`, or the score
  of the text `other` with the statistics (N, df, average length) of `docs`."""
  tokens = [bm25.tokenize(d) for d in docs]
  n, avgdl = len(tokens), np.mean([len(t) for t in tokens])
  df = {}
  for t in tokens:
    for w in set(t):
      df[w] = df.get(w, 0) + 1
  scored = tokens if other is None else [bm25.tokenize(other)]
  lengths = np.array([len(t) for t in scored])
  s = np.zeros(len(scored))
  for w in bm25.tokenize(query):
    if w in df:
      tf = np.array([t.count(w) for t in scored])
      s += np.log(1 + (n - df[w] + 0.5) / (df[w] + 0.5)) * tf / (tf + k1 * (1 - b + b * lengths / avgdl))
  return s if other is None else float(s[0])


def test_bm25_candidates_and_positive_scores_equal_a_numpy_lucene_bm25(files):
  corpus = mine_lib.files_corpus(str(files / "corpus.jsonl"))
  scorer = mine_lib.Bm25Scorer(corpus, k1=0.9, b=0.4)
  queries = _texts(12, 5, 1, 4) + ["sky blue", "nothing matches"]
  outside = "blue river blue sky unknownword"  # a positive that is not a document: scored with the corpus statistics
  found = scorer.shard(queries, [[corpus.texts[3], outside]] * len(queries), depth=9)
  for query, (top_R, scores_R, pos_P) in zip(queries, found):
    s = _numpy_bm25(corpus.texts, query, 0.9, 0.4)
    matched = np.flatnonzero(s > 0)
    want = matched[np.lexsort((matched, -s[matched]))][:9]  # score descending, ties: the lower index first
    np.testing.assert_array_equal(top_R, want, err_msg=query)
    np.testing.assert_allclose(scores_R, s[want], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(pos_P, [s[3], _numpy_bm25(corpus.texts, query, 0.9, 0.4, other=outside)],
                               rtol=1e-5, atol=1e-6)
  assert len(found[-1][0]) == 0  # no shared term: nothing retrieved, as Lucene returns
  assert len(found[-2][0]) == 9 and list(found[-2][0][:3]) == [56, 57, 58]  # "sky blue" x2 and "Sky, BLUE!": a tie
  assert found[-2][2][1] > 0  # the outside positive shares "sky blue"
  # The partial top-k equals sorting everything, with heavy ties.
  rng = np.random.default_rng(0)
  for _ in range(20):
    s = rng.integers(0, 4, 200).astype(np.float32)
    k = int(rng.integers(1, 60))
    matched = np.flatnonzero(s > 0)
    np.testing.assert_array_equal(mine_lib.top_matches(s, k), matched[np.lexsort((matched, -s[matched]))][:k])


# Ranked candidates of one query, best first: its positive, the positive's spelling variant, then the rest.
TEXTS = ["the positive", "The Positive!", "c2", "c3", "c4", "c5", "c6", "c7"]
SCORES = np.array([1.2, 1.1, 0.99, 0.95, 0.8, 0.6, 0.5, 0.4], np.float32)


def _select(positive_scores=(1.0,), positives=("the positive",), **kw):
  config = mine_lib.MineConfig(**{"num_negatives": 7, **kw})
  kept, dropped = mine_lib.select_negatives(np.arange(8), SCORES, positives=list(positives),
                                            positive_scores_P=np.asarray(positive_scores, np.float32),
                                            corpus_texts=TEXTS, config=config, query_index=4)
  return kept, dict(dropped)


def test_each_false_negative_filter_at_a_non_default_setting():
  # Defaults: the positive and its normalised twin go; every other candidate survives.
  assert _select() == ([2, 3, 4, 5, 6, 7], {"positive": 1, "equal_to_positive": 1})
  # range_min: the first ranks go, counted under range_min (first reason wins), nothing else changes.
  assert _select(range_min=3) == ([3, 4, 5, 6, 7], {"range_min": 3})
  # keep_equal_to_positive: the twin comes back; the positive itself never does.
  assert _select(keep_equal_to_positive=True) == ([1, 2, 3, 4, 5, 6, 7], {"positive": 1})
  # margin 0.1: scores above 1.0 - 0.1 go (0.99, 0.95), not 0.8.
  assert _select(margin=0.1) == ([4, 5, 6, 7], {"positive": 1, "equal_to_positive": 1, "margin": 2})
  # relative_margin 0.3: above 1.0 - 0.3 goes (0.99, 0.95, 0.8).
  assert _select(relative_margin=0.3) == ([5, 6, 7], {"positive": 1, "equal_to_positive": 1, "relative_margin": 3})
  # The lowest positive score is the reference: with positives at 1.0 and 0.55, margin 0 drops all above 0.55.
  assert _select(positive_scores=(1.0, 0.55), positives=("the positive", "c7"), margin=0.0) == (
      [6], {"positive": 2, "equal_to_positive": 1, "margin": 4})
  # A negative positive score (dense cosine): p - |p| * r stays below p; p * (1 - r) would not.
  neg = np.array([1.2, 1.1, -0.2, -0.5, -1.2, -1.6, -2.0, -2.5], np.float32)
  config = mine_lib.MineConfig(num_negatives=6, relative_margin=0.5)
  kept, _ = mine_lib.select_negatives(np.arange(8), neg, positives=["the positive"],
                                      positive_scores_P=np.asarray([-1.0], np.float32), corpus_texts=TEXTS,
                                      config=config, query_index=0)
  assert kept == [5, 6, 7]  # above -1.5 dropped
  # num_negatives and sampling: top keeps the best survivors; random a seeded draw of them, in rank order.
  assert _select(num_negatives=2) == ([2, 3], {"positive": 1, "equal_to_positive": 1})
  drawn = {tuple(_select(num_negatives=3, sampling="random", seed=s)[0]) for s in range(8)}
  assert all(len(d) == 3 and list(d) == sorted(d) and set(d) <= {2, 3, 4, 5, 6, 7} for d in drawn)
  assert len(drawn) > 1 and _select(num_negatives=3, sampling="random", seed=1) == _select(
      num_negatives=3, sampling="random", seed=1)


def _mine_argv(files, out, *extra):
  return ["data", "mine", "--pairs", str(files / "pairs.jsonl"), "--corpus", str(files / "corpus.jsonl"),
          "--out", str(out), "--k1", "0.9", "--b", "0.4", "--range_min", "1", "--range_max", "8",
          "--num_negatives", "3", "--margin", "0.2", "--shard_size", "5", "--with_ids", "--with_scores", *extra]


def _read_dir(out):
  return {name: (out / name).read_bytes() for name in sorted(os.listdir(out))}


@pytest.fixture(scope="module")
def mined(files, tmp_path_factory):
  """The one-process CLI run the others are compared with."""
  out = tmp_path_factory.mktemp("mined") / "out"
  assert cli.main(_mine_argv(files, out)) == 0
  return out


def test_the_json_lines_and_the_manifest_counts(files, mined):
  manifest = json.loads((mined / "manifest.json").read_text())
  rows = [json.loads(line) for p in sorted(mined.glob("part-*.jsonl")) for line in p.read_text().splitlines()]
  assert sorted(os.listdir(mined)) == ["manifest.json"] + [f"part-0000{i}.{e}" for i in range(4) for e in
                                                             ("json", "jsonl")]  # 16 queries, 5 a part
  # The queries in input order, the repeated one joined (its positives too), the bad row left out and reported.
  pairs = mine_lib.read_pairs([str(files / "pairs.jsonl")])
  assert [r["query"] for r in rows] == pairs.queries and len(rows) == 16
  assert rows[0]["pos"] == [pairs.positives[0][0], "sky blue"] and rows[3]["pos"] == [pairs.positives[3][0]]
  assert manifest["pairs"]["rows"]["rows_skipped"] == 1
  assert manifest["pairs"]["rows"]["first_skipped"] == [f"{files / 'pairs.jsonl'}:6: missing field 'pos'"]
  # What the library mines for these settings, row for row.
  config = mine_lib.MineConfig(k1=0.9, b=0.4, range_min=1, range_max=8, num_negatives=3, margin=0.2, with_ids=True,
                               with_scores=True)
  corpus = mine_lib.files_corpus(str(files / "corpus.jsonl"))
  want, counts = mine_lib.mine_rows(pairs, corpus, mine_lib.Bm25Scorer(corpus, k1=0.9, b=0.4), config, 0, 16)
  assert rows == json.loads(json.dumps(want))
  assert manifest["counts"] == counts and manifest["settings"] == json.loads(json.dumps(config.__dict__))
  # The counts are the rows'.
  assert counts["mined"] == sum(len(r["neg"]) for r in rows) > 0
  assert counts["short"] == sum(len(r["neg"]) < 3 for r in rows) > 0
  assert counts["empty"] == sum(not r["neg"] for r in rows)
  retrieved = [len(top) for top, _, _ in mine_lib.Bm25Scorer(corpus, k1=0.9, b=0.4).shard(
      pairs.queries, pairs.positives, 8)]
  assert counts["candidates"] == sum(retrieved)
  assert counts["filtered"]["range_min"] == sum(n > 0 for n in retrieved)  # rank 0 of every query that found any
  assert counts["filtered"]["margin"] > 0 and counts["filtered"]["positive"] > 0
  assert counts["candidates"] - sum(counts["filtered"].values()) >= counts["mined"]  # survivors beyond K not kept
  for r in rows:
    assert len(r["neg"]) == len(r["neg_ids"]) == len(r["neg_scores"]) and len(r["pos_scores"]) == len(r["pos"])
    assert all(s <= min(r["pos_scores"]) - 0.2 + 1e-5 for s in r["neg_scores"])  # the margin held
    assert r["neg_scores"] == sorted(r["neg_scores"], reverse=True) and not set(r["neg"]) & set(r["pos"])
    assert [corpus.texts[corpus.ids.index(i)] for i in r["neg_ids"]] == r["neg"]
  assert [p["name"] for p in manifest["parts"]] == [f"part-0000{i}.jsonl" for i in range(4)]


def test_each_filter_flag_reaches_the_rows(files, tmp_path):
  """The CLI's filter flags, each moved from the fixture run's value, change the rows as the library says."""
  pairs = mine_lib.read_pairs([str(files / "pairs.jsonl")])
  corpus = mine_lib.files_corpus(str(files / "corpus.jsonl"))
  scorer = mine_lib.Bm25Scorer(corpus, k1=0.9, b=0.4)
  base = dict(k1=0.9, b=0.4, range_min=1, range_max=8, num_negatives=3)
  for flags, change in [(["--relative_margin", "0.2"], dict(relative_margin=0.2)),
                        (["--keep_equal_to_positive"], dict(keep_equal_to_positive=True)),
                        (["--sampling", "random", "--seed", "5"], dict(sampling="random", seed=5))]:
    out = tmp_path / flags[0].strip("-")
    argv = _mine_argv(files, out, *flags)
    for flag in ("--with_ids", "--with_scores", "--margin", "0.2"):
      argv.remove(flag)
    assert cli.main(argv) == 0
    rows = [json.loads(line) for p in sorted(out.glob("part-*.jsonl")) for line in p.read_text().splitlines()]
    want, _ = mine_lib.mine_rows(pairs, corpus, scorer, mine_lib.MineConfig(**base, **change), 0, 16)
    before, _ = mine_lib.mine_rows(pairs, corpus, scorer, mine_lib.MineConfig(**base), 0, 16)
    assert rows == json.loads(json.dumps(want)) and want != before, flags


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_two_processes_write_the_one_process_bytes_and_a_rerun_keeps_finished_parts(files, mined, tmp_path, capsys):
  out = tmp_path / "two"
  port = _free_port()
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags(1), JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
             JAX_NUM_PROCESSES="2")
  procs = [subprocess.Popen([sys.executable, "-m", "st5_jax.cli", *_mine_argv(files, out)],
                            env=dict(env, JAX_PROCESS_ID=str(i)), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
           for i in range(2)]
  for i, p in enumerate(procs):
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err.decode()[-3000:]
    log = err.decode()
    for s in range(4):  # part s mined by process s % 2 only
      assert (f"part-0000{s}: " in log) == (s % 2 == i), log[-2000:]
  assert _read_dir(out) == _read_dir(mined)

  # Resume: a part without its JSON and a part whose lines changed are mined again; the others are kept untouched.
  os.remove(out / "part-00001.json")
  (out / "part-00002.jsonl").write_text("{}\n")
  (out / ".part-00003.jsonl.tmp-123").write_text("a killed write")
  kept = {n: os.stat(out / n) for n in ("part-00000.jsonl", "part-00000.json", "part-00003.jsonl")}
  capsys.readouterr()
  assert cli.main(_mine_argv(files, out)) == 0
  err = capsys.readouterr().err
  assert "part-00000: finished by an earlier run, kept" in err and "part-00003: finished by an earlier run, kept" in err
  assert "part-00002: its lines differ from its JSON; mining it again" in err and "part-00001: 5 queries" in err
  for name, before in kept.items():
    after = os.stat(out / name)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns), name
  assert _read_dir(out) == _read_dir(mined)

  # Another run's settings into the same folder: refused, one line, nothing written.
  rc = cli.main(_mine_argv(files, out, "--relative_margin", "0.1"))
  err = capsys.readouterr().err.strip().splitlines()
  assert rc == cli.USER_ERROR_EXIT and len(err) == 1 and "another run" in err[0] and "another --out" in err[0], err
  assert _read_dir(out) == _read_dir(mined)


def test_bad_settings_and_inputs_are_one_line_errors(files, tmp_path, capsys):
  pairs = str(files / "pairs.jsonl")
  for argv, match in [
      (["--pairs", pairs, "--range_min", "5", "--range_max", "10", "--num_negatives", "6"], "fewer than"),
      (["--pairs", pairs, "--relative_margin", "1.5"], "relative_margin must be in [0, 1]"),
      (["--pairs", pairs, "--pairs_task", "st5_trecqa_positives"], "one of them"),
      ([], "one of them"),
      (["--pairs", pairs, "--model", "m"], "for --method dense"),
      (["--pairs", pairs, "--method", "dense"], "needs a model"),
      (["--pairs", str(tmp_path / "none.jsonl")], "does not exist"),
      (["--pairs", pairs, "--corpus", str(tmp_path / "none.jsonl")], "does not exist"),
      (["--pairs", pairs, "--columns", "query=q,answer=a"], "pair columns are query and pos"),
      (["--pairs", pairs, "--strict"], f"{pairs}:6: missing field 'pos'"),
      (["--pairs_task", "st5_no_such_task"], "st5_no_such_task"),
  ]:
    rc = cli.main(["data", "mine", "--out", str(tmp_path / "out"), *argv])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("st5 data mine: error: ")]
    assert rc == cli.USER_ERROR_EXIT and len(err) == 1 and match in err[0], (argv, err)
  assert not (tmp_path / "out").exists()


def test_pairs_of_a_registered_task_and_a_tsv(files, tmp_path):
  rows = [(q, p) for q, p in zip(_texts(6, 7, 2, 3), _texts(6, 8))]
  (tmp_path / "qa.tsv").write_text("".join(f"{q}\t{p}\n" for q, p in rows) + "too\tmany\tfields\n")
  (tmp_path / "qa2.tsv").write_text("question\tanswer\nsky\tsky blue sea\n")
  registry.register_user_task("mine_test_qa", file_pattern=str(tmp_path / "qa.tsv"),
                              columns={"inputs": 0, "targets": 1})
  registry.register_user_task("mine_test_qa2", file_pattern=str(tmp_path / "qa2.tsv"))
  registry.register_mixture("mine_test_mix", [("mine_test_qa", 1.0), ("mine_test_qa2", 1.0)])
  from_task = mine_lib.task_pairs("mine_test_qa", "train")
  from_file = mine_lib.read_pairs([str(tmp_path / "qa.tsv")])
  assert from_task.queries == from_file.queries == [q for q, _ in rows]
  assert from_task.positives == from_file.positives == [[p] for _, p in rows]
  assert from_file.stats["rows_skipped"] == 1 and from_task.stats["rows_skipped"] == 1
  named = mine_lib.read_pairs([str(tmp_path / "qa2.tsv")], columns={"query": "question", "pos": "answer"})
  assert (named.queries, named.positives) == (["sky"], [["sky blue sea"]])
  mixture = mine_lib.task_pairs("mine_test_mix", "train")  # its tasks in order: qa's rows, then qa2's
  assert mixture.queries == from_task.queries + ["sky"] and mixture.source["tasks"] == ["mine_test_qa", "mine_test_qa2"]
  out = tmp_path / "out"
  assert cli.main(["data", "mine", "--pairs_task", "mine_test_qa", "--out", str(out), "--num_negatives", "2",
                   "--range_max", "4"]) == 0
  manifest = json.loads((out / "manifest.json").read_text())
  assert manifest["pairs"]["source"] == {"task": "mine_test_qa", "split": "train", "tasks": ["mine_test_qa"]}
  assert manifest["corpus"]["source"] == {"positives": True} and manifest["corpus"]["documents"] == 6
  assert manifest["counts"]["queries"] == 6 and manifest["counts"]["filtered"]["positive"] > 0


def _model(directory, vocab_path, seed=0, **config):
  cfg = configs.ST5Config(t5=configs.t5_size("t5_tiny"), pooling="enc_mean", embedding_dim=16, max_length=32,
                          **config)
  params = jax.device_get(nn.unbox(init_params(cfg, jax.random.PRNGKey(seed))))
  native.save_model(directory, cfg, params, step=1, vocab_file=vocab_path)
  return str(directory)


def _mine_dense(files, out, model):
  """Dense-mines the fixture pairs against their positives on 2 devices: (pairs, corpus, config, output rows)."""
  pairs = mine_lib.read_pairs([str(files / "pairs.jsonl")])
  corpus = mine_lib.positives_corpus(pairs)
  config = mine_lib.MineConfig(method="dense", num_negatives=2, range_max=6, relative_margin=0.001,
                               with_scores=True)
  mine_lib.mine(pairs, corpus, str(out), config, model=model, devices=jax.local_devices()[:2], batch_size=8)
  rows = [json.loads(line) for line in (out / "part-00000.jsonl").read_text().splitlines()]
  return pairs, corpus, config, rows


def _assert_mined_by(s_QxN, pairs, corpus, config, rows):
  """Each row's positive scores, negatives and their scores are NumPy's ranking of s_QxN through the (tested)
  filters."""
  for q, row in enumerate(rows):
    ranked = np.lexsort((np.arange(len(corpus.texts)), -s_QxN[q]))[:config.range_max]
    pos_P = np.array([s_QxN[q, corpus.texts.index(p)] for p in pairs.positives[q]], np.float32)
    np.testing.assert_allclose(row["pos_scores"], pos_P, atol=1e-4)
    kept, _ = mine_lib.select_negatives(ranked, s_QxN[q, ranked], positives=pairs.positives[q], positive_scores_P=pos_P,
                                        corpus_texts=corpus.texts, config=config, query_index=q)
    assert row["neg"] == [corpus.texts[ranked[r]] for r in kept], q
    np.testing.assert_allclose(row["neg_scores"], s_QxN[q, ranked[kept]], atol=1e-4)


def test_dense_mining_ranks_by_the_models_embeddings_and_reads_a_given_index(files, tmp_path, vocab_path):
  model = _model(tmp_path / "model", vocab_path)
  pairs, corpus, config, rows = _mine_dense(files, tmp_path / "out", model)
  # The same model through the public encoder; ranks and scores by NumPy, then the (tested) filters.
  encoder = SentenceEncoder.load(model)
  q_QxD, d_NxD = encoder.encode(pairs.queries), encoder.encode(corpus.texts)
  assert corpus.ids == [f"p{i}" for i in range(len(corpus.texts))]
  _assert_mined_by(q_QxD @ d_NxD.T, pairs, corpus, config, rows)
  manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
  assert manifest["counts"]["filtered"]["relative_margin"] > 0 and manifest["scorer"]["index"] is None
  # The index it built, given back with --index: the same negatives, from the CLI.
  out2 = tmp_path / "out2"
  assert cli.main(["data", "mine", "--method", "dense", "--pairs", str(files / "pairs.jsonl"), "--index",
                   str(tmp_path / "out" / "index"), "--corpus", str(tmp_path / "out" / "corpus.jsonl"), "--out",
                   str(out2), "--num_negatives", "2", "--range_max", "6", "--relative_margin", "0.001",
                   "--with_scores"]) == 0
  again = [json.loads(line) for line in (out2 / "part-00000.jsonl").read_text().splitlines()]
  assert [r["neg"] for r in again] == [r["neg"] for r in rows]  # (8 devices here, 2 above: last digits may differ)
  np.testing.assert_allclose([s for r in again for s in r["neg_scores"]], [s for r in rows for s in r["neg_scores"]],
                             atol=1e-5)
  assert json.loads((out2 / "manifest.json").read_text())["scorer"]["index"] == str(tmp_path / "out" / "index")


def test_dense_mining_encodes_with_the_models_query_and_document_prompts(files, tmp_path, vocab_path):
  prompts = {"query": "query: ", "document": "passage: "}
  model = _model(tmp_path / "model", vocab_path, prompts=prompts)
  pairs, corpus, config, rows = _mine_dense(files, tmp_path / "out", model)
  # NumPy over the public encoder with the prompts written out: queries "query: ...", corpus "passage: ...".
  encoder = SentenceEncoder.load(model)
  q_QxD = encoder.encode([prompts["query"] + q for q in pairs.queries])
  d_NxD = encoder.encode([prompts["document"] + d for d in corpus.texts])
  s_QxN = q_QxD @ d_NxD.T
  plain_QxN = encoder.encode(pairs.queries) @ encoder.encode(corpus.texts).T
  assert np.abs(s_QxN - plain_QxN).max() > 1e-2  # the prompts change the scores, so the check below can fail
  _assert_mined_by(s_QxN, pairs, corpus, config, rows)


def _tree(out):
  """{path under out: bytes} of every file, index/ included."""
  return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_dense_mining_into_another_runs_folder_is_refused_before_anything_is_written(files, tmp_path, vocab_path,
                                                                                      capsys):
  model = _model(tmp_path / "model", vocab_path)
  out = tmp_path / "out"
  pairs = files / "pairs.jsonl"
  dense = ["data", "mine", "--method", "dense", "--model", model, "--out", str(out), "--num_negatives", "2",
           "--range_max", "5", "--batch_size", "8", "--shard_size", "6"]
  assert cli.main([*dense, "--pairs", str(pairs)]) == 0
  first = _tree(out)
  assert {"corpus.jsonl", "index/manifest.json", "manifest.json", "part-00002.json"} <= set(first), sorted(first)

  # Other pairs (and with them another corpus, their positives): refused in one line, out/corpus.jsonl and
  # out/index as they were (dense mining writes both before it mines).
  fewer = tmp_path / "fewer.jsonl"
  fewer.write_text("".join(pairs.read_text().splitlines(keepends=True)[1:]))
  capsys.readouterr()
  rc = cli.main([*dense, "--pairs", str(fewer)])
  err = capsys.readouterr().err.strip().splitlines()
  assert rc == cli.USER_ERROR_EXIT and len(err) == 1, err
  assert "holds mined negatives of another run" in err[0] and "another --out" in err[0], err
  assert _tree(out) == first

  # The same pairs and settings with another model: refused by its index, nothing changed either.
  other = _model(tmp_path / "other", vocab_path, seed=1)
  mined_pairs = mine_lib.read_pairs([str(pairs)])
  with pytest.raises(mine_lib.MineMismatchError, match="of another run, whose index/ is of another model"):
    mine_lib.mine(mined_pairs, mine_lib.positives_corpus(mined_pairs), str(out),
                  mine_lib.MineConfig(method="dense", num_negatives=2, range_max=5), model=other, batch_size=8,
                  shard_size=6)
  assert _tree(out) == first

  # The first run again is no other run: every part kept.
  assert cli.main([*dense, "--pairs", str(pairs)]) == 0
  assert capsys.readouterr().err.count("finished by an earlier run, kept") == 3
  assert _tree(out) == first
