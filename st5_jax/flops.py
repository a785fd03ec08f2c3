"""Analytic FLOPs of a training step (model FLOPs, as in MFU: no rematerialisation).

XLA's cost analysis counts a scanned layer body once, so it cannot be used for
scanned models; these counts are what the hardware must do at minimum, and the
same formula serves `st5 aot` (predicted step time) and `st5 bench` (achieved FLOP/s).
"""

from __future__ import annotations

from typing import Mapping

from st5_jax.configs import ST5Config


def encoder_forward_flops(config: ST5Config, length: int) -> float:
  """Forward FLOPs to embed one sequence of `length` tokens (multiply-add = 2)."""
  t = config.t5
  D, HK, F, L = t.emb_dim, t.num_heads * t.head_dim, t.mlp_dim, length
  n_in = len(t.mlp_activations)
  per_token = 2 * (4 * D * HK + (n_in + 1) * D * F) + 2 * 2 * L * HK  # matmuls + scores/values
  flops = t.num_encoder_layers * L * per_token
  if config.uses_decoder:  # one decoder position attending over L encoder outputs
    self_attn = 2 * 4 * D * HK + 2 * 2 * 1 * HK
    cross = 2 * 2 * D * HK + 2 * 2 * D * HK * L + 2 * 2 * L * HK  # q,out on 1 token; k,v on L
    mlp = 2 * (n_in + 1) * D * F
    flops += t.num_decoder_layers * (self_attn + cross + mlp)
  if config.embedding_dim is not None:
    flops += 2 * D * config.embedding_dim
  return float(flops)


def train_step_flops(config: ST5Config, *, global_batch_size: int, lengths: Mapping[str, int],
                     objective: str = "st5") -> float:
  """Forward + backward (3x forward) FLOPs of one step over all towers and the loss.

  objective: TrainConfig.objective. ConSERT's run two views (two forward passes) of each
  sentence set: `consert_unsup` of `inputs`, `consert_joint` of `inputs` and `targets`,
  each set with a [2B, 2B] NT-Xent similarity matrix (the joint NLI classifier is
  negligible; FGV's extra forward and backward pass is not counted).
  """
  B = global_batch_size
  if objective in ("consert_unsup", "consert_joint"):
    sides = [lengths["inputs"]] + ([lengths["targets"]] if objective == "consert_joint" else [])
    forward = sum(2 * B * encoder_forward_flops(config, L) for L in sides)
    forward += len(sides) * 2 * (2 * B) ** 2 * config.output_dim  # NT-Xent similarities
    return 3.0 * forward
  towers = [lengths["inputs"], lengths["targets"]]
  if "negative_targets" in lengths:
    towers.append(lengths["negative_targets"])
  forward = sum(B * encoder_forward_flops(config, L) for L in towers)
  candidates = B * (len(towers) - 1)
  forward += 2 * B * candidates * config.output_dim  # similarity logits
  return 3.0 * forward
