"""Retrieval metrics against ir-measures (trec_eval), sentence-transformers and known answers; run files."""

import math

import ir_measures
import numpy as np
import pytest
import pytrec_eval
from ir_measures import AP, RR, P, R, Success, nDCG

from st5_jax.retrieval import metrics, runs
from st5_jax.retrieval.beir import RetrievalDataError

# Every measure at a default-list cutoff and at others.
METRICS = ("MRR@10", "MRR@3", "nDCG@10", "nDCG@5", "nDCG@30", "Recall@1", "Recall@7", "Recall@100", "MAP@100", "MAP@5",
           "Accuracy@1", "Accuracy@4", "Accuracy@100", "Precision@3", "Precision@20")
# trec_eval's measures, as ir-measures names them (MRR@k separately: trec_eval's recip_rank has no cutoff).
IR_MEASURES = {"nDCG": nDCG, "Recall": R, "MAP": AP, "Accuracy": Success, "Precision": P}


def _random_case(seed: int):
  """A run with many ties (6 score levels), graded qrels (-1..3) and the awkward cases of both."""
  rng = np.random.default_rng(seed)
  # Ids whose string order differs from their numeric order (d2 > d10), so the tie order shows.
  doc_ids = [f"d{i}" for i in range(400)]
  run, qrels = {}, {}
  for q in range(80):
    qid = f"q{q}"
    retrieved = rng.choice(len(doc_ids), int(rng.integers(0, 160)), replace=False)  # 0 to 159 docs (some > 100)
    if q % 9 != 4:  # every 9th query is missing from the run
      run[qid] = {doc_ids[i]: float(rng.integers(0, 6)) / 5 for i in retrieved}
    # Judged: some retrieved documents and some never retrieved; grades -1 (trec_eval: not relevant) to 3.
    judged = list(retrieved[:int(rng.integers(0, 12))]) + list(rng.choice(len(doc_ids), int(rng.integers(0, 4))))
    grades = rng.integers(-1, 4, len(judged)) if q % 11 != 7 else np.zeros(len(judged), int)  # all-zero queries
    qrels[qid] = {doc_ids[i]: int(g) for i, g in zip(judged, grades)}
  run["not_judged"] = {"d1": 1.0}  # a run query outside the qrels: ignored
  return run, qrels


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_metrics_equal_ir_measures_on_tied_runs_and_graded_qrels(seed):
  run, qrels = _random_case(seed)
  result = metrics.evaluate(run, qrels, METRICS)
  evaluated = {q for q, rel in qrels.items() if any(v > 0 for v in rel.values())}
  missing = evaluated - set(run)
  assert set(result["per_query"]) == evaluated and result["n_queries"] == len(evaluated)
  assert missing and result["n_missing_from_run"] == len(missing)
  assert len(evaluated) < len(qrels)  # queries without a relevant document are left out

  # trec_eval's implementation (pytrec_eval) on the same run and qrels, restricted to the evaluated queries.
  parsed = [metrics.parse_metric(m) for m in METRICS]
  measures = {m.name: IR_MEASURES[m.measure] @ m.k for m in parsed if m.measure != "MRR"}
  reference = {q: {} for q in evaluated}
  qrels_evaluated = {q: qrels[q] for q in evaluated}
  for row in ir_measures.pytrec_eval.iter_calc([*measures.values(), RR], qrels_evaluated, run):
    reference[row.query_id][str(row.measure)] = row.value
  for q in evaluated:
    ours = result["per_query"][q]
    if q in missing:  # pytrec_eval has nothing (or zeros) for a query outside the run; we score 0
      assert all(v == 0 for v in ours.values()) and all(v == 0 for v in reference[q].values())
      continue
    for m in parsed:
      if m.measure == "MRR":  # trec_eval's recip_rank cut at k: 1/rank when the rank is <= k
        rr = reference[q]["RR"]
        expected = rr if rr >= 1 / m.k - 1e-12 else 0.0
      else:
        expected = reference[q][str(measures[m.name])]
      assert ours[m.name] == pytest.approx(expected, abs=1e-6), (q, m.name)
  for m in parsed:
    per_query = [result["per_query"][q][m.name] for q in evaluated]
    assert result["mean"][m.name] == pytest.approx(sum(per_query) / len(evaluated), abs=1e-12)
  # The mean over all evaluated queries, a missing one counting 0 (trec_eval -c).
  assert result["mean"]["nDCG@10"] == pytest.approx(
      sum(reference[q].get("nDCG@10", 0.0) for q in evaluated) / len(evaluated), abs=1e-6)
  assert 0 < result["mean"]["nDCG@10"] < 1 and 0 < result["mean"]["MAP@5"] < result["mean"]["Recall@100"]

  # ir-measures' RR@k is MS MARCO's script, which breaks ties by ascending doc id: the ties here change it ...
  msmarco = {row.query_id: row.value for row in ir_measures.iter_calc([RR @ 10], qrels_evaluated, run)}
  assert any(msmarco[q] != pytest.approx(result["per_query"][q]["MRR@10"]) for q in evaluated - missing)
  # ... and without ties it is the same as ours.
  rng = np.random.default_rng(seed + 100)
  untied = {q: {d: float(rng.random()) for d in docs} for q, docs in run.items()}
  ours_untied = metrics.evaluate(untied, qrels, ["MRR@10", "MRR@3"])["per_query"]
  for k in (10, 3):
    for row in ir_measures.iter_calc([RR @ k], qrels_evaluated, untied):
      assert ours_untied[row.query_id][f"MRR@{k}"] == pytest.approx(row.value, abs=1e-9)


