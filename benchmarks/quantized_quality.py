"""What int8 and binary embeddings cost in quality: STS-B test Spearman and retrieval MRR@10, per model.

    python benchmarks/quantized_quality.py --models DIR1,DIR2,DIR3 [--out results.json]

Each model encodes STS-B test and the retrieval sets once (float32); the embeddings are then
quantized by st5_jax/quantize.py (sentence-transformers' `quantize_embeddings` codes) and scored:

* STS-B: Spearman of the pair similarity computed on the codes, as a vector database would:
  float32 cosine; int8 dot product of the codes (ranges calibrated on the set's own sentences);
  binary 1 - 2 * Hamming / D.
* Retrieval: `quantize.search` over the corpus codes (int8 ranges from the corpus, as
  `st5 index --precision int8` computes them), without rescoring and with float32 rescoring of
  the top 4k; MRR@10 (trec_eval's, st5_jax.retrieval.metrics). BM25's row is computed again.

Prints one markdown table (mean ± std over the models, min–max) and writes --out.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("ST5_DATA_DIR", str(REPO.parent / "shared" / "data"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402
import scipy.stats  # noqa: E402

ARMS = [("float32", None, 0), ("int8", "int8", 0), ("int8 + rescore x4", "int8", 4), ("binary", "binary", 0),
        ("binary + rescore x4", "binary", 4)]
K = 100


def retrieval_sets(data_dir: str) -> dict:
  from st5_jax.evaluation import retrieval_readers as rr  # pylint: disable=g-import-not-at-top
  return {"TREC-QA": rr.read_trecqa(data_dir), "WikiQA": rr.read_wikiqa(data_dir),
          "SQuAD-paragraphs": rr.read_squad(data_dir, level="paragraph")[0]}


def sts_scores(a_NxD: np.ndarray, b_NxD: np.ndarray, precision: str | None) -> np.ndarray:
  from st5_jax import quantize  # pylint: disable=g-import-not-at-top
  if precision is None:
    return (a_NxD * b_NxD).sum(-1)
  if precision == "int8":
    ranges = quantize.quantization_ranges(np.concatenate([a_NxD, b_NxD]))
    qa, qb = (quantize.quantize_embeddings(x, "int8", ranges=ranges).astype(np.int64) for x in (a_NxD, b_NxD))
    return (qa * qb).sum(-1).astype(np.float64)
  dim = a_NxD.shape[1]
  qa, qb = (quantize.quantize_embeddings(x, "binary") for x in (a_NxD, b_NxD))
  bits_a, bits_b = (np.unpackbits(x.view(np.uint8), axis=1)[:, :dim] for x in (qa, qb))
  return 1.0 - 2.0 * (bits_a != bits_b).sum(-1) / dim


def mrr(data, queries_QxD, documents_NxD, precision, rescore) -> float:
  from st5_jax import quantize  # pylint: disable=g-import-not-at-top
  from st5_jax.evaluation.retrieval import MAIN  # pylint: disable=g-import-not-at-top
  from st5_jax.retrieval import metrics  # pylint: disable=g-import-not-at-top
  from st5_jax.retrieval.search import exact_search  # pylint: disable=g-import-not-at-top
  k = min(K, len(documents_NxD))
  if precision is None:
    scores, indices = exact_search(queries_QxD, documents_NxD, k)
  else:
    ranges = quantize.quantization_ranges(documents_NxD) if precision == "int8" else None
    codes = quantize.quantize_embeddings(documents_NxD, precision, ranges=ranges)
    scores, indices = quantize.search(queries_QxD, codes, k, precision=precision, ranges=ranges,
                                      rescore_multiplier=rescore)
  run = metrics.run_from_topk(list(data.queries), list(data.corpus), np.asarray(scores), np.asarray(indices))
  return float(metrics.evaluate(run, data.qrels, [MAIN])["mean"][MAIN])


def measure(model: str, data_dir: str, sets: dict) -> dict:
  from st5_jax import SentenceEncoder  # pylint: disable=g-import-not-at-top
  from st5_jax.evaluation import readers  # pylint: disable=g-import-not-at-top
  enc = SentenceEncoder.load(model)
  t = time.perf_counter()
  sts = readers.read_stsb(data_dir, split="test")
  a, b = (np.asarray(enc.encode(s), np.float32) for s in (sts.sents1, sts.sents2))
  out = {"sts": {name: 100 * scipy.stats.spearmanr(sts_scores(a, b, p), sts.scores)[0] for name, p, _ in ARMS
                 if _ == 0}}
  out["retrieval"] = {}
  for set_name, data in sets.items():
    q = np.asarray(enc.encode_query([data.queries[i] for i in data.queries]), np.float32)
    d = np.asarray(enc.encode_document([data.corpus[i] for i in data.corpus]), np.float32)
    out["retrieval"][set_name] = {name: mrr(data, q, d, p, r) for name, p, r in ARMS}
  out["seconds"] = time.perf_counter() - t
  return out


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--models", required=True, help="comma-separated model paths (e.g. one work dir per seed)")
  ap.add_argument("--data_dir", default=os.environ["ST5_DATA_DIR"])
  ap.add_argument("--out")
  args = ap.parse_args()
  from st5_jax.evaluation.retrieval import bm25_task  # pylint: disable=g-import-not-at-top
  sets = retrieval_sets(args.data_dir)
  bm25 = {name: bm25_task(data)["main"] for name, data in sets.items()}
  per_model = {m: measure(m, args.data_dir, sets) for m in args.models.split(",")}
  results = {"models": per_model, "bm25": bm25}
  if args.out:
    pathlib.Path(args.out).write_text(json.dumps(results, indent=1))

  def cell(values, scale=1.0, digits=3):
    v = np.asarray(values) * scale
    return f"{v.mean():.{digits}f} ± {v.std():.{digits}f} ({v.min():.{digits}f}–{v.max():.{digits}f})"

  runs = list(per_model.values())
  print(f"\n{len(runs)} models; mean ± std (min–max)\n")
  print("| output | STS-B test Spearman x100 | " + " | ".join(f"{s} MRR@10" for s in sets) + " |")
  print("|---|---|" + "---|" * len(sets))
  for name, _, rescore in ARMS:
    sts_cell = cell([r["sts"][name] for r in runs], digits=1) if rescore == 0 else "-"
    print(f"| {name} | {sts_cell} | " + " | ".join(cell([r["retrieval"][s][name] for r in runs]) for s in sets) + " |")
  print("| BM25 | - | " + " | ".join(f"{bm25[s]:.3f}" for s in sets) + " |")


if __name__ == "__main__":
  main()
