"""Matryoshka vs models trained at each dimension alone: STS avg and retrieval MRR@10 at 32 ... 256 dims.

    python benchmarks/matryoshka_table.py --sweep SWEEP_DIR [--dims 32,64,128,256] [--out results.json]

SWEEP_DIR is an `st5 sweep --out` folder (its runs/ARM/seedK work dirs). Each model encodes every text of
the 7 STS sets and of the retrieval sets once, at its full size (queries with `encode_query`, documents with
`encode_document`); each smaller size is the first d dimensions of those vectors, L2-normalised again (what
`encode(truncate_dim=d)` returns, st5_jax/encoder.py). Every size no larger than the model's is scored by
`st5 eval`'s own harness (st5_jax.evaluation.harness.evaluate): STS avg is the mean Spearman x100 of the 7 STS
sets, MRR@10 the mean over the retrieval sets (trec_eval's measure). BM25's row is computed again.

Prints one markdown table (mean ± sample std over seeds) and writes --out.
"""

from __future__ import annotations

import argparse
import collections
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

STS = ("STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness")


class Memo:
  """One side of a model's encoder, each distinct text encoded once at full size."""

  def __init__(self, encode):
    self.encode = encode
    self.vectors: dict[str, np.ndarray] = {}

  def truncated(self, dim: int):
    def encode(texts):
      new = [t for t in dict.fromkeys(texts) if t not in self.vectors]
      if new:
        self.vectors.update(zip(new, np.asarray(self.encode(new), np.float32)))
      x_NxD = np.stack([self.vectors[t][:dim] for t in texts])
      return x_NxD / np.maximum(np.linalg.norm(x_NxD, axis=1, keepdims=True), 1e-12)
    return encode


def measure(model: str, dims: list[int], data_dir: str) -> dict:
  from st5_jax import SentenceEncoder  # pylint: disable=g-import-not-at-top
  from st5_jax.evaluation import harness  # pylint: disable=g-import-not-at-top
  enc = SentenceEncoder.load(model)
  sides = {"encode": Memo(enc.encode), "query": Memo(enc.encode_query), "document": Memo(enc.encode_document)}
  out = {"dim": enc.dim}
  for d in [d for d in dims if d <= enc.dim]:
    t = time.perf_counter()
    res = harness.evaluate(sides["encode"].truncated(d), ["sts", "retrieval"], data_dir,
                           encode_query=sides["query"].truncated(d), encode_document=sides["document"].truncated(d))
    tasks = res["tasks"]
    retrieval = {n: r["main"] for n, r in tasks.items() if r.get("metric") == "MRR@10"}
    out[str(d)] = {"sts": {n: tasks[n]["main"] for n in STS}, "mrr10": retrieval,
                   "sts_avg": float(np.mean([tasks[n]["main"] for n in STS])),
                   "mrr10_avg": float(np.mean(list(retrieval.values()))), "seconds": time.perf_counter() - t}
    print(f"{model} @ {d}: STS avg {out[str(d)]['sts_avg']:.2f}, MRR@10 avg {out[str(d)]['mrr10_avg']:.4f}",
          flush=True)
  return out


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--sweep", required=True, help="an `st5 sweep --out` folder")
  ap.add_argument("--dims", default="32,64,128,256")
  ap.add_argument("--data_dir", default=os.environ["ST5_DATA_DIR"])
  ap.add_argument("--out")
  args = ap.parse_args()
  from st5_jax.evaluation import harness  # pylint: disable=g-import-not-at-top
  dims = [int(d) for d in args.dims.split(",")]
  out_path = pathlib.Path(args.out) if args.out else None
  results = json.loads(out_path.read_text()) if out_path and out_path.exists() else {"models": {}}
  runs = sorted(p.parent for p in pathlib.Path(args.sweep).glob("runs/*/seed*/sweep_run.json"))
  for run in runs:
    record = json.loads((run / "sweep_run.json").read_text())
    if str(run) in results["models"] or not (record.get("trained") and record.get("eval")):
      continue  # measured already (a rerun resumes), or the sweep has not finished it yet
    results["models"][str(run)] = {"arm": run.parent.name, "seed": run.name, **measure(str(run), dims, args.data_dir)}
    if out_path:
      out_path.write_text(json.dumps(results, indent=1))
  if "bm25" not in results:
    bm25 = harness.evaluate_bm25("retrieval", args.data_dir)["tasks"]
    results["bm25"] = {n: r["main"] for n, r in bm25.items()}
    if out_path:
      out_path.write_text(json.dumps(results, indent=1))

  by_arm = collections.defaultdict(list)
  for r in results["models"].values():
    by_arm[r["arm"]].append(r)

  def cell(values, digits):
    if not values:
      return "-"
    v = np.asarray(values, np.float64)
    std = v.std(ddof=1) if len(v) > 1 else 0.0
    return f"{v.mean():.{digits}f} ± {std:.{digits}f}"

  print(f"\nmean ± sample std over seeds; STS avg: Spearman x100 of {len(STS)} sets; MRR@10: mean over "
        f"{len(results['bm25'])} retrieval sets\n")
  print("| arm | n | " + " | ".join(f"STS avg @{d}" for d in dims) + " | "
        + " | ".join(f"MRR@10 @{d}" for d in dims) + " |")
  print("|---|---:|" + "---:|" * (2 * len(dims)))
  print("| BM25 | - | " + " | ".join("-" for _ in dims) + " | "
        + " | ".join(f"{np.mean(list(results['bm25'].values())):.3f}" for _ in dims) + " |")
  for arm, rs in sorted(by_arm.items()):
    print(f"| {arm} | {len(rs)} | " + " | ".join(cell([r[str(d)]["sts_avg"] for r in rs if str(d) in r], 1)
                                               for d in dims) + " | "
          + " | ".join(cell([r[str(d)]["mrr10_avg"] for r in rs if str(d) in r], 3) for d in dims) + " |")


if __name__ == "__main__":
  main()