def test_known_answers_and_trec_eval_tie_order():
  # trec_eval order: c (0.9), then the 0.5 ties by doc id descending: z, b, a.
  # Relevances: c 0, b 2, a 1, e 3 (never retrieved).
  run = {"q": {"a": 0.5, "b": 0.5, "c": 0.9, "z": 0.5}}
  qrels = {"q": {"a": 1, "b": 2, "c": 0, "e": 3}}
  assert metrics.ranked(run["q"]) == ["c", "z", "b", "a"]
  assert metrics.ranked(run["q"], 2) == ["c", "z"]
  got = metrics.evaluate(run, qrels, ["MRR@10", "MRR@2", "Recall@3", "Recall@4", "Precision@4", "MAP@10", "MAP@3",
                                      "Accuracy@2", "Accuracy@3", "nDCG@4", "nDCG@2"])["mean"]
  idcg4 = 3 + 2 / math.log2(3) + 1 / 2
  expected = {"MRR@10": 1 / 3, "MRR@2": 0.0, "Recall@3": 1 / 3, "Recall@4": 2 / 3, "Precision@4": 2 / 4,
              "MAP@10": (1 / 3 + 2 / 4) / 3, "MAP@3": (1 / 3) / 3, "Accuracy@2": 0.0, "Accuracy@3": 1.0,
              "nDCG@4": (2 / math.log2(4) + 1 / math.log2(5)) / idcg4, "nDCG@2": 0.0}
  assert got == pytest.approx(expected, abs=1e-12)


def test_metric_names():
  got = metrics.evaluate({"q": {"a": 1.0}}, {"q": {"a": 1}}, ["ndcg@3", "RR@5", "Success@2", "r@4", "AP@7", "P@1",
                                                               "nDCG@3"])["mean"]
  assert got == {"nDCG@3": 1.0, "MRR@5": 1.0, "Accuracy@2": 1.0, "Recall@4": 1.0, "MAP@7": 1.0, "Precision@1": 1.0}
  for bad in ("F1@10", "nDCG", "nDCG@0", "nDCG@ten", "MRR@-1", "@5"):
    with pytest.raises(ValueError, match=r"unknown retrieval metric .* use MEASURE@k") as e:
      metrics.parse_metric(bad)
    assert "\n" not in str(e.value)
  with pytest.raises(ValueError, match="no retrieval metric given"):
    metrics.evaluate({}, {"q": {"a": 1}}, [])
  with pytest.raises(ValueError, match="no query of the qrels has a relevant document"):
    metrics.evaluate({"q": {"a": 1.0}}, {"q": {"a": 0, "b": -1}})
  with pytest.raises(ValueError, match="scores document 'b' NaN"):
    metrics.evaluate({"q": {"a": 1.0, "b": float("nan")}}, {"q": {"a": 1}})


