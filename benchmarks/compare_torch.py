"""st5_jax vs the PyTorch path a user would pick, side by side in one process.

    python benchmarks/compare_torch.py                 # the issue-19 table (minutes on 2 cores)
    python benchmarks/compare_torch.py --quick         # tiny shapes, seconds (tests/test_benchmarks_speed.py)
    python benchmarks/compare_torch.py --only train --models t5_1_1_small --steps 5

Both sides get the same shapes and the same random weights: a PyTorch
`transformers.T5EncoderModel` + mean pooling + bias-free `Dense` + `Normalize` is built as a
`SentenceTransformer` (the public sentence-t5 layout), saved, and loaded into st5_jax through
the project's sentence-transformers/HF importer (`SentenceEncoder.load`). Before anything is
timed, both towers embed the same token ids and the max abs difference is printed, and both
sides' first-step losses on the same batch are printed: a wrong weight mapping shows there.

Train: f32, no dropout, one hard negative, in-batch softmax at scale 100 (temperature 0.01),
random token batches. PyTorch: three tower calls (query, positive, negative), `AdamW`.
st5_jax: the real jitted step of `st5_jax.train.build` (Adafactor), as `st5 bench` times it.
Encode: the 2,758 STS-B test sentences ($ST5_DATA_DIR, `read_stsb`), batch 64, through
`SentenceTransformer.encode` vs `SentenceEncoder.encode`; best of --repeats warm passes.
`torch.set_num_threads(--threads)`; XLA uses the machine's cores. Figures only, no assertions.

Each row also prints its ceiling: the work's model FLOPs (st5_jax/flops.py; for encode, only
the real tokens, no padding) at this machine's f32 matmul peak (a 2048^3 matmul, the faster of
the two sides, measured in the same process). No f32 implementation of the same work can be
faster, so `ceiling / torch` is the largest ratio any change to st5_jax could reach here.

Both sides run in this one process, so a malloc setting applies to both:
`GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python benchmarks/compare_torch.py` compares them as
the `st5` command runs (st5_jax/hostmem.py); without it, as a Python script runs by default.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("ST5_DATA_DIR", str(REPO.parent / "shared" / "data"))
os.environ.setdefault("ST5_VOCAB", str(REPO.parent / "shared" / "data" / "t5_spiece" / "spiece.model"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

# name -> (st5_jax size, overrides); "t5_1_1_d128" is the "T5.1.1 tiny-ish (d 128, 2 layers)".
MODELS = {
    "t5_mini": ("t5_mini", {}),
    "t5_1_1_small": ("t5_1_1_small", {}),
    "t5_1_1_d128": ("t5_1_1_small", dict(emb_dim=128, mlp_dim=512, num_heads=4, head_dim=32,
                                         num_encoder_layers=2, num_decoder_layers=2)),
    # --quick
    "t5_tiny": ("t5_tiny", {}),
    "t5_1_1_tiny": ("t5_1_1_tiny", {}),
}
FULL = dict(train_models=["t5_mini", "t5_1_1_small"], encode_models=["t5_1_1_d128", "t5_1_1_small"],
            batch=64, length=32, projection=768, steps=5, sentences=0, repeats=2)
QUICK = dict(train_models=["t5_tiny", "t5_1_1_tiny"], encode_models=["t5_1_1_tiny"],
             batch=8, length=16, projection=32, steps=2, sentences=96, repeats=1)


def build_pair(name: str, *, projection: int, max_seq_length: int, workdir: pathlib.Path, seed: int = 0):
  """(SentenceTransformer, SentenceEncoder) with the same random weights, f32, no dropout."""
  import torch
  import transformers
  from sentence_transformers import SentenceTransformer, models

  from st5_jax import configs, paths
  from st5_jax.checkpoints import hf
  from st5_jax.encoder import SentenceEncoder

  size, overrides = MODELS[name]
  t5 = configs.t5_size(size, dropout_rate=0.0, **overrides)
  hf_cfg = hf.hf_config_from_t5(t5, encoder_only=True)
  hf_cfg.update(dropout_rate=0.0)
  torch.manual_seed(seed)
  model = transformers.T5EncoderModel(transformers.T5Config(**hf_cfg))
  with torch.no_grad():  # non-trivial norm scales, so a dropped or misplaced scale shows
    for pname, p in model.named_parameters():
      if "layer_norm" in pname:
        p.uniform_(0.5, 1.5)
  t5_dir = workdir / f"{name}_t5"
  model.save_pretrained(t5_dir)
  shutil.copyfile(paths.vocab_path(), t5_dir / "spiece.model")
  transformers.T5Tokenizer.from_pretrained(t5_dir).save_pretrained(t5_dir)
  word = models.Transformer(str(t5_dir), max_seq_length=max_seq_length)
  pool = models.Pooling(word.get_embedding_dimension(), pooling_mode="mean")
  dense = models.Dense(t5.emb_dim, projection, bias=False, activation_function=torch.nn.Identity())
  st = SentenceTransformer(modules=[word, pool, dense, models.Normalize()], device="cpu")
  folder = workdir / f"{name}_st"
  st.save(str(folder))
  enc = SentenceEncoder.load(folder, dtype="float32", batch_size=64)
  return st.eval(), enc


def torch_embed_fn(st):
  """tokens [B, L] (pad 0) -> L2-normalised embeddings, through the ST modules' torch weights."""
  import torch

  t5, linear = st[0].auto_model, st[2].linear

  def embed(tokens_BxL):
    mask_BxL = tokens_BxL > 0
    h_BxLxD = t5(input_ids=tokens_BxL, attention_mask=mask_BxL.long()).last_hidden_state
    m = mask_BxL.unsqueeze(-1).to(h_BxLxD.dtype)
    pooled_BxD = (h_BxLxD * m).sum(1) / m.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(linear(pooled_BxD), dim=-1)

  return embed


