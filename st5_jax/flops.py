"""Analytic FLOPs of a training step (model FLOPs, as in MFU: no rematerialisation).

XLA's cost analysis counts a scanned layer body once, so it cannot be used for
scanned models; these counts are what the hardware must do at minimum, and the
same formula serves `st5 aot` (the MFU its roofline estimate implies) and `st5 bench` (achieved FLOP/s).
The FLOPs of a whole step are the objective's (`Objective.step_flops`, st5_jax/objectives/),
built from these pieces; tests/test_objectives_contract.py checks each against XLA's
cost analysis of the lowered (unscanned) step.
"""

from __future__ import annotations


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


def decoder_forward_flops(t5, length: int, *, memory_length: int, num_layers: int, memory_dim: int | None = None,
                          logits: bool = True) -> float:
  """Forward FLOPs of a T5 decoder stack over `length` teacher-forced positions of one sequence.

  Self-attention (all length x length scores counted, as for the encoder), cross-attention
  over `memory_length` memory vectors of `memory_dim` (default: the model width; their
  keys and values are projected once per sequence), the MLP, and the vocabulary logits.
  """
  D, HK, F, T = t5.emb_dim, t5.num_heads * t5.head_dim, t5.mlp_dim, length
  M = memory_dim or D
  n_in = len(t5.mlp_activations)
  per_token = 2 * 4 * D * HK + 2 * 2 * T * HK  # self-attention: q, k, v, out; scores/values
  per_token += 2 * 2 * D * HK + 2 * 2 * memory_length * HK  # cross-attention: q, out; scores/values
  per_token += 2 * (n_in + 1) * D * F  # MLP
  per_layer = T * per_token + 2 * 2 * M * HK * memory_length  # + the memory's keys and values
  flops = num_layers * per_layer
  if logits:
    flops += 2 * T * D * t5.vocab_size
  return float(flops)