def test_a_query_missing_from_the_run_scores_zero():
  run = {"q1": {"a": 2.0, "b": 1.0}, "elsewhere": {"a": 1.0}}
  qrels = {"q1": {"b": 1}, "q2": {"a": 1}, "q3": {"a": 0}}
  result = metrics.evaluate(run, qrels, ["MRR@10", "Recall@5"])
  assert result["per_query"] == {"q1": {"MRR@10": 0.5, "Recall@5": 1.0}, "q2": {"MRR@10": 0.0, "Recall@5": 0.0}}
  assert result["mean"] == {"MRR@10": 0.25, "Recall@5": 0.5}
  assert result["n_queries"] == 2 and result["n_missing_from_run"] == 1
  # pytrec_eval scores only what the run holds (a mean over its output would be 0.5, not 0.25); ir-measures fills
  # the other qrels queries with 0, as we do.
  evaluator = pytrec_eval.RelevanceEvaluator({"q1": qrels["q1"], "q2": qrels["q2"]}, {"recip_rank"})
  assert evaluator.evaluate(run) == {"q1": {"recip_rank": 0.5}}
  assert ir_measures.calc_aggregate([RR @ 10], {"q1": qrels["q1"], "q2": qrels["q2"]}, run) == {RR @ 10: 0.25}


def test_run_from_topk():
  doc_ids = ["a", "b", "c", "d"]
  scores_QxK = np.array([[0.9, 0.5, 0.1], [0.7, 0.7, 0.0]], np.float32)
  indices_QxK = np.array([[2, 0, 3], [1, 3, -1]])  # -1: fewer than k found (faiss)
  run = metrics.run_from_topk(["q1", "q2"], doc_ids, scores_QxK, indices_QxK)
  def f32(x):  # the scores stay float32 values
    return float(np.float32(x))

  assert run == {"q1": {"c": f32(0.9), "a": 0.5, "d": f32(0.1)}, "q2": {"b": f32(0.7), "d": f32(0.7)}}
  assert metrics.ranked(run["q2"]) == ["d", "b"]  # the tie by doc id descending, whatever the search's order
  with pytest.raises(ValueError, match="must both be"):
    metrics.run_from_topk(["q1"], doc_ids, scores_QxK, indices_QxK)
  with pytest.raises(ValueError, match="index 4 is out of range for 4 documents"):
    metrics.run_from_topk(["q1", "q2"], doc_ids, scores_QxK, indices_QxK + 1)
  with pytest.raises(ValueError, match="query id 'q1' appears twice"):
    metrics.run_from_topk(["q1", "q1"], doc_ids, scores_QxK, indices_QxK)
  with pytest.raises(ValueError, match="lists a document twice"):
    metrics.run_from_topk(["q1", "q2"], doc_ids, scores_QxK, np.array([[2, 2, 3], [1, 3, -1]]))
  with pytest.raises(ValueError, match="indices must be integers"):
    metrics.run_from_topk(["q1", "q2"], doc_ids, scores_QxK, indices_QxK.astype(np.float32))


