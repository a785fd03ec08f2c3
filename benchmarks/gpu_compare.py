"""st5_jax vs the PyTorch path on one device, same shapes, same model FLOPs: one run, one table.

    python benchmarks/gpu_compare.py                          # T5.1.1 Base and Large, bf16 (GPU)
    python benchmarks/gpu_compare.py --ab                     # + the st5_jax A/B variants, within --budget_s
    python benchmarks/gpu_compare.py --tiny --json out.json   # tiny shapes on this CPU (tests/test_benchmarks_gpu.py)

Train (both sides): T5 encoder, mean pooling, bias-free projection, L2 normalisation,
in-batch softmax over the positives and one hard negative per query at temperature 0.01,
random token batches [batch, length] per tower, dropout 0.
- st5_jax: the real jitted step of `st5_jax.train.build` (Adafactor), as `st5 bench` times it.
- torch: transformers' `T5EncoderModel` (or, without transformers, the torch-only T5 encoder
  below), one call per tower as sentence-transformers' MultipleNegativesRankingLoss makes them,
  bf16 autocast on CUDA, `torch.compile` where CUDA is (--torch_compile), fused AdamW on CUDA
  (or transformers' Adafactor: --torch_optimizer adafactor).
Encode (both sides): the STS-B test sentences ($ST5_DATA_DIR/stsb/original/sts-test.csv, read
as st5_jax.evaluation.readers.read_stsb reads it), tokenised by the same SentencePiece model,
truncated to --length, batches of 64: `SentenceEncoder.encode` vs length-sorted torch batches
under `inference_mode` (eager: each batch has its own length).

Model FLOPs (st5_jax/flops.py; no remat, padding counted for train, only real tokens for
encode) are computed on each side from its own model's shapes; TFLOP/s = model FLOPs / time,
MFU = that / the device's dense bf16 peak (PEAKS; n/a on CPU). Each measurement runs in its
own subprocess, so JAX and torch each have the whole device, and XLA flags (read once, at
backend init) differ per A/B variant. Figures only, no assertions.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("ST5_DATA_DIR", str(REPO.parent / "shared" / "data"))
os.environ.setdefault("ST5_VOCAB", str(pathlib.Path(os.environ["ST5_DATA_DIR"]) / "t5_spiece" / "spiece.model"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

# Dense (no sparsity) bf16 tensor-core peaks, TFLOP/s, from the vendors' data sheets (as gpu.sh).
PEAKS = [("H200", 989.0), ("H100 SXM", 989.0), ("H100 80GB HBM3", 989.0), ("H100 NVL", 835.0),
         ("H100 PCIe", 756.0), ("H100", 989.0), ("GH200", 989.0), ("B200", 2250.0), ("A100", 312.0),
         ("A10G", 70.0), ("A10", 125.0), ("L40S", 362.0), ("L4", 121.0), ("V100", 125.0)]

GPU_DEFAULTS = dict(sizes="t5_1_1_base,t5_1_1_large", batch=256, length=128, projection=768, steps=20,
                    time_s=8.0, dtype="bfloat16", sentences=0, budget_s=450.0)
TINY_DEFAULTS = dict(sizes="t5_1_1_tiny", batch=8, length=16, projection=32, steps=2, time_s=2.0,
                     dtype="float32", sentences=128, budget_s=300.0)

# st5_jax A/B knobs: name -> what changes from the base step (no scan, no remat, merged towers,
# einsum attention, a device-resident batch: `st5 bench`'s defaults). Combine with '+'.
VARIANTS = {
    "base": {},
    "scan_full": dict(scan=True, remat="full"),
    "scan_dots": dict(scan=True, remat="dots"),
    "scan_dots_no_batch": dict(scan=True, remat="dots_with_no_batch_dims"),
    "remat_dots": dict(remat="dots"),
    "batch512": dict(batch=512),
    "batch1024": dict(batch=1024),
    "xla_lhs": dict(xla_flags=["--xla_gpu_enable_latency_hiding_scheduler=true"]),
    "xla_triton_gemm_off": dict(xla_flags=["--xla_gpu_enable_triton_gemm=false"]),
    "xla_cublaslt": dict(xla_flags=["--xla_gpu_enable_cublaslt=true"]),
    "xla_cmdbuf_off": dict(xla_flags=["--xla_gpu_enable_command_buffer="]),
    "attn_xla": dict(attention="xla"),
    "attn_cudnn": dict(attention="cudnn"),
    "towers_separate": dict(merged=False),
    "input_host_sync": dict(input="host_sync"),
    "input_host_prefetch": dict(input="host_prefetch"),
}
# --ab: in this order (most promising first), until the budget is spent.
AB_ORDER = ["scan_dots", "batch512", "attn_cudnn", "xla_lhs", "batch1024", "scan_full", "attn_xla",
            "xla_triton_gemm_off", "xla_cmdbuf_off", "towers_separate", "input_host_prefetch",
            "input_host_sync", "scan_dots_no_batch", "xla_cublaslt"]
TEMPERATURE = 0.01
TORCH_IMPL_NAMES = {"transformers": "transformers T5EncoderModel", "torch_only": "torch-only T5 encoder"}


def variant_spec(name: str) -> dict:
  """'scan_dots+batch512' -> the merged knob dict (later names win)."""
  spec: dict = {"xla_flags": []}
  for part in name.split("+"):
    if part not in VARIANTS:
      raise ValueError(f"unknown variant {part!r}; known: {', '.join(VARIANTS)}")
    for k, v in VARIANTS[part].items():
      spec[k] = spec[k] + v if k == "xla_flags" else v
  return spec


def peak_flops(device_name: str, backend: str) -> tuple[float | None, str]:
  """(dense bf16 peak FLOP/s, where it comes from); None on CPU or an unknown GPU."""
  if os.environ.get("ST5_GPU_PEAK_TFLOPS"):
    return float(os.environ["ST5_GPU_PEAK_TFLOPS"]) * 1e12, "ST5_GPU_PEAK_TFLOPS"
  if backend != "gpu":
    return None, f"no peak on {backend}: MFU n/a"
  for key, tflops in PEAKS:
    if key.lower() in device_name.lower():
      return tflops * 1e12, f"{key} data sheet, {tflops:g} TFLOP/s dense bf16"
  return None, f"{device_name}: no data-sheet peak known (set ST5_GPU_PEAK_TFLOPS)"


def stsb_texts(limit: int) -> list[str]:
  from st5_jax.evaluation import readers
  stsb = readers.read_stsb(split="test")
  texts = stsb.sents1 + stsb.sents2
  return texts[:limit] if limit else texts


def st5_config(size: str, *, dtype: str, projection: int, length: int, scan: bool = False, remat: str = "none"):
  from st5_jax import configs
  return configs.ST5Config(t5=configs.t5_size(size, dtype=dtype, dropout_rate=0.0, scan_layers=scan,
                                              remat_policy=remat),
                           pooling="enc_mean", embedding_dim=projection, max_length=length)


def lengths_of(length: int) -> dict[str, int]:
  return {"inputs": length, "targets": length, "negative_targets": length}


def encode_flops(config, rows) -> float:
  """Model FLOPs of encoding token rows: only their real tokens (padding is each side's own cost)."""
  from st5_jax import flops
  return sum(flops.encoder_forward_flops(config, len(r)) for r in rows)


def random_host_batch(batch: int, length: int, seed: int = 0) -> dict:
  """Tokens per tower, EOS-terminated, no padding (as `st5 bench`)."""
  import numpy as np

  from st5_jax import features
  from st5_jax.commands import bench
  return bench.token_batch(batch, length, (features.LEFT, features.RIGHT, features.RIGHT_NEG),
                           np.random.default_rng(seed))


def init_numpy_params(config, seed: int = 0):
  """Unboxed numpy parameters of an unscanned fresh model (the weights both sides load)."""
  import flax.linen as nn
  import jax

  from st5_jax.model import st5
  return jax.device_get(nn.unbox(st5.init_params(config, jax.random.PRNGKey(seed))))


def timed_loop(step, *, steps: int, time_s: float, sync) -> tuple[int, float]:
  """(timed steps, seconds per step): one more warm step sizes the loop to `time_s`, at most `steps`."""
  t = time.perf_counter()
  sync(step())
  est = time.perf_counter() - t
  n = max(2, min(steps, int(time_s / max(est, 1e-6))))
  t = time.perf_counter()
  out = None
  for _ in range(n):
    out = step()
  sync(out)
  return n, (time.perf_counter() - t) / n


# ------------------------------------------------------------------------------ JAX worker


def separate_towers(embed, params, tokens, key):
  """One forward per tower: the A/B against embed_towers' merged forward."""
  import jax
  keys = jax.random.split(key, len(tokens))
  return {side: embed(params, t, k) for (side, t), k in zip(tokens.items(), keys)}


def jax_worker(spec: dict) -> dict:
  import flax
  import jax
  import jaxlib
  import optax

  from st5_jax import partitioning, paths, train, vocab
  from st5_jax.encoder import SentenceEncoder
  from st5_jax.model import t5 as t5_model
  from st5_jax.objectives import contrastive

  v = spec["variant_spec"]
  t5_model.set_attention_impl(v.get("attention", "einsum"))
  if not v.get("merged", True):
    contrastive.embed_towers = separate_towers  # looked up at trace time by Contrastive's loss_fn
  batch_size, length = v.get("batch", spec["batch"]), spec["length"]
  model = st5_config(spec["size"], dtype=spec["dtype"], projection=spec["projection"], length=length,
                     scan=v.get("scan", False), remat=v.get("remat", "none"))
  tc = train.TrainConfig(num_train_steps=spec["steps"] + 2, global_batch_size=batch_size)
  mesh = partitioning.make_mesh(partitioning.MeshConfig())
  setup = train.build(model, tc, mesh)
  shard = partitioning.batch_sharding(mesh)
  # Host inputs: 4 distinct batches cycled, so a transfer is never a cache hit.
  hosts = [random_host_batch(batch_size, length, seed=i) for i in range(4)]
  step_flops = setup.objective.step_flops(model, global_batch_size=batch_size, lengths=lengths_of(length))
  init = init_numpy_params(model) if spec.get("same_weights") and not model.t5.scan_layers else None
  mode = v.get("input", "resident")
  out = {"side": "st5_jax", "variant": spec["variant"], "size": spec["size"], "batch": batch_size,
         "length": length, "towers": 3, "dtype": spec["dtype"], "input": mode,
         "attention": v.get("attention", "einsum"), "scan": model.t5.scan_layers, "remat": model.t5.remat_policy,
         "xla_flags": os.environ.get("XLA_FLAGS", ""), "backend": jax.default_backend(),
         "device": jax.devices()[0].device_kind, "devices": jax.device_count(),
         "versions": {"jax": jax.__version__, "jaxlib": jaxlib.__version__, "flax": flax.__version__,
                      "optax": optax.__version__,
                      # e.g. the CUDA version XLA runs on; "cpu" on a CPU (then left out of the table)
                      "xla_platform": jax.devices()[0].client.platform_version},
         "step_flops": step_flops, "flops_per_example": step_flops / batch_size}
  with jax.set_mesh(mesh):
    state = train.init_state(setup, model, seed=0, init_params=init)
    put = lambda i: {k: jax.device_put(a, shard) for k, a in hosts[i % 4].items()}
    resident = put(0)
    t = time.perf_counter()
    state, m = setup.step_fn(state, resident)
    out["first_loss"] = float(jax.device_get(m["loss"]))
    out["first_step_s"] = time.perf_counter() - t
    box = {"state": state, "i": 0, "queue": [put(1), put(2)]}

    def step():
      box["i"] += 1
      if mode == "resident":
        b = resident
      elif mode == "host_sync":  # transfer, then compute: nothing overlaps the copy
        b = jax.block_until_ready(put(box["i"]))
      else:  # host_prefetch: the copy for two steps ahead is issued before this step runs
        box["queue"].append(put(box["i"] + 2))
        b = box["queue"].pop(0)
      box["state"], metrics = setup.step_fn(box["state"], b)
      if mode == "host_sync":
        jax.block_until_ready(metrics)
      return metrics

    n, step_s = timed_loop(step, steps=spec["steps"], time_s=spec["time_s"], sync=jax.block_until_ready)
  out.update(timed_steps=n, step_s=step_s, examples_per_s=batch_size / step_s,
             flops_per_s=step_flops / step_s)

  if spec.get("encode"):
    texts = stsb_texts(spec["sentences"])
    enc = SentenceEncoder(model, jax.device_get(box["state"].params), tokenizer=vocab.Tokenizer(paths.vocab_path()),
                          max_batch_size=64)
    rows = enc.tokenizer.encode(texts, max_length=length)
    enc.encode(texts)  # compile every (batch, length) bucket
    best = float("inf")
    for _ in range(spec.get("encode_repeats", 2)):
      t = time.perf_counter()
      enc.encode(texts)
      best = min(best, time.perf_counter() - t)
    f = encode_flops(model, rows)
    out["encode"] = {"sentences": len(texts), "sentences_per_s": len(texts) / best, "flops": f,
                     "flops_per_s": f / best, "flops_per_sentence": f / len(texts)}
  return out


# ------------------------------------------------------------------------------ torch side


def torch_t5_encoder_class():
  """TorchT5Encoder: T5 1.0 / T5.1.1 encoder with torch alone, state-dict keys as transformers' T5EncoderModel.

  Relative position buckets shared by all layers (bias table in block 0), RMS norm
  (float32 variance, no mean, no bias), ReLU or gated-GELU (tanh) MLP, no logit scaling:
  the math of st5_jax/model/t5.py and transformers' modeling_t5. Attention is
  F.scaled_dot_product_attention with the bias as a float mask (scale 1).
  """
  import torch
  from torch import nn
  from torch.nn import functional as F

  acts = {"relu": F.relu, "gelu": lambda x: F.gelu(x, approximate="tanh"), "gelu_exact": F.gelu, "silu": F.silu,
          "linear": lambda x: x}

  class RMSNorm(nn.Module):
    def __init__(self, d, eps):
      super().__init__()
      self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
      var = x.float().pow(2).mean(-1, keepdim=True)
      return self.weight * (x.float() * torch.rsqrt(var + self.eps))  # float32, as transformers' T5LayerNorm

  class Attention(nn.Module):
    def __init__(self, c, has_bias_table):
      super().__init__()
      inner = c["num_heads"] * c["d_kv"]
      self.q, self.k, self.v = (nn.Linear(c["d_model"], inner, bias=False) for _ in range(3))
      self.o = nn.Linear(inner, c["d_model"], bias=False)
      self.h, self.dk = c["num_heads"], c["d_kv"]
      if has_bias_table:
        self.relative_attention_bias = nn.Embedding(c["relative_attention_num_buckets"], c["num_heads"])

    def forward(self, x_BxLxD, bias_BxHxLxL):
      B, L, _ = x_BxLxD.shape
      split = lambda t: t.view(B, L, self.h, self.dk).transpose(1, 2)
      q, k, v = split(self.q(x_BxLxD)), split(self.k(x_BxLxD)), split(self.v(x_BxLxD))
      out_BxHxLxK = F.scaled_dot_product_attention(q, k, v, attn_mask=bias_BxHxLxL.to(q.dtype), scale=1.0)
      return self.o(out_BxHxLxK.transpose(1, 2).reshape(B, L, self.h * self.dk))

  class SelfAttentionLayer(nn.Module):
    def __init__(self, c, first):
      super().__init__()
      self.SelfAttention = Attention(c, first)
      self.layer_norm = RMSNorm(c["d_model"], c["layer_norm_epsilon"])

  class Mlp(nn.Module):
    def __init__(self, c):
      super().__init__()
      proj = c["feed_forward_proj"]
      self.gated = proj.startswith("gated-")
      act = proj.split("-")[-1]
      # transformers: "gated-gelu" and "gelu_new" are the tanh approximation, plain "gelu" is exact.
      self.act = acts["gelu_exact" if act == "gelu" and not self.gated else "gelu" if act == "gelu_new" else act]
      if self.gated:
        self.wi_0 = nn.Linear(c["d_model"], c["d_ff"], bias=False)
        self.wi_1 = nn.Linear(c["d_model"], c["d_ff"], bias=False)
      else:
        self.wi = nn.Linear(c["d_model"], c["d_ff"], bias=False)
      self.wo = nn.Linear(c["d_ff"], c["d_model"], bias=False)

    def forward(self, x):
      h = self.act(self.wi_0(x)) * self.wi_1(x) if self.gated else self.act(self.wi(x))
      return self.wo(h)

  class FFLayer(nn.Module):
    def __init__(self, c):
      super().__init__()
      self.DenseReluDense = Mlp(c)
      self.layer_norm = RMSNorm(c["d_model"], c["layer_norm_epsilon"])

  class Block(nn.Module):
    def __init__(self, c, first):
      super().__init__()
      self.layer = nn.ModuleList([SelfAttentionLayer(c, first), FFLayer(c)])

    def forward(self, x, bias):
      attn, ff = self.layer
      x = x + attn.SelfAttention(attn.layer_norm(x), bias)
      return x + ff.DenseReluDense(ff.layer_norm(x))

  class Stack(nn.Module):
    def __init__(self, c, shared):
      super().__init__()
      self.embed_tokens = shared
      self.block = nn.ModuleList([Block(c, i == 0) for i in range(c["num_layers"])])
      self.final_layer_norm = RMSNorm(c["d_model"], c["layer_norm_epsilon"])

  class TorchT5Encoder(nn.Module):
    def __init__(self, c: dict):
      super().__init__()
      self.c = dict(c)
      self.shared = nn.Embedding(c["vocab_size"], c["d_model"])
      self.encoder = Stack(c, self.shared)

    def buckets(self, L: int, device) -> "torch.Tensor":
      """Bidirectional bucket ids [L, L] of key-minus-query offsets (half exact, half log-spaced)."""
      c = self.c
      rel_LxL = torch.arange(L, device=device)[None, :] - torch.arange(L, device=device)[:, None]
      nb = c["relative_attention_num_buckets"] // 2
      out = (rel_LxL > 0).long() * nb
      n = rel_LxL.abs()
      max_exact = nb // 2
      scaled = (torch.log(n.clamp(min=1).float() / max_exact) / math.log(c["relative_attention_max_distance"] / max_exact)
                * (nb - max_exact))
      large = torch.clamp(max_exact + scaled.long(), max=nb - 1)
      return out + torch.where(n < max_exact, n, large)

    def forward(self, input_ids, attention_mask):
      enc = self.encoder
      B, L = input_ids.shape
      table = enc.block[0].layer[0].SelfAttention.relative_attention_bias
      pos_1xHxLxL = table(self.buckets(L, input_ids.device)).permute(2, 0, 1)[None].float()
      # Keys only are masked (as transformers and st5_jax): padded query rows stay finite.
      mask_Bx1x1xL = (1.0 - attention_mask[:, None, None, :].float()) * -1e10
      bias_BxHxLxL = pos_1xHxLxL + mask_Bx1x1xL
      x = enc.embed_tokens(input_ids)
      for block in enc.block:
        x = block(x, bias_BxHxLxL)
      return enc.final_layer_norm(x)

  return TorchT5Encoder


def build_torch_tower(t5_cfg, *, projection: int, impl: str):
  """(encoder, projection Linear, impl used): 'transformers' T5EncoderModel or the torch-only encoder."""
  import torch

  from st5_jax.checkpoints import hf
  c = hf.hf_config_from_t5(t5_cfg, encoder_only=True)
  c.update(dropout_rate=0.0)
  if impl == "transformers":
    import transformers
    enc = transformers.T5EncoderModel(transformers.T5Config(**c))
  else:
    enc = torch_t5_encoder_class()(c)
  return enc, torch.nn.Linear(t5_cfg.emb_dim, projection, bias=False)


def load_jax_weights(enc, proj, params) -> None:
  """st5_jax's (unscanned) parameters into the torch tower, via the project's HF name mapping."""
  import numpy as np
  import torch

  from st5_jax.checkpoints import hf, tree
  flat = tree.flatten(params)
  sd = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in hf.to_hf_state_dict(flat).items()}
  missing, unexpected = enc.load_state_dict(sd, strict=False)
  missing = [k for k in missing if k != "encoder.embed_tokens.weight"]  # tied to shared
  if missing or unexpected:
    raise ValueError(f"weights do not fit the torch encoder: missing {missing}, unexpected {unexpected}")
  with torch.no_grad():
    proj.weight.copy_(torch.from_numpy(np.asarray(flat["projection_layer/kernel"]).T.copy()))


