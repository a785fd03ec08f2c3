"""Runs the whole evaluation suite for one encoder and prints per-task numbers and wall time.

  python benchmarks/eval_suite.py --model PATH --data_dir ../shared/data --markdown docs/results.md
  python benchmarks/eval_suite.py --fake --dim 64          # hashed bag of words, no model

Writes the markdown table (and, with --json, the results) where asked; the wall time
covers loading data, encoding every distinct text once, and all classifiers.
"""

from __future__ import annotations

import argparse
import logging
import os
import pathlib
import platform
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  src = p.add_mutually_exclusive_group(required=True)
  src.add_argument("--model", help="Model path (any format `st5 encode` loads).")
  src.add_argument("--fake", action="store_true", help="Hashed bag-of-words encoder (st5_jax.evaluation.baselines).")
  p.add_argument("--dim", type=int, default=64, help="Dimension of the --fake encoder.")
  p.add_argument("--tasks", default="all")
  p.add_argument("--data_dir", default=None, help="Default $ST5_DATA_DIR, else ../shared/data beside the repo.")
  p.add_argument("--batch_size", type=int, default=64)
  p.add_argument("--kfold", type=int, default=10)
  p.add_argument("--markdown", default=None, help="Write the results table here (e.g. docs/results.md).")
  p.add_argument("--json", default=None, help="Write the results JSON here.")
  p.add_argument("--name", default=None, help="Model name in the table.")
  args = p.parse_args(argv)

  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
  data_dir = (args.data_dir or os.environ.get("ST5_DATA_DIR")
              or str(pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"))

  from st5_jax.evaluation import evaluate, report
  from st5_jax.evaluation.baselines import HashedBagOfWords

  start = time.perf_counter()
  if args.fake:
    encode, source = HashedBagOfWords(args.dim), f"HashedBagOfWords({args.dim})"
    name = args.name or f"hashed-bow-{args.dim}"
    load_seconds = 0.0
  else:
    from st5_jax.encoder import SentenceEncoder
    enc = SentenceEncoder.load(args.model)
    encode = lambda texts: enc.encode(texts, batch_size=args.batch_size)  # noqa: E731
    name, source = args.name or pathlib.Path(args.model.rstrip("/")).name, args.model
    load_seconds = time.perf_counter() - start
  result = evaluate(encode, args.tasks, data_dir, kfold=args.kfold)
  wall = time.perf_counter() - start
  result["source"] = source
  result["meta"].update(wall_seconds=wall, model_load_seconds=load_seconds, cpu_count=os.cpu_count(),
                        machine=platform.machine(), command=" ".join([sys.executable] + sys.argv))

  print(f"\n{'task':<18} {'metric':<24} {'score':>8} {'seconds':>8}")
  for task, res in result["tasks"].items():
    main = res.get("main")
    score = f"{main:8.2f}" if main is not None else f"align={res['alignment']:.3f} uniform={res['uniformity']:.3f}"
    print(f"{task:<18} {str(res.get('metric')):<24} {score:>8} {res['seconds']:8.1f}")
  for suite, s in result["summary"].items():
    print(f"{suite} mean: {s['mean']:.2f}" if "mean" in s else f"{suite}: {s}")
  print(f"distinct texts {result['meta']['n_texts']}, dim {result['meta']['dim']}, "
        f"encode {result['meta']['encode_seconds']:.1f}s, wall {wall:.1f}s on {os.cpu_count()} CPUs")

  if args.markdown:
    md = report.markdown({name: result}, title=f"Evaluation results: {name}")
    md += (f"\nWall time {wall:.1f}s (model load {load_seconds:.1f}s, "
           f"encoding {result['meta']['encode_seconds']:.1f}s) "
           f"on {os.cpu_count()} CPU cores; command: `{result['meta']['command']}`\n")
    pathlib.Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.markdown).write_text(md, encoding="utf-8")
    print(f"wrote {args.markdown}")
  if args.json:
    report.write_json(args.json, {"models": {name: result}})
    print(f"wrote {args.json}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
