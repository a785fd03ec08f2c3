"""What a layer_attention model keeps when its attention head is removed at inference.

  python benchmarks/layer_attention_removal.py --model workdirs/lap_tiny_cpu [--tasks sts,geometry] \
      [--output removal.json]

The encoder runs once per text; every form below is computed from its per-layer states:

  full           the model as trained (checked against SentenceEncoder.load(model))
  enc_first      SentenceEncoder.load(model, pooling="enc_first"): last layer's first token, trained
                 projection, L2 norm -- the load-time removal (and the sentence-transformers export)
  enc_mean       the same with the last layer's mean (pooling="enc_mean")
  *_raw          those pooled vectors without the projection (the SimCSE convention of dropping
                 every training-only layer after the encoder)
  frozen_alpha   attention weights frozen to their mean over a calibration set, o = sum_l a_l V_l
                 (still reads every layer; calibration-dependent, not a load option)
  mean_o         the attention output o frozen to its calibration mean, folded into the dense
                 layer's bias: z = tanh(W_c c_L + (W_o o_mean + b)) -- last layer only
                 (calibration-dependent, not a load option)

Calibration set: the distinct sentences of STS-B dev (no labels used). Prints a markdown
table (STS per task and mean, alignment, uniformity), the mean attention weight per layer,
and the RMS of the raw (un-normed) residual stream per layer.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from st5_jax import SentenceEncoder, vocab as vocab_lib
from st5_jax.encoder import length_bucket
from st5_jax.evaluation import evaluate, readers
from st5_jax.model.layer_attention import RRELU_EVAL_SLOPE, query_token_index
from st5_jax.model.st5 import SentenceT5


def _states(module, tokens_BxL):
  mask_BxL = tokens_BxL > 0
  _, states = module.encoder(module.token_embedder(tokens_BxL), mask_BxL, return_hidden_states=True,
                             norm_hidden_states=module.config.layer_attention_norm)
  states = states.astype(jnp.float32)
  idx_B = query_token_index(mask_BxL, module.config.layer_attention_token)
  c_NxBxD = jnp.take_along_axis(states, idx_B[None, :, None, None], axis=2)[:, :, 0]
  first_D = states[-1][:, 0]  # enc_first reads the first token whatever the query token
  m = mask_BxL.astype(jnp.float32)
  mean_NxBxD = jnp.einsum("nbld,bl->nbd", states, m) / jnp.maximum(m.sum(1), 1e-9)[None, :, None]
  return jnp.swapaxes(c_NxBxD, 0, 1), jnp.swapaxes(mean_NxBxD, 0, 1), first_D


def _raw_rms(module, tokens_BxL):
  """Per layer: mean over non-padding tokens of the RMS of the raw residual stream h^l."""
  mask_BxL = tokens_BxL > 0
  _, states = module.encoder(module.token_embedder(tokens_BxL), mask_BxL, return_hidden_states=True,
                             norm_hidden_states=False)
  rms_NxBxL = jnp.sqrt(jnp.mean(jnp.square(states.astype(jnp.float32)), axis=-1))
  m = mask_BxL.astype(jnp.float32)
  return jnp.sum(rms_NxBxL * m, axis=(1, 2)) / jnp.sum(m)


class Pieces:
  """Per-text c_l, m_l (all layers) and the last layer's first token, computed once."""

  def __init__(self, enc: SentenceEncoder, batch_size: int = 64):
    self.enc, self.batch_size, self.cache = enc, batch_size, {}
    model = SentenceT5(enc.config)
    self._fn = jax.jit(lambda p, t: model.apply({"params": p}, t, method=_states))

  def get(self, texts):
    new = [t for t in dict.fromkeys(texts) if t not in self.cache]
    rows = self.enc.tokenize(new)
    order = np.argsort([-len(r) for r in rows], kind="stable")
    for s in range(0, len(new), self.batch_size):
      idx = order[s:s + self.batch_size]
      L = length_bucket(max(len(rows[i]) for i in idx), self.enc.config.max_length)
      c, m, f = (np.asarray(x) for x in self._fn(self.enc.params, vocab_lib.pad_batch([rows[i] for i in idx], L)))
      for j, i in enumerate(idx):
        self.cache[new[i]] = (c[j], m[j], f[j])
    c, m, f = zip(*(self.cache[t] for t in texts))
    return np.stack(c), np.stack(m), np.stack(f)


def _rrelu(x):
  return np.where(x >= 0, x, x * RRELU_EVAL_SLOPE)