def torch_model_t5_config(enc):
  """The T5Config of a built torch encoder, read from the module itself (for its model FLOPs)."""
  from st5_jax.checkpoints import hf
  c = enc.c if hasattr(enc, "c") else enc.config.to_dict()
  return hf.t5_config_from_hf(c)


def torch_worker(spec: dict) -> dict:
  import torch
  from torch.nn import functional as F

  from st5_jax import configs, features, paths, vocab
  from st5_jax.objectives.contrastive import contrastive_step_flops

  cuda = torch.cuda.is_available()
  dev = torch.device("cuda" if cuda else "cpu")
  if spec.get("torch_threads"):
    torch.set_num_threads(spec["torch_threads"])
  impl = spec["torch_impl"]
  try:
    import transformers
    have_tf = True
  except ImportError:
    transformers, have_tf = None, False
  if impl == "auto":
    impl = "transformers" if have_tf else "torch_only"
  bf16 = spec["dtype"] == "bfloat16"
  amp = dict(device_type=dev.type, dtype=torch.bfloat16, enabled=bf16)
  batch_size, length = spec["batch"], spec["length"]
  jax_cfg = st5_config(spec["size"], dtype="float32", projection=spec["projection"], length=length)
  enc, proj = build_torch_tower(jax_cfg.t5, projection=spec["projection"], impl=impl)
  if spec.get("same_weights"):
    load_jax_weights(enc, proj, init_numpy_params(jax_cfg))
  enc, proj = enc.to(dev).train(), proj.to(dev).train()
  # Model FLOPs from the torch model's own shapes (not the st5_jax config it was built from).
  own = configs.ST5Config(t5=torch_model_t5_config(enc), pooling="enc_mean", embedding_dim=proj.out_features,
                          max_length=length)
  step_flops = contrastive_step_flops(own, global_batch_size=batch_size, lengths=lengths_of(length))

  def hidden(tokens_BxL, mask_BxL):
    if impl == "transformers":
      return enc(input_ids=tokens_BxL, attention_mask=mask_BxL.long()).last_hidden_state
    return enc(tokens_BxL, mask_BxL.long())

  def tower(tokens_BxL):
    mask_BxL = tokens_BxL > 0
    h_BxLxD = hidden(tokens_BxL, mask_BxL)
    m = mask_BxL.unsqueeze(-1).float()
    pooled_BxD = (h_BxLxD.float() * m).sum(1) / m.sum(1).clamp(min=1e-9)
    with torch.autocast(dev.type, enabled=False):  # projection and norm in float32, as st5_jax
      return F.normalize(proj(pooled_BxD), dim=-1)

  compile_on = spec["torch_compile"] == "on" or (spec["torch_compile"] == "auto" and cuda)
  compile_on = compile_on and hasattr(torch, "compile")
  train_tower = torch.compile(tower) if compile_on else tower
  params = list(enc.parameters()) + list(proj.parameters())
  if spec["torch_optimizer"] == "adafactor":
    if not have_tf:
      raise RuntimeError("--torch_optimizer adafactor needs transformers")
    opt = transformers.optimization.Adafactor(params, lr=1e-3, scale_parameter=False, relative_step=False,
                                              warmup_init=False)
    opt_name = "Adafactor (transformers)"
  else:
    fused = cuda  # fused AdamW kernels are CUDA's; foreach elsewhere
    opt = torch.optim.AdamW(params, lr=1e-4, fused=fused) if fused else torch.optim.AdamW(params, lr=1e-4,
                                                                                        foreach=True)
    opt_name = "AdamW (fused)" if fused else "AdamW (foreach)"
  host = random_host_batch(batch_size, length)
  batch = {k: torch.from_numpy(v).long().to(dev) for k, v in host.items()}
  labels_B = torch.arange(batch_size, device=dev)

  def step():
    with torch.autocast(**amp):
      q_BxP = train_tower(batch[features.LEFT])
      p_BxP = train_tower(batch[features.RIGHT])
      n_BxP = train_tower(batch[features.RIGHT_NEG])
    logits_Bx2B = q_BxP.float() @ torch.cat([p_BxP, n_BxP]).float().T / TEMPERATURE
    loss = F.cross_entropy(logits_Bx2B, labels_B)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.detach()

  sync = (lambda x: (torch.cuda.synchronize(), x)[1]) if cuda else (lambda x: x)
  out = {"side": "torch", "impl": impl, "compile": compile_on, "optimizer": opt_name, "size": spec["size"],
         "batch": batch_size, "length": length, "towers": 3, "dtype": spec["dtype"],
         "autocast_bf16": bf16, "device": torch.cuda.get_device_name(0) if cuda else "cpu",
         "versions": {"torch": torch.__version__, "torch_cuda": torch.version.cuda,
                      "cudnn": torch.backends.cudnn.version() if cuda else None,
                      "transformers": transformers.__version__ if have_tf else None},
         "step_flops": step_flops, "flops_per_example": step_flops / batch_size}
  t = time.perf_counter()
  out["first_loss"] = float(sync(step()))
  out["first_step_s"] = time.perf_counter() - t
  if spec.get("count_flops"):  # FLOPs torch itself counts in one step (matmuls, forward + backward)
    from torch.utils.flop_counter import FlopCounterMode
    counter = FlopCounterMode(display=False)
    with counter:
      step()
    out["counted_step_flops"] = float(counter.get_total_flops())
  n, step_s = timed_loop(step, steps=spec["steps"], time_s=spec["time_s"], sync=sync)
  out.update(timed_steps=n, step_s=step_s, examples_per_s=batch_size / step_s, flops_per_s=step_flops / step_s)

  if spec.get("encode"):
    texts = stsb_texts(spec["sentences"])
    tok = vocab.Tokenizer(paths.vocab_path())
    enc.eval()

    def encode_all():
      rows = tok.encode(texts, max_length=length)  # tokenising is timed on both sides
      order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
      out_NxP = torch.empty(len(rows), proj.out_features)
      with torch.inference_mode(), torch.autocast(**amp):
        for s in range(0, len(order), 64):
          idx = order[s:s + 64]
          tokens_BxL = torch.from_numpy(vocab.pad_batch([rows[i] for i in idx], len(rows[idx[0]]))).long().to(dev)
          out_NxP[idx] = tower(tokens_BxL).float().cpu()
      return rows, out_NxP

    rows, _ = encode_all()  # warm-up (cuBLAS handles, allocator)
    best = float("inf")
    for _ in range(spec.get("encode_repeats", 2)):
      t = time.perf_counter()
      encode_all()
      best = min(best, time.perf_counter() - t)
    f = encode_flops(own, rows)
    out["encode"] = {"sentences": len(texts), "sentences_per_s": len(texts) / best, "flops": f,
                     "flops_per_s": f / best, "flops_per_sentence": f / len(texts)}
  return out


