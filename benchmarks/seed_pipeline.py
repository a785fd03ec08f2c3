"""SEED-Encoder's pipeline in miniature on this CPU: pre-train, then the README's NLI stage, then evaluate.

    python benchmarks/seed_pipeline.py --workdir workdirs/seed_pipeline        # ~25 min on 2 idle cores

(a) `gin/seed_encoder_tiny_cpu.gin` with SeedEncoder.decoder_loss_weight = 0 (T5 span
    corruption only), (b) the same with the weak decoder (w = 1), then `gin/st5_tiny_cpu.gin`
    (NLI triples, contrastive) with `run.init_from` = (a) / (b), and (c) from random init.
Prints and writes <workdir>/seed_pipeline.json and .md: STS average (7 sets) and STS-B test
Spearman of the three NLI models, and the mean cosine similarity of random pairs of long
texts (SQuAD v1.1 dev paragraphs, cut at the model's 64 tokens; only encoded, never trained
on) for each tower before and after the NLI stage (the paper's Figure 1: an encoder
pre-trained through a strong decoder maps unrelated long texts to similar vectors).
All runs share one process, so the evaluation sets are read once. `--pre_steps` and
`--nli_steps` shorten the runs (say so when reporting the numbers).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import sys
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SQUAD_DEV = "squad_v1.1_dev/dev-v1.1.reconstructed.json"


def _train(gin_file: str, bindings: list[str], workdir: pathlib.Path) -> float:
  import gin
  from st5_jax import gin_config
  from st5_jax.gin_config import parse_gin
  t0 = time.perf_counter()
  parse_gin([gin_file], bindings)
  gin_config.train_from_gin(workdir=str(workdir), progress=False)
  gin.clear_config()
  return time.perf_counter() - t0


def long_text_pairs(data_dir: str, n_pairs: int, seed: int = 0) -> list[tuple[str, str]]:
  """`n_pairs` random pairs of distinct SQuAD dev paragraphs (different articles)."""
  data = json.loads((pathlib.Path(data_dir) / SQUAD_DEV).read_text())
  paras = [(a_i, " ".join(p["context"].split())) for a_i, a in enumerate(data["data"]) for p in a["paragraphs"]]
  rng = np.random.default_rng(seed)
  pairs = []
  while len(pairs) < n_pairs:
    i, j = rng.integers(len(paras), size=2)
    if paras[i][0] != paras[j][0]:
      pairs.append((paras[i][1], paras[j][1]))
  return pairs


def mean_pair_cosine(encoder, pairs) -> float:
  left = encoder.encode([a for a, _ in pairs])
  right = encoder.encode([b for _, b in pairs])
  left /= np.linalg.norm(left, axis=1, keepdims=True)
  right /= np.linalg.norm(right, axis=1, keepdims=True)
  return float(np.mean(np.sum(left * right, axis=1)))


def random_init_encoder(reference_dir: pathlib.Path, seed: int):
  """The NLI run's tower with the random parameters its (c) run started from."""
  import jax
  from st5_jax import vocab as vocab_lib
  from st5_jax.checkpoints import native
  from st5_jax.encoder import SentenceEncoder
  from st5_jax.model.st5 import init_params
  import flax.linen as nn
  config = native.read_config(reference_dir)
  params = jax.device_get(nn.unbox(init_params(config, jax.random.PRNGKey(seed))))
  return SentenceEncoder(config, params, tokenizer=vocab_lib.Tokenizer(str(reference_dir / "spiece.model")))


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--workdir", required=True)
  p.add_argument("--data_dir", default=os.environ.get("ST5_DATA_DIR", str(REPO.parent / "shared" / "data")))
  p.add_argument("--pre_steps", type=int, default=300, help="pre-training steps of (a) and (b)")
  p.add_argument("--nli_steps", type=int, default=900, help="NLI steps of every run (st5_tiny_cpu.gin: 900)")
  p.add_argument("--pairs", type=int, default=500, help="random long-text pairs")
  p.add_argument("--weak_weight", type=float, default=1.0, help="decoder_loss_weight of (b)")
  args = p.parse_args(argv)
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
  os.environ["ST5_DATA_DIR"] = args.data_dir
  work = pathlib.Path(args.workdir)
  work.mkdir(parents=True, exist_ok=True)
  from st5_jax.encoder import SentenceEncoder
  from st5_jax.evaluation import harness

  seconds = {}
  pre = {"a": 0.0, "b": args.weak_weight}
  for name, weight in pre.items():
    seconds[f"pretrain_{name}"] = _train("seed_encoder_tiny_cpu.gin", [
        f"SeedEncoder.decoder_loss_weight = {weight}", f"TrainConfig.num_train_steps = {args.pre_steps}",
        f"TrainConfig.checkpoint_every = {args.pre_steps}"], work / f"pretrain_{name}")
  nli_eval = max(args.nli_steps, 1)
  for name in ("a", "b", "c"):
    init = [f"run.init_from = '{work / f'pretrain_{name}'}'"] if name in pre else []
    seconds[f"nli_{name}"] = _train("st5_tiny_cpu.gin", init + [
        f"TrainConfig.num_train_steps = {args.nli_steps}", f"TrainConfig.checkpoint_every = {args.nli_steps}",
        f"TrainConfig.eval_every = {nli_eval}"], work / f"nli_{name}")

  pairs = long_text_pairs(args.data_dir, args.pairs)
  rows = {}
  for name in ("a", "b", "c"):
    t0 = time.perf_counter()
    before = (SentenceEncoder.load(str(work / f"pretrain_{name}")) if name in pre
              else random_init_encoder(work / "nli_c", seed=0))
    after = SentenceEncoder.load(str(work / f"nli_{name}"))
    result = harness.evaluate(after.encode, tasks="sts", data_dir=args.data_dir)
    summary = json.loads((work / f"nli_{name}" / "results.json").read_text())
    rows[name] = {
        "sts_mean": result["summary"]["sts"]["mean"],
        "stsb_test": result["tasks"]["STSBenchmark"]["main"],
        "stsb_dev_before_nli": summary.get("stsb_dev_spearman_before"),
        "long_text_cosine_before_nli": mean_pair_cosine(before, pairs),
        "long_text_cosine_after_nli": mean_pair_cosine(after, pairs),
        "sts": {k: v["main"] for k, v in result["tasks"].items()},
    }
    seconds[f"eval_{name}"] = time.perf_counter() - t0
  labels = {"a": f"(a) span corruption only, {args.pre_steps} steps",
            "b": f"(b) span corruption + weak decoder (w={args.weak_weight}), {args.pre_steps} steps",
            "c": "(c) random init"}
  lines = [f"NLI stage: st5_tiny_cpu.gin, {args.nli_steps} steps; long-text pairs: {args.pairs} SQuAD dev "
           "paragraph pairs from different articles.", "",
           "| start of the NLI stage | STS avg | STS-B test | STS-B dev before NLI | long-text cos before NLI "
           "| long-text cos after NLI |", "|---|---:|---:|---:|---:|---:|"]
  for name, r in rows.items():
    dev = "-" if r["stsb_dev_before_nli"] is None else f"{r['stsb_dev_before_nli']:.2f}"
    lines.append(f"| {labels[name]} | {r['sts_mean']:.2f} | {r['stsb_test']:.2f} | {dev} | "
                 f"{r['long_text_cosine_before_nli']:.3f} | {r['long_text_cosine_after_nli']:.3f} |")
  lines += ["", "Wall time (s): " + ", ".join(f"{k} {v:.0f}" for k, v in seconds.items())]
  table = "\n".join(lines)
  print(table)
  (work / "seed_pipeline.md").write_text(table + "\n")
  (work / "seed_pipeline.json").write_text(json.dumps({"args": vars(args), "rows": rows, "seconds": seconds},
                                                      indent=2))
  return 0


if __name__ == "__main__":
  sys.exit(main())