def agreement(st, enc, texts) -> float:
  """Max abs difference of the two towers on identical token ids (bucket-padded as st5_jax pads)."""
  import numpy as np
  import torch

  from st5_jax import vocab
  from st5_jax.encoder import length_bucket

  rows = enc.tokenize(texts)
  tokens_BxL = vocab.pad_batch(rows, length_bucket(max(map(len, rows)), enc.config.max_length))
  ours = enc.encode_tokens(tokens_BxL)
  with torch.no_grad():
    ref = torch_embed_fn(st)(torch.from_numpy(tokens_BxL).long()).numpy()
  return float(np.max(np.abs(ours - ref)))


def random_batch(*, batch: int, length: int, seed: int = 0):
  import numpy as np

  from st5_jax import features
  rng = np.random.default_rng(seed)
  out = {}
  for k in (features.LEFT, features.RIGHT, features.RIGHT_NEG):
    v = rng.integers(3, 32000, size=(batch, length)).astype(np.int32)
    for i, n in enumerate(rng.integers(length // 2, length + 1, size=batch)):  # some padding, as real batches
      v[i, n - 1], v[i, n:] = 1, 0  # EOS, then pad
    out[k] = v
  return out


def time_jax_train(enc, host_batch, *, steps: int) -> dict:
  import jax

  from st5_jax import partitioning, train

  B = next(iter(host_batch.values())).shape[0]
  tc = train.TrainConfig(num_train_steps=steps + 1, global_batch_size=B)
  mesh = partitioning.make_mesh(partitioning.MeshConfig())
  setup = train.build(enc.config, tc, mesh)
  batch = {k: jax.device_put(v, partitioning.batch_sharding(mesh)) for k, v in host_batch.items()}
  with jax.set_mesh(mesh):
    state = train.init_state(setup, enc.config, seed=0, init_params=jax.device_get(enc.params))
    t = time.perf_counter()
    state, m = setup.step_fn(state, batch)
    first_loss = float(jax.device_get(m["loss"]))
    compile_s = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(steps):
      state, m = setup.step_fn(state, batch)
    jax.block_until_ready(m)
    step_s = (time.perf_counter() - t) / steps
  return {"first_loss": first_loss, "first_step_s": compile_s, "step_s": step_s, "examples_per_s": B / step_s}


def time_torch_train(st, host_batch, *, steps: int) -> dict:
  import torch

  from st5_jax import features

  embed = torch_embed_fn(st)
  st.train()
  params = [p for p in st.parameters() if p.requires_grad]
  opt = torch.optim.AdamW(params, lr=1e-4)
  batch = {k: torch.from_numpy(v).long() for k, v in host_batch.items()}
  B = batch[features.LEFT].shape[0]
  labels_B = torch.arange(B)

  def step():
    q_BxD = embed(batch[features.LEFT])
    p_BxD = embed(batch[features.RIGHT])
    n_BxD = embed(batch[features.RIGHT_NEG])
    logits_BxC = q_BxD @ torch.cat([p_BxD, n_BxD]).T * 100.0
    loss = torch.nn.functional.cross_entropy(logits_BxC, labels_B)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return float(loss.detach())

  t = time.perf_counter()
  first_loss = step()
  first_s = time.perf_counter() - t
  t = time.perf_counter()
  for _ in range(steps):
    step()
  step_s = (time.perf_counter() - t) / steps
  st.eval()
  return {"first_loss": first_loss, "first_step_s": first_s, "step_s": step_s, "examples_per_s": B / step_s}


def matmul_peak_flops(n: int = 2048, repeats: int = 10) -> dict:
  """f32 FLOP/s of an n^3 matmul on each side (best of `repeats`); the larger is this machine's peak."""
  import torch

  from st5_jax.commands.bench import best_seconds, matmul_peak

  a = torch.ones(n, n)
  out = {"jax": matmul_peak("float32", n, repeats), "torch": 2 * n ** 3 / best_seconds(lambda: a @ a, repeats)}
  out["peak"] = max(out["jax"], out["torch"])
  return out


def ceiling_train(config, *, batch: int, length: int, peak: float) -> float:
  """Examples/s of a step that ran all its model FLOPs (st5_jax/flops.py) at the matmul peak.

  No f32 implementation of the same step on this machine can be faster: both sides compute
  at least these FLOPs (three towers of `length` tokens, forward and backward).
  """
  from st5_jax.objectives.contrastive import contrastive_step_flops
  lengths = {"inputs": length, "targets": length, "negative_targets": length}
  return batch / (contrastive_step_flops(config, global_batch_size=batch, lengths=lengths) / peak)


def ceiling_encode(enc, texts, *, peak: float) -> float:
  """Sentences/s of an encoder that computed only the real tokens (no padding) at the matmul peak."""
  from st5_jax import flops
  total = sum(flops.encoder_forward_flops(enc.config, len(row)) for row in enc.tokenize(texts))
  return len(texts) / (total / peak)


def time_encode(fn, texts, *, repeats: int) -> tuple[float, "object"]:
  fn(texts)  # warm-up: st5_jax compiles one program per (batch, length) bucket here
  best, out = float("inf"), None
  for _ in range(repeats):
    t = time.perf_counter()
    out = fn(texts)
    best = min(best, time.perf_counter() - t)
  return len(texts) / best, out


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--quick", action="store_true", help="Tiny shapes and few steps (for tests).")
  p.add_argument("--only", choices=["train", "encode", "both"], default="both")
  p.add_argument("--models", default=None, help="Comma-separated model names for both parts (see MODELS).")
  p.add_argument("--batch", type=int, default=None)
  p.add_argument("--length", type=int, default=None)
  p.add_argument("--projection", type=int, default=None)
  p.add_argument("--steps", type=int, default=None, help="Timed train steps after one warm-up step.")
  p.add_argument("--sentences", type=int, default=None, help="Encode only the first N STS-B test sentences (0: all).")
  p.add_argument("--repeats", type=int, default=None, help="Warm encode passes (best is reported).")
  p.add_argument("--max_seq_length", type=int, default=256, help="Encode truncation (public sentence-t5: 256).")
  p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads.")
  p.add_argument("--json", default=None, help="Also write the figures as JSON.")
  args = p.parse_args(argv)
  cfg = dict(QUICK if args.quick else FULL)
  for k in ("batch", "length", "projection", "steps", "sentences", "repeats"):
    if getattr(args, k) is not None:
      cfg[k] = getattr(args, k)
  if args.models:
    names = args.models.split(",")
    unknown = [n for n in names if n not in MODELS]
    if unknown:
      p.error(f"unknown --models {unknown}; known: {', '.join(MODELS)}")
    cfg["train_models"] = cfg["encode_models"] = names

  import warnings

  import torch
  import transformers
  torch.set_num_threads(args.threads)
  transformers.utils.logging.disable_progress_bar()
  warnings.filterwarnings("ignore", category=DeprecationWarning, module="sentence_transformers")
  warnings.filterwarnings("ignore", message=".*sentence_transformers.models.*")
  import jax

  from st5_jax.evaluation import readers

  stsb = readers.read_stsb(split="test")
  texts = stsb.sents1 + stsb.sents2
  if cfg["sentences"]:
    texts = texts[: cfg["sentences"]]
  print(f"# jax {jax.__version__} ({jax.default_backend()}, {jax.device_count()} devices), torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), os.cpu_count {os.cpu_count()}, load average {os.getloadavg()[0]:.2f}")
  print(f"# batch {cfg['batch']}, length {cfg['length']}, projection {cfg['projection']}, "
        f"{len(texts)} STS-B test sentences, GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '')!r}", flush=True)
  peaks = matmul_peak_flops()
  print(f"# f32 2048^3 matmul: jax {peaks['jax'] / 1e9:.1f} GFLOP/s, torch {peaks['torch'] / 1e9:.1f} GFLOP/s; "
        f"ceiling = the work's model FLOPs at {peaks['peak'] / 1e9:.1f} GFLOP/s", flush=True)
  rows = []
  work = pathlib.Path(tempfile.mkdtemp(prefix="st5_compare_torch_"))
  try:
    parts = [("train", n) for n in cfg["train_models"]] if args.only in ("train", "both") else []
    parts += [("encode", n) for n in cfg["encode_models"]] if args.only in ("encode", "both") else []
    for part, name in parts:
      st, enc = build_pair(name, projection=cfg["projection"], max_seq_length=args.max_seq_length, workdir=work)
      diff = agreement(st, enc, texts[:64])
      row = {"part": part, "model": name, "agreement_max_abs_diff": diff}
      if part == "train":
        host = random_batch(batch=cfg["batch"], length=cfg["length"])
        row["jax"] = time_jax_train(enc, host, steps=cfg["steps"])
        row["torch"] = time_torch_train(st, host, steps=cfg["steps"])
        row["first_loss_abs_diff"] = abs(row["jax"]["first_loss"] - row["torch"]["first_loss"])
        row["ratio"] = row["jax"]["examples_per_s"] / row["torch"]["examples_per_s"]
        row["ceiling"] = ceiling_train(enc.config, batch=cfg["batch"], length=cfg["length"], peak=peaks["peak"])
        print(f"train  {name:<14} agreement max|diff| {diff:.2e}  first-step loss jax {row['jax']['first_loss']:.5f} "
              f"torch {row['torch']['first_loss']:.5f}  |  torch {row['torch']['examples_per_s']:.1f} examples/s  "
              f"st5_jax {row['jax']['examples_per_s']:.1f} examples/s  ratio {row['ratio']:.2f}"
              f"  |  ceiling {row['ceiling']:.1f} examples/s = {row['ceiling'] / row['torch']['examples_per_s']:.2f}x torch",
              flush=True)
      else:
        import numpy as np
        torch_sps, ref = time_encode(lambda t: st.encode(t, batch_size=64, convert_to_numpy=True), texts,
                                     repeats=cfg["repeats"])
        jax_sps, ours = time_encode(enc.encode, texts, repeats=cfg["repeats"])
        row.update(torch={"sentences_per_s": torch_sps}, jax={"sentences_per_s": jax_sps},
                   encode_outputs_max_abs_diff=float(np.max(np.abs(ours - ref))), ratio=jax_sps / torch_sps,
                   ceiling=ceiling_encode(enc, texts, peak=peaks["peak"]))
        print(f"encode {name:<14} agreement max|diff| {diff:.2e}  (whole encode outputs {row['encode_outputs_max_abs_diff']:.2e})"
              f"  |  torch {torch_sps:.1f} sentences/s  st5_jax {jax_sps:.1f} sentences/s  ratio {row['ratio']:.2f}"
              f"  |  ceiling {row['ceiling']:.1f} sentences/s = {row['ceiling'] / torch_sps:.2f}x torch", flush=True)
      rows.append(row)
  finally:
    shutil.rmtree(work, ignore_errors=True)
  print(f"# load average after: {os.getloadavg()[0]:.2f}")
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps({"config": cfg, "matmul_peak": peaks, "rows": rows}, indent=2))
  return 0


if __name__ == "__main__":
  sys.exit(main())