def _unit(x):
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def head(p, c_BxNxD, m_BxNxD, *, alpha_N=None, o_D=None):
  """z of the layer-attention head; attention weights or output optionally frozen."""
  N = c_BxNxD.shape[1]
  v = _rrelu(m_BxNxD @ p["value_kernel"])
  if o_D is not None:
    o = np.broadcast_to(o_D, (c_BxNxD.shape[0], o_D.shape[0]))
    alpha = None
  else:
    q = _rrelu(c_BxNxD @ p["query_kernel"])
    k = _rrelu(m_BxNxD @ p["key_kernel"])
    s = np.einsum("bqd,bnd->bqn", q, k) / N
    alpha = np.exp(s - s.max(-1, keepdims=True))
    alpha /= alpha.sum(-1, keepdims=True)
    if alpha_N is not None:
      alpha = np.broadcast_to(alpha_N, alpha.shape)
    o = np.einsum("bqn,bnd->bqd", alpha, v).mean(1)
  z = np.tanh(np.concatenate([c_BxNxD[:, -1], o], -1) @ p["dense_kernel"] + p["dense_bias"])
  return z, alpha, o


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--model", required=True)
  ap.add_argument("--tasks", default="sts,geometry")
  ap.add_argument("--data_dir", default=None)
  ap.add_argument("--output", default=None)
  args = ap.parse_args()

  enc = SentenceEncoder.load(args.model)
  if enc.config.pooling != "layer_attention":
    raise SystemExit(f"{args.model} has {enc.config.pooling} pooling, not layer_attention")
  p = {k: np.asarray(v, np.float64) for k, v in enc.params["layer_attention"].items()}
  proj = np.asarray(enc.params["projection_layer"]["kernel"], np.float64) if enc.config.embedding_dim else None
  pieces = Pieces(enc)

  dev = readers.read_stsb(args.data_dir, split="dev")
  calib = list(dict.fromkeys(dev.sents1 + dev.sents2))
  c, m, _ = pieces.get(calib)
  _, alpha, o = head(p, c.astype(np.float64), m.astype(np.float64))
  alpha_N = alpha.mean(axis=(0, 1))  # over sentences and queries
  o_mean = o.mean(0)
  model = SentenceT5(enc.config)
  rows = enc.tokenize(calib[:512])
  raw_rms_N = np.asarray(model.apply({"params": enc.params}, jnp.asarray(vocab_lib.pad_batch(rows, max(map(len, rows)))),
                                     method=_raw_rms))
  full_check = head(p, c[:64].astype(np.float64), m[:64].astype(np.float64))[0] @ proj if proj is not None else None
  if full_check is not None:
    np.testing.assert_allclose(_unit(full_check), enc.encode(calib[:64]), atol=1e-4)

  def projected(x):
    return _unit(x @ proj) if proj is not None else _unit(x)

  forms = {
      "full": lambda c, m, f: projected(head(p, c, m)[0]),
      "enc_first": lambda c, m, f: projected(f),
      "enc_mean": lambda c, m, f: projected(m[:, -1]),
      "enc_first_raw": lambda c, m, f: _unit(f),
      "enc_mean_raw": lambda c, m, f: _unit(m[:, -1]),
      "frozen_alpha": lambda c, m, f: projected(head(p, c, m, alpha_N=alpha_N)[0]),
      "mean_o": lambda c, m, f: projected(head(p, c, m, o_D=o_mean)[0]),
  }
  results = {}
  for name, fn in forms.items():
    t0 = time.perf_counter()

    def encode(texts, fn=fn):
      c, m, f = pieces.get(list(texts))
      return fn(c.astype(np.float64), m.astype(np.float64), f.astype(np.float64)).astype(np.float32)

    r = evaluate(encode, args.tasks, args.data_dir)
    results[name] = r
    print(f"# {name}: {time.perf_counter() - t0:.0f}s", flush=True)

  tasks = [t for t in next(iter(results.values()))["tasks"] if t != "AlignUniform"]
  print("\n| form | " + " | ".join(tasks) + " | STS mean | alignment | uniformity |")
  print("|---|" + "---:|" * (len(tasks) + 3))
  for name, r in results.items():
    s = r["summary"]
    row = [f"{r['tasks'][t]['main']:.2f}" for t in tasks]
    geo = s.get("geometry", {})
    print(f"| {name} | " + " | ".join(row) + f" | {s['sts']['mean']:.2f} | {geo.get('alignment', float('nan')):.3f} | "
          f"{geo.get('uniformity', float('nan')):.3f} |")
  print("\nmean attention weight per layer (h^0 .. h^L), STS-B dev sentences: "
        + ", ".join(f"{a:.3f}" for a in alpha_N))
  print("RMS of the raw residual stream per layer (h^0 .. h^{L-1}; the last is the normed output), "
        "512 STS-B dev sentences: " + ", ".join(f"{r:.3g}" for r in raw_rms_N))
  if args.output:
    with open(args.output, "w") as fh:
      json.dump({"model": args.model, "alpha_mean": alpha_N.tolist(), "raw_rms": raw_rms_N.tolist(),
                 "forms": {k: {"summary": v["summary"], "tasks": {t: v["tasks"][t].get("main") for t in v["tasks"]}}
                           for k, v in results.items()}}, fh, indent=2)


if __name__ == "__main__":
  main()
