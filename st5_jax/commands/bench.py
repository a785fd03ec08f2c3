"""`st5 bench`: train-step and encode throughput on this machine's backend.

Prints examples/s, tokens/s and achieved FLOP/s of the real (jitted, sharded) train
step for a chosen size, batch and length; the fraction of a matmul peak measured in the
same process; and SentenceEncoder.encode throughput. Figures, never assertions.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from st5_jax.configs import POOLINGS


def register(sub: argparse._SubParsersAction) -> None:
  p = sub.add_parser("bench", help="Measure train-step and encode throughput on this backend.")
  p.add_argument("--size", default="t5_mini", help="T5 size (st5_jax/configs.py SIZES).")
  p.add_argument("--pooling", default="enc_mean", choices=list(POOLINGS))
  p.add_argument("--batch", type=int, default=64, help="Global batch size.")
  p.add_argument("--length", type=int, default=32, help="Tokens per sequence (every tower).")
  p.add_argument("--negatives", type=int, nargs="?", const=1, default=0, metavar="K",
                 help="Hard-negative towers per example: --negatives is one (stage 2), --negatives 3 three "
                      "(Contrastive.num_negatives).")
  p.add_argument("--steps", type=int, default=20, help="Timed steps (after one warm-up step).")
  p.add_argument("--dtype", default=None, help="Activation dtype (default: bfloat16 on accelerators, float32 on CPU).")
  p.add_argument("--scan", action="store_true", help="Scan over layers with full remat.")
  p.add_argument("--dropout", type=float, default=0.0, help="Dropout rate (costly on CPU: random masks).")
  p.add_argument("--embedding_dim", type=int, default=None,
                 help="Projection width (default: 768; 32 for the tiny sizes).")
  p.add_argument("--grad_cache_chunks", type=int, default=0)
  p.add_argument("--encode_sentences", type=int, default=2048, help="Sentences for the encode benchmark (0: skip).")
  p.add_argument("--json", default=None, help="Also write the figures as JSON.")
  p.set_defaults(run=run)


def matmul_peak(dtype, n: int = 2048, repeats: int = 10) -> float:
  """FLOP/s of an n x n x n matmul on the default device (best of `repeats`)."""
  # JAX here, not at the top: `st5 --help` imports every command module.
  import jax
  import jax.numpy as jnp

  a = jnp.ones((n, n), dtype)
  f = jax.jit(lambda x: x @ x)
  return 2 * n ** 3 / best_seconds(lambda: f(a).block_until_ready(), repeats)


def best_seconds(fn, repeats: int = 10) -> float:
  """Fastest of `repeats` timed calls of `fn()`, after one untimed call (compilation, warm caches)."""
  fn()
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - t)
  return best


def _minor_faults() -> float:
  """This process's minor page faults so far (NaN where the OS has no getrusage)."""
  try:
    import resource  # Unix only
  except ImportError:
    return float("nan")
  return float(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)


def token_batch(batch: int, length: int, sides, rng) -> dict:
  """Random token rows per tower from a NumPy Generator, EOS-terminated, no padding (the benchmarks' batches)."""
  host = {k: rng.integers(3, 32000, size=(batch, length)).astype("int32") for k in sides}
  for v in host.values():
    v[:, -1] = 1
  return host


def run(args: argparse.Namespace) -> int:
  # JAX, NumPy and the trainer here, not at the top: `st5 --help` imports every command module.
  import jax
  import numpy as np

  from st5_jax import configs, objectives, partitioning, train
  from st5_jax.inference import default_dtype

  dtype = args.dtype or default_dtype()
  model = configs.ST5Config(
      t5=configs.t5_size(args.size, dtype=dtype, dropout_rate=args.dropout, scan_layers=args.scan,
                         remat_policy="full" if args.scan else "none"),
      pooling=args.pooling,
      embedding_dim=args.embedding_dim or (768 if args.size not in ("t5_tiny", "t5_1_1_tiny") else 32),
      max_length=args.length)
  if args.negatives < 0:
    raise SystemExit(f"--negatives must be >= 0 (hard negatives per example), got {args.negatives}")
  tc = train.TrainConfig(num_train_steps=args.steps + 1, global_batch_size=args.batch,
                         grad_cache_chunks=args.grad_cache_chunks,
                         objective=objectives.Contrastive(num_negatives=max(args.negatives, 1)))
  mesh = partitioning.make_mesh(partitioning.MeshConfig())
  setup = train.build(model, tc, mesh)
  rng = np.random.default_rng(0)
  lengths = {"inputs": args.length, "targets": args.length}
  if args.negatives:
    lengths["negative_targets"] = args.length
  sides = list(setup.objective.required_lengths(lengths))  # the towers the objective reads
  host = token_batch(args.batch, args.length, sides, rng)
  batch = {k: jax.device_put(v, partitioning.batch_sharding(mesh)) for k, v in host.items()}
  step_flops = setup.objective.step_flops(model, global_batch_size=args.batch, lengths=lengths)

  with jax.set_mesh(mesh):
    state = train.init_state(setup, model, seed=0)
    t = time.perf_counter()
    state, m = setup.step_fn(state, batch)
    jax.block_until_ready(m)
    compile_s = time.perf_counter() - t
    faults = _minor_faults()
    t = time.perf_counter()
    for _ in range(args.steps):
      state, m = setup.step_fn(state, batch)
    jax.block_until_ready(m)
    step_s = (time.perf_counter() - t) / args.steps
    faults = (_minor_faults() - faults) / args.steps

  peak = matmul_peak(dtype)
  out = {
      "backend": jax.default_backend(), "devices": jax.device_count(), "device_kind": jax.devices()[0].device_kind,
      "cpu_count": os.cpu_count(), "size": args.size, "pooling": args.pooling, "dtype": dtype,
      "global_batch": args.batch, "length": args.length, "towers": len(sides), "scan": args.scan,
      "first_step_seconds": round(compile_s, 2), "step_seconds": step_s,
      "examples_per_sec": args.batch / step_s, "tokens_per_sec": args.batch * args.length * len(sides) / step_s,
      "step_flops": step_flops, "achieved_flops_per_sec": step_flops / step_s,
      "matmul_peak_flops_per_sec": peak, "fraction_of_matmul_peak": step_flops / step_s / peak,
      # Host page faults per timed step, and the malloc tunables they ran under (st5_jax/hostmem.py).
      "page_faults_per_step": faults, "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
  }

  if args.encode_sentences:
    from st5_jax import paths, vocab
    from st5_jax.encoder import SentenceEncoder

    enc = SentenceEncoder(model, jax.device_get(state.params), tokenizer=vocab.Tokenizer(paths.vocab_path()))
    words = "the a man woman dog plays runs on in park with guitar red blue quickly".split()
    texts = [" ".join(rng.choice(words, size=rng.integers(4, 24))) for _ in range(args.encode_sentences)]
    enc.encode(texts[:256])  # compile the buckets
    t = time.perf_counter()
    enc.encode(texts)
    out["encode_sentences_per_sec"] = len(texts) / (time.perf_counter() - t)

  width = max(len(k) for k in out)
  for k, v in out.items():
    print(f"{k:<{width}}  {v:.4g}" if isinstance(v, float) else f"{k:<{width}}  {v}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(out, f, indent=2)
  return 0