def test_run_files_score_like_ir_measures_on_the_same_files(tmp_path):
  run, qrels = _random_case(5)
  run = {q: {d: float(np.float32(s) / 3) for d, s in docs.items()} for q, docs in run.items()}  # float32, ties kept
  trec = tmp_path / "out" / "run.trec"
  runs.write_trec(trec, run, tag="st5-test")
  assert runs.read_trec(trec) == {q: docs for q, docs in run.items() if docs}  # bit for bit; empty queries vanish
  lines = trec.read_text().splitlines()
  first_query = [line.split() for line in lines if line.startswith("q0 ")]
  assert [f[2] for f in first_query] == metrics.ranked(run["q0"]) and [int(f[3]) for f in first_query] == list(
      range(1, len(first_query) + 1))
  assert {f[1] for f in first_query} == {"Q0"} and {f[5] for f in first_query} == {"st5-test"}
  # ir-measures reads our file itself; trec_eval's figures on it equal ours.
  evaluated = {q: rel for q, rel in qrels.items() if any(v > 0 for v in rel.values())}
  theirs = ir_measures.pytrec_eval.calc_aggregate([nDCG @ 10, AP @ 100, R @ 7], evaluated,
                                                  ir_measures.read_trec_run(str(trec)))
  ours = metrics.evaluate(runs.read_trec(trec), qrels, ["nDCG@10", "MAP@100", "Recall@7"])
  assert ours["n_missing_from_run"] > 0  # ir-measures counts them as 0 too
  assert ours["mean"] == pytest.approx({"nDCG@10": theirs[nDCG @ 10], "MAP@100": theirs[AP @ 100],
                                        "Recall@7": theirs[R @ 7]}, abs=1e-6)

  jsonl = tmp_path / "run.jsonl"
  runs.write_jsonl(jsonl, run)
  assert runs.read_jsonl(jsonl) == run
  runs.write_jsonl(jsonl, run, k=3)
  top3 = runs.read_jsonl(jsonl)
  assert all(list(top3[q]) == metrics.ranked(run[q])[:3] for q in run)
  assert top3["q0"] == {d: run["q0"][d] for d in metrics.ranked(run["q0"], 3)}

  with pytest.raises(ValueError, match="tag 'my run' cannot go in a TREC run file"):
    runs.write_trec(tmp_path / "x.trec", run, tag="my run")
  with pytest.raises(ValueError, match="document id 'd 1' cannot go"):
    runs.write_trec(tmp_path / "x.trec", {"q": {"d 1": 1.0}}, tag="t")
  with pytest.raises(ValueError, match="k must be a positive integer"):
    runs.write_jsonl(jsonl, run, k=0)
  bad = tmp_path / "bad.trec"
  bad.write_text("q1 Q0 d1 1 0.5 t\nq1 Q0 d2 2 high t\n")
  with pytest.raises(RetrievalDataError, match=r"bad.trec:2: rank '2' or score 'high' is not a number"):
    runs.read_trec(bad)
  bad.write_text("q1 Q0 d1 1 0.5 t\nq1 Q0 d1 2 0.4 t\n")
  with pytest.raises(RetrievalDataError, match=r"bad.trec:2: document 'd1' retrieved twice for query 'q1'"):
    runs.read_trec(bad)
  bad.write_text("q1 Q0 d1 1 0.5\n")
  with pytest.raises(RetrievalDataError, match=r"bad.trec:1: 5 columns, not 6"):
    runs.read_trec(bad)
  bad.write_text('{"query_id": "q1", "results": [{"corpus_id": "d1"}]}\n')
  with pytest.raises(RetrievalDataError, match=r"bad.trec:1: not a run line \(KeyError"):
    runs.read_jsonl(bad)
  with pytest.raises(RetrievalDataError, match=r"nothing.trec: the run file is missing"):
    runs.read_trec(tmp_path / "nothing.trec")


class _FakeModel:
  """What InformationRetrievalEvaluator asks of a model: query embeddings (the query text is its id)."""

  def __init__(self, embeddings: dict):
    self.embeddings = embeddings

  def encode_query(self, sentences, **kwargs):
    import torch  # pylint: disable=g-import-not-at-top

    del kwargs
    return torch.from_numpy(np.stack([self.embeddings[s] for s in sentences]))


def _st_evaluator(queries_QxD, documents_NxD, relevant: dict, **kwargs):
  """sentence-transformers' metrics for dot-product ranking of these embeddings."""
  import torch  # pylint: disable=g-import-not-at-top
  from sentence_transformers.sentence_transformer.evaluation import (
    InformationRetrievalEvaluator,
  )

  query_ids = [f"q{i}" for i in range(len(queries_QxD))]
  corpus = {f"d{i}": f"d{i}" for i in range(len(documents_NxD))}
  evaluator = InformationRetrievalEvaluator({q: q for q in query_ids}, corpus, relevant, write_csv=False,
                                            score_functions={"dot": lambda a, b: a @ b.T}, **kwargs)
  model = _FakeModel(dict(zip(query_ids, queries_QxD)))
  return evaluator.compute_all_metrics(model, corpus_embeddings=torch.from_numpy(documents_NxD))["dot"]