# ------------------------------------------------------------------------------ orchestration


def start_worker(kind: str, spec: dict, *, env_extra: dict, workdir: pathlib.Path):
  """One measurement in its own process: (Popen, result path)."""
  out = workdir / f"{kind}_{len(list(workdir.iterdir()))}.json"
  cmd = [sys.executable, __file__, "--_worker", kind, "--_spec", json.dumps(spec), "--_out", str(out)]
  proc = subprocess.Popen(cmd, env=dict(os.environ, **env_extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
  out.touch()  # reserves the name; the worker overwrites it
  return proc, out, time.perf_counter()


def finish_worker(handle, *, timeout_s: float) -> dict:
  """The worker's figures; {'error': ...} when it fails or runs past `timeout_s`."""
  proc, out, t = handle
  try:
    _, stderr = proc.communicate(timeout=max(timeout_s, 1.0))
  except subprocess.TimeoutExpired:
    proc.kill()
    proc.communicate()
    return {"error": f"timed out after {time.perf_counter() - t:.0f} s (budget)", "wall_s": time.perf_counter() - t}
  if proc.returncode != 0 or not out.read_text():
    tail = stderr.strip().splitlines()[-6:]
    return {"error": f"exit {proc.returncode}: " + " | ".join(tail), "wall_s": time.perf_counter() - t}
  res = json.loads(out.read_text())
  res["wall_s"] = time.perf_counter() - t
  return res


def collect(kind, size, variant, handle, order, *, budget_left: float, walls: dict) -> dict:
  res = finish_worker(handle, timeout_s=budget_left)
  res["plan_index"] = order
  res.setdefault("side", "st5_jax" if kind == "jax" else "torch")
  res.setdefault("size", size)
  res.setdefault("variant" if kind == "jax" else "impl", variant)
  walls[(kind, size)] = max(walls.get((kind, size), 0.0), res["wall_s"])
  status = res.get("error") or f"{res['examples_per_s']:.1f} examples/s"
  print(f"# {kind:<5} {size:<14} {variant}: {status} ({res['wall_s']:.0f} s)", flush=True)
  return res


def gpu_info() -> dict:
  """GPU name and driver from nvidia-smi ({} without one)."""
  try:
    line = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                          capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
    name, driver = [s.strip() for s in line.split(",")[:2]]
    return {"name": name, "driver": driver}
  except (OSError, IndexError, ValueError, subprocess.SubprocessError):
    return {}


def fmt_rate(x) -> str:
  return f"{x:,.1f}" if isinstance(x, (int, float)) else "-"


def table(result: dict) -> str:
  """The one table: a row per (size, part, side/variant)."""
  peak = result["peak_flops"]
  w = max([len(r["label"]) for r in result["rows"]] + [20])
  head = (f"{'size':<14} {'part':<7} {'side':<{w}} {'per s':>11} {'TFLOP/s':>9} {'MFU':>7} "
          f"{'GFLOP/ex':>10} {'st5_jax/torch':>13}")
  lines = [head, "-" * len(head)]
  for r in result["rows"]:
    if "error" in r:
      lines.append(f"{r['size']:<14} {r['part']:<7} {r['label']:<{w}} {r['error'][:120]}")
      continue
    mfu = f"{r['flops_per_s'] / peak:7.1%}" if peak else f"{'n/a':>7}"
    ratio = f"{r['ratio']:13.2f}" if r.get("ratio") is not None else f"{'-':>13}"
    lines.append(f"{r['size']:<14} {r['part']:<7} {r['label']:<{w}} {fmt_rate(r['per_s']):>11} "
                 f"{r['flops_per_s'] / 1e12:9.4f} {mfu} {r['flops_per_item'] / 1e9:10.4f} {ratio}")
  return "\n".join(lines)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--tiny", action="store_true", help="Tiny shapes on this CPU (the test suite's run).")
  p.add_argument("--sizes", default=None, help="Comma-separated st5_jax sizes (default: T5.1.1 Base, Large).")
  p.add_argument("--batch", type=int, default=None)
  p.add_argument("--length", type=int, default=None)
  p.add_argument("--projection", type=int, default=None)
  p.add_argument("--steps", type=int, default=None, help="Most timed train steps per measurement.")
  p.add_argument("--time_s", type=float, default=None, help="Timed seconds per measurement (fewer steps if slow).")
  p.add_argument("--dtype", default=None, help="bfloat16 (GPU default) or float32 (--tiny).")
  p.add_argument("--sentences", type=int, default=None, help="First N STS-B test sentences (0: all 2,758).")
  p.add_argument("--budget_s", type=float, default=None,
                 help="Wall-clock budget of the whole run; measurements that would not fit are skipped.")
  p.add_argument("--variants", default="base",
                 help=f"st5_jax variants, comma-separated, '+' combines (known: {', '.join(VARIANTS)}).")
  p.add_argument("--ab", action="store_true", help="Also every A/B variant (AB_ORDER) on --ab_size, budget allowing.")
  p.add_argument("--ab_size", default=None, help="Size of the A/B variants (default: the first of --sizes).")
  p.add_argument("--torch_impl", default="auto",
                 help="auto (transformers if installed, else torch_only), transformers, torch_only, or a comma list "
                      "(one torch row each; the first is the ratio's).")
  p.add_argument("--torch_threads", type=int, default=None,
                 help="torch.set_num_threads on CPU (--tiny: 1: OpenMP barriers stall for seconds on a shared CPU).")
  p.add_argument("--parallel", action="store_true",
                 help="Run the measurements at the same time (CPU smoke test only: they share the cores).")
  p.add_argument("--torch_compile", choices=["auto", "on", "off"], default="auto", help="auto: on with CUDA.")
  p.add_argument("--torch_optimizer", choices=["adamw", "adafactor"], default="adamw")
  p.add_argument("--no_torch", action="store_true")
  p.add_argument("--no_encode", action="store_true")
  p.add_argument("--same_weights", action="store_true",
                 help="Both sides start from the same weights (first-step losses comparable); default with --tiny.")
  p.add_argument("--count_flops", action="store_true", help="Also count the torch step's FLOPs (FlopCounterMode).")
  p.add_argument("--json", default=None)
  p.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
  p.add_argument("--_spec", default=None, help=argparse.SUPPRESS)
  p.add_argument("--_out", default=None, help=argparse.SUPPRESS)
  args = p.parse_args(argv)

  if args._worker:
    spec = json.loads(args._spec)
    res = jax_worker(spec) if args._worker == "jax" else torch_worker(spec)
    pathlib.Path(args._out).write_text(json.dumps(res))
    return 0

  t_start = time.perf_counter()
  gpu = {} if args.tiny else gpu_info()
  cfg = dict(TINY_DEFAULTS if args.tiny or not gpu else GPU_DEFAULTS)
  if not args.tiny and not gpu:
    print("# gpu_compare: no NVIDIA GPU (nvidia-smi); tiny shapes on the CPU instead", file=sys.stderr)
  for k in ("sizes", "batch", "length", "projection", "steps", "time_s", "dtype", "sentences", "budget_s"):
    if getattr(args, k) is not None:
      cfg[k] = getattr(args, k)
  on_gpu = bool(gpu)
  same_weights = args.same_weights or not on_gpu
  sizes = cfg["sizes"].split(",")
  variants = args.variants.split(",")
  for v in variants:
    variant_spec(v)  # unknown names fail here, before anything runs
  have_torch = True
  try:
    import importlib.util
    have_torch = importlib.util.find_spec("torch") is not None
    have_tf = importlib.util.find_spec("transformers") is not None
  except ValueError:
    have_tf = False
  impls = args.torch_impl.split(",")
  if any(i not in ("auto", "transformers", "torch_only") for i in impls):
    p.error(f"--torch_impl: auto, transformers or torch_only, got {args.torch_impl!r}")
  if "transformers" in impls and not have_tf:
    p.error("--torch_impl transformers: transformers is not installed")
  torch_threads = args.torch_threads or (1 if not on_gpu else None)
  if not have_torch and not args.no_torch:
    print("# gpu_compare: torch is not installed; st5_jax only", file=sys.stderr)
  # Workers: JAX sees only the device; torch's worker runs JAX on the CPU (weights, FLOPs) so
  # that JAX does not preallocate the GPU memory torch needs.
  jax_env = {} if on_gpu else {"JAX_PLATFORMS": "cpu"}
  torch_env = {"JAX_PLATFORMS": "cpu"} if on_gpu else {"JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": ""}
  base = {k: cfg[k] for k in ("batch", "length", "projection", "steps", "time_s", "dtype", "sentences")}
  base.update(same_weights=same_weights)
  plan = []  # (kind, size, variant, encode)
  for size in sizes:
    for v in variants:
      plan.append(("jax", size, v, v == variants[0] and not args.no_encode))
    if have_torch and not args.no_torch:
      plan += [("torch", size, impl, not args.no_encode) for impl in impls]
  if args.ab:
    ab_size = args.ab_size or sizes[0]
    plan += [("jax", ab_size, v, False) for v in AB_ORDER if v not in variants]
  results, skipped, walls = [], [], {}
  with tempfile.TemporaryDirectory(prefix="st5_gpu_compare_") as tmp:
    running = []
    for order, (kind, size, variant, encode) in enumerate(plan):
      left = cfg["budget_s"] - (time.perf_counter() - t_start)
      est = walls.get((kind, size), 0.0)
      if left < max(est, 5.0):
        skipped.append({"kind": kind, "size": size, "variant": variant, "why": f"budget ({left:.0f} s left)"})
        print(f"# skipped {kind} {size} {variant}: {left:.0f} s of the budget left, ~{est:.0f} s needed", flush=True)
        continue
      spec = dict(base, size=size, encode=encode)
      if kind == "jax":
        vs = variant_spec(variant)
        spec.update(variant=variant, variant_spec=vs)
        env = dict(jax_env)
        if vs["xla_flags"]:
          env["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", "")] + vs["xla_flags"]).strip()
      else:
        spec.update(torch_impl=variant, torch_compile=args.torch_compile, torch_optimizer=args.torch_optimizer,
                    count_flops=args.count_flops, torch_threads=torch_threads)
        env = dict(torch_env)
      running.append((kind, size, variant, start_worker(kind, spec, env_extra=env, workdir=pathlib.Path(tmp)), order))
      if args.parallel:
        continue
      results.append(collect(*running.pop(), budget_left=left, walls=walls))
    while running:  # --parallel: collect each as it ends, so its wall time is its own
      done = [item for item in running if item[3][0].poll() is not None]
      if not done and time.perf_counter() - t_start < cfg["budget_s"]:
        time.sleep(0.2)
        continue
      for item in done or running:
        running.remove(item)
        results.append(collect(*item, budget_left=cfg["budget_s"] - (time.perf_counter() - t_start), walls=walls))
    results.sort(key=lambda r: r["plan_index"])  # rows in plan order, however the workers ended

  # Device, versions, peak.
  jax_ok = [r for r in results if r["side"] == "st5_jax" and "error" not in r]
  torch_ok = [r for r in results if r["side"] == "torch" and "error" not in r]
  backend = jax_ok[0]["backend"] if jax_ok else ("gpu" if on_gpu else "cpu")
  device = gpu.get("name") or (jax_ok[0]["device"] if jax_ok else "cpu")
  peak, peak_source = peak_flops(device, backend)
  versions = {"python": sys.version.split()[0]}
  if jax_ok:
    versions.update({k: v for k, v in jax_ok[0]["versions"].items() if v and v != "cpu"})
  if torch_ok:
    versions.update({k: v for k, v in torch_ok[0]["versions"].items() if v is not None})
  if gpu.get("driver"):
    versions["nvidia_driver"] = gpu["driver"]

  rows = []
  for size in sizes + ([args.ab_size or sizes[0]] if args.ab else []):
    if any(r["size"] == size for r in rows):
      continue
    t_rows = [r for r in results if r["side"] == "torch" and r["size"] == size]
    t_row = t_rows[0] if t_rows else None
    for part in ("train", "encode"):
      torch_rate = None
      if t_row and "error" not in t_row and (part == "train" or "encode" in t_row):
        torch_rate = t_row["examples_per_s"] if part == "train" else t_row["encode"]["sentences_per_s"]
      for r in [r for r in results if r["side"] == "st5_jax" and r["size"] == size] + t_rows:
        is_torch = r["side"] == "torch"
        if is_torch:
          label = (f"torch: {TORCH_IMPL_NAMES.get(r.get('impl'), r.get('impl'))}" +
                   (", compile" if r.get("compile") else "") +
                   (f", {r['optimizer']}" if part == "train" and "optimizer" in r else ""))
        else:
          label = f"st5_jax: {r['variant']}"
        if "error" in r:
          if part == "train":
            rows.append({"size": size, "part": part, "side": r["side"], "label": label, "error": r["error"]})
          continue
        if part == "train":
          row = {"per_s": r["examples_per_s"], "flops_per_s": r["flops_per_s"], "flops_per_item": r["flops_per_example"],
                 "step_s": r["step_s"], "first_step_s": r["first_step_s"], "first_loss": r["first_loss"],
                 "batch": r["batch"], "timed_steps": r["timed_steps"]}
        elif "encode" in r:
          e = r["encode"]
          row = {"per_s": e["sentences_per_s"], "flops_per_s": e["flops_per_s"], "flops_per_item": e["flops_per_sentence"],
                 "sentences": e["sentences"]}
        else:
          continue
        row.update(size=size, part=part, side=r["side"], label=label, variant=r.get("variant"), impl=r.get("impl"),
                   mfu=row["flops_per_s"] / peak if peak else None,
                   ratio=None if is_torch or not torch_rate else row["per_s"] / torch_rate)
        if is_torch and part == "train" and "counted_step_flops" in r:
          row["counted_flops_per_item"] = r["counted_step_flops"] / r["batch"]
        rows.append(row)
  result = {"device": device, "backend": backend, "peak_flops": peak, "peak_source": peak_source,
            "versions": versions, "config": cfg, "same_weights": same_weights,
            "torch_impl": [r["impl"] for r in torch_ok] or None, "rows": rows, "skipped": skipped,
            "workers": results, "wall_s": time.perf_counter() - t_start}
  print(f"\n# device: {device} ({backend}); peak: {peak_source}")
  print("# versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
  print(f"# batch {cfg['batch']}, length {cfg['length']}, 3 towers (query, positive, hard negative), projection "
        f"{cfg['projection']}, {cfg['dtype']}; encode: STS-B test sentences; torch side: "
        f"{', '.join(TORCH_IMPL_NAMES[i] for i in result['torch_impl']) if result['torch_impl'] else 'not run'}"
        + (f", torch.set_num_threads({torch_threads})" if torch_threads and result["torch_impl"] else ""))
  print("# per s: examples/s (train) or sentences/s (encode); GFLOP/ex: model FLOPs per example or sentence")
  print(table(result))
  losses = [f"{r['label']} {r['first_loss']:.5f}" for r in rows if r["part"] == "train" and "first_loss" in r
            and (r["side"] == "torch" or r.get("variant") == "base")]
  if same_weights and losses:  # same weights and batch (f32): equal first-step losses, one model on both sides
    print("# same initial weights, first-step loss: " + "; ".join(losses))
  if skipped:
    print("# skipped (budget): " + ", ".join(f"{s['kind']} {s['size']} {s['variant'] or ''}".strip() for s in skipped))
  print(f"# wall {result['wall_s']:.0f} s of a {cfg['budget_s']:.0f} s budget")
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(result, indent=2))
  return 0


if __name__ == "__main__":
  sys.exit(main())