def test_metrics_equal_sentence_transformers_on_the_same_embeddings():
  rng = np.random.default_rng(7)
  n_docs, n_queries, dim = 300, 40, 16
  documents_NxD = rng.normal(size=(n_docs, dim))
  documents_NxD /= np.linalg.norm(documents_NxD, axis=1, keepdims=True)
  queries_QxD = rng.normal(size=(n_queries, dim))
  queries_QxD /= np.linalg.norm(queries_QxD, axis=1, keepdims=True)
  relevant, pool = {}, iter(rng.permutation(n_docs))
  for q in range(n_queries):
    n_relevant = 8 if q % 5 == 0 else int(rng.integers(1, 5))  # R > 5 for every fifth query: MAP@5 differs
    docs = [next(pool) for _ in range(n_relevant)]
    relevant[f"q{q}"] = {f"d{i}" for i in docs}
    near_RxD = queries_QxD[q] + rng.normal(scale=0.5, size=(n_relevant, dim))  # relevant docs near their query
    documents_NxD[docs] = near_RxD / np.linalg.norm(near_RxD, axis=1, keepdims=True)
  scores_QxN = queries_QxD @ documents_NxD.T
  gaps = np.diff(np.sort(scores_QxN, axis=1), axis=1)
  assert gaps.min() > 1e-9  # no ties: sentence-transformers' tie order (ascending id) never comes in

  st = _st_evaluator(queries_QxD, documents_NxD, relevant, corpus_chunk_size=128, mrr_at_k=[3, 10],
                     ndcg_at_k=[5, 10], accuracy_at_k=[1, 3, 7], precision_recall_at_k=[1, 4, 100], map_at_k=[5, 100])
  run = {f"q{q}": {f"d{i}": float(s) for i, s in enumerate(row)} for q, row in enumerate(scores_QxN)}
  qrels = {q: dict.fromkeys(docs, 1) for q, docs in relevant.items()}
  names = ["MRR@3", "MRR@10", "nDCG@5", "nDCG@10", "Accuracy@1", "Accuracy@3", "Accuracy@7", "Recall@1", "Recall@4",
           "Recall@100", "Precision@1", "Precision@4", "MAP@5", "MAP@100"]
  ours = metrics.evaluate(run, qrels, names)
  for name, st_value in [("MRR@3", st["mrr@k"][3]), ("MRR@10", st["mrr@k"][10]), ("nDCG@5", st["ndcg@k"][5]),
                         ("nDCG@10", st["ndcg@k"][10]), ("Accuracy@1", st["accuracy@k"][1]),
                         ("Accuracy@3", st["accuracy@k"][3]), ("Accuracy@7", st["accuracy@k"][7]),
                         ("Recall@1", st["recall@k"][1]), ("Recall@4", st["recall@k"][4]),
                         ("Recall@100", st["recall@k"][100]), ("Precision@1", st["precision@k"][1]),
                         ("Precision@4", st["precision@k"][4]), ("MAP@100", st["map@k"][100])]:
    assert ours["mean"][name] == pytest.approx(float(st_value), abs=1e-6), name
  assert 0.2 < ours["mean"]["MRR@10"] < 0.9 and ours["mean"]["Recall@100"] < 1  # a ranking with something to measure

  # MAP@k: sentence-transformers divides by min(k, R), trec_eval (and we) by R; they differ where R > k.
  ap5 = {q: v["MAP@5"] for q, v in ours["per_query"].items()}
  st_map5 = np.mean([ap5[q] * len(relevant[q]) / min(5, len(relevant[q])) for q in relevant])
  assert float(st["map@k"][5]) == pytest.approx(st_map5, abs=1e-6)
  assert float(st["map@k"][5]) > ours["mean"]["MAP@5"] + 0.02


def test_sentence_transformers_breaks_ties_the_other_way():
  # Two documents with the same embedding, the relevant one first in id order: sentence-transformers ranks d0
  # first (ascending id), trec_eval and we rank d1 first (descending id).
  documents_NxD = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
  queries_QxD = np.array([[1.0, 0.0]])
  st = _st_evaluator(queries_QxD, documents_NxD, {"q0": {"d0"}}, mrr_at_k=[10], ndcg_at_k=[10], accuracy_at_k=[1],
                     precision_recall_at_k=[1], map_at_k=[10])
  ours = metrics.evaluate({"q0": {"d0": 1.0, "d1": 1.0, "d2": 0.0}}, {"q0": {"d0": 1}}, ["MRR@10"])
  assert float(st["mrr@k"][10]) == 1.0 and ours["mean"]["MRR@10"] == 0.5
