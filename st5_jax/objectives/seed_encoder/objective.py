"""The `seed_encoder` objective: T5 span corruption + SEED-Encoder's weak-decoder reconstruction.

    L = L_span + w * L_dec

- L_span, SEED-Encoder's "MLM" term on T5: teacher-forced cross-entropy of the T5
  decoder (tied logits for T5 1.0, `logits_dense` for T5.1.1) on the span-corruption
  targets, given the corrupted text (st5_jax/objectives/seed_encoder/span_corruption.py).
- L_dec: cross-entropy of the weak decoder (st5_jax/objectives/seed_encoder/weak_decoder.py) reconstructing
  the uncorrupted text from the pooled vector of the same encoder pass.

Each term is a mean over its non-padding target tokens of the global batch (so w weighs
two per-token losses, as the official code sums BERT's MLM loss and the decoder loss);
decoder inputs are the targets shifted right behind the start token 0. Examples are
unpacked (one text per row). Selected with `TrainConfig.objective = @SeedEncoder()`,
whose fields configure the weak decoder and the loss weight.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import jax
import jax.numpy as jnp

from st5_jax import flops
from st5_jax.checkpoints import loader, tree
from st5_jax.configs import ST5Config
from st5_jax.objectives.base import (Feature, Objective, ObjectiveConfigError, ValueAndGrad, check_same_architecture,
                                     rebox, refuse_asymmetric, register)
from st5_jax.objectives.seed_encoder import weak_decoder
from st5_jax.vocab import DECODER_START_ID

Array = jax.Array

# Pre-training batches: t5x's encoder-decoder names plus the weak decoder's targets, each
# int32 [B, length], 0-padded, EOS-terminated (DataConfig.model_features maps the task's
# `inputs`, `targets`, `uncorrupted` onto them: MODEL_FEATURE_NAMES).
ENCODER_INPUTS = "encoder_input_tokens"  # task feature `inputs`: text, noise spans -> sentinels
DECODER_TARGETS = "decoder_target_tokens"  # `targets`: each sentinel followed by its span
WEAK_DECODER_TARGETS = "weak_decoder_target_tokens"  # `uncorrupted`: the same text, uncorrupted
MODEL_FEATURE_NAMES = {"inputs": ENCODER_INPUTS, "targets": DECODER_TARGETS, "uncorrupted": WEAK_DECODER_TARGETS}
# What the weak decoder cross-attends to (one memory slot).
MEMORIES = ("pooled", "projected")


def shift_right(targets_BxT: Array) -> Array:
  """Teacher-forcing decoder inputs: the start token 0, then the targets but the last."""
  start_Bx1 = jnp.full((targets_BxT.shape[0], 1), DECODER_START_ID, targets_BxT.dtype)
  return jnp.concatenate([start_Bx1, targets_BxT[:, :-1]], axis=1)


def token_cross_entropy(logits_BxTxV: Array, targets_BxT: Array) -> tuple[Array, Array, Array]:
  """(summed negative log-likelihood, correct argmax predictions, target tokens) over targets > 0."""
  logp_BxTxV = jax.nn.log_softmax(logits_BxTxV.astype(jnp.float32), axis=-1)
  # One-hot product rather than a gather: stays sharded when the vocabulary is.
  onehot_BxTxV = jax.nn.one_hot(targets_BxT, logits_BxTxV.shape[-1], dtype=jnp.float32)
  nll_BxT = -jnp.sum(logp_BxTxV * onehot_BxTxV, axis=-1)
  weights_BxT = (targets_BxT > 0).astype(jnp.float32)
  correct_BxT = (jnp.argmax(logits_BxTxV, axis=-1) == targets_BxT).astype(jnp.float32)
  return jnp.sum(nll_BxT * weights_BxT), jnp.sum(correct_BxT * weights_BxT), jnp.sum(weights_BxT)


def seed_encoder_loss(span_logits_BxTxV: Array, span_targets_BxT: Array, weak_logits_BxSxV: Array | None,
                      weak_targets_BxS: Array | None, *, decoder_loss_weight: float) -> tuple[Array, dict[str, Array]]:
  """(L_span + w * L_dec, metrics); the weak-decoder term is absent when its logits are None."""
  nll, correct, count = token_cross_entropy(span_logits_BxTxV, span_targets_BxT)
  count = jnp.maximum(count, 1.0)
  span_loss = nll / count
  metrics = {"span_loss": span_loss, "accuracy": correct / count, "span_target_tokens": count}
  loss = span_loss
  if weak_logits_BxSxV is not None:
    nll, correct, count = token_cross_entropy(weak_logits_BxSxV, weak_targets_BxS)
    count = jnp.maximum(count, 1.0)
    dec_loss = nll / count
    metrics.update(dec_loss=dec_loss, dec_accuracy=correct / count, dec_target_tokens=count)
    loss = loss + decoder_loss_weight * dec_loss
  metrics["loss"] = loss
  return loss, metrics


def make_value_and_grad(seed: "SeedEncoder", model: weak_decoder.SeedEncoderPretrainer,
                        boxed_params: Any) -> ValueAndGrad:
  """(params, batch, dropout key) -> ((loss, metrics), grads) of the SEED-Encoder objective.

  `boxed_params` re-boxes the parameters so that each use inside the model carries its
  sharding constraint (st5_jax.objectives.base.rebox).
  """
  weight = float(seed.decoder_loss_weight)
  needed = (ENCODER_INPUTS, DECODER_TARGETS) + ((WEAK_DECODER_TARGETS,) if weight > 0 else ())

  def loss_fn(params, batch, key):
    missing = [k for k in needed if k not in batch]
    if missing:
      raise KeyError(f"The SeedEncoder objective needs batch features {list(needed)}; missing {missing} "
                     f"(got {sorted(batch)}). A seqio task for it outputs `inputs`, `targets` and `uncorrupted` "
                     "(st5_jax/objectives/seed_encoder/span_corruption.py).")
    weak_targets = batch[WEAK_DECODER_TARGETS] if weight > 0 else None
    span_logits, weak_logits = model.apply(
        {"params": rebox(boxed_params, params)}, batch[ENCODER_INPUTS],
        decoder_input_tokens_BxT=shift_right(batch[DECODER_TARGETS]),
        weak_decoder_input_tokens_BxS=None if weak_targets is None else shift_right(weak_targets),
        deterministic=False, rngs={"dropout": key})
    return seed_encoder_loss(span_logits, batch[DECODER_TARGETS], weak_logits, weak_targets,
                             decoder_loss_weight=weight)

  return jax.value_and_grad(loss_fn, has_aux=True)


@register
@dataclasses.dataclass(frozen=True)
class SeedEncoder(Objective):
  """SEED-Encoder pre-training: T5 span corruption + the weak decoder's reconstruction; gin `@SeedEncoder()`.

  The weak decoder has the encoder's width (heads, MLP, dtype, dropout, scan and remat
  come from the run's T5Config), shares the token embedding (input and tied output),
  and is dropped when the pre-trained work dir initialises an ST5 run.
  """

  name: ClassVar[str] = "seed_encoder"
  example_gin: ClassVar[str] = "seed_encoder_tiny_cpu.gin"
  task_modules: ClassVar[tuple[str, ...]] = ("st5_jax.objectives.seed_encoder.tasks",)

  # Decoder layers (the paper: 3; its 1-layer variant uses window 8).
  num_layers: int = 3
  # Self-attention window k: query i attends keys i-k < j <= i and position 0 (the start
  # token), in every layer; the paper's k = 2.
  window: int = 2
  # The single memory vector: "pooled" is the ST5 pooling of ST5Config.pooling (first
  # token, mean, or first decoder output) before the projection; "projected" is after the
  # projection (needs embedding_dim), before L2 normalisation.
  memory: str = "pooled"
  # w in L = L_span + w * L_dec (the official code has an unused ratio field; 1.0 is its
  # plain sum). 0 trains span corruption alone: the weak decoder is then not run.
  decoder_loss_weight: float = 1.0

  def __post_init__(self):
    if self.num_layers < 1:
      raise ObjectiveConfigError(f"SeedEncoder.num_layers must be >= 1, got {self.num_layers}")
    if self.window < 1:
      raise ObjectiveConfigError(f"SeedEncoder.window must be >= 1 (1: the token itself and the start "
                                 f"token only), got {self.window}")
    if self.memory not in MEMORIES:
      raise ObjectiveConfigError(f"SeedEncoder.memory must be one of {MEMORIES}, got {self.memory!r}")
    if self.decoder_loss_weight < 0:
      raise ObjectiveConfigError(f"SeedEncoder.decoder_loss_weight must be >= 0, got {self.decoder_loss_weight}")

  def check(self, model_config, train_config) -> None:
    refuse_asymmetric(self, model_config)
    if train_config.grad_cache_chunks > 1:
      raise ObjectiveConfigError(
          "TrainConfig.grad_cache_chunks applies to the contrastive losses over sentence embeddings; set it to 0 "
          "for the SeedEncoder objective (its loss is per token, so plain data parallelism suffices).")
    if self.memory == "projected" and model_config.embedding_dim is None:
      raise ObjectiveConfigError("SeedEncoder.memory='projected' needs a projection; set ST5Config.embedding_dim "
                                 "or use memory='pooled'.")

  def make_model(self, model_config: ST5Config) -> weak_decoder.SeedEncoderPretrainer:
    return weak_decoder.SeedEncoderPretrainer(model_config, self)

  def features(self, lengths: Mapping[str, int]) -> dict[str, Feature]:
    out = {ENCODER_INPUTS: Feature("inputs"), DECODER_TARGETS: Feature("targets")}
    if self.decoder_loss_weight > 0:
      out[WEAK_DECODER_TARGETS] = Feature("uncorrupted")
    for f in out.values():
      lengths[f.length_key]  # noqa: B018  (KeyError: a length the data config must give)
    return out

  def make_value_and_grad(self, model, boxed_params, model_config, train_config) -> ValueAndGrad:
    self.check(model_config, train_config)
    return make_value_and_grad(self, model, boxed_params)

  def step_flops(self, model_config, *, global_batch_size, lengths) -> float:
    """3x the forward: the encoder on `inputs`; the T5 decoder on `targets` (cross-attention over the
    inputs, vocabulary logits); the weak decoder on `uncorrupted` (one memory slot, logits); the
    projection when `memory='projected'`. Softmaxes and norms are not counted (model FLOPs)."""
    t = model_config.t5
    L, T = lengths["inputs"], lengths["targets"]
    forward = flops.encoder_forward_flops(model_config.replace(embedding_dim=None, pooling="enc_mean"), L)
    forward += flops.decoder_forward_flops(t, T, memory_length=L, num_layers=t.num_decoder_layers)
    if self.decoder_loss_weight > 0:
      S = lengths["uncorrupted"]
      forward += flops.decoder_forward_flops(t, S, memory_length=1, num_layers=self.num_layers,
                                             memory_dim=(model_config.output_dim if self.memory == "projected"
                                                         else t.emb_dim))
      if self.memory == "projected":
        forward += 2 * t.emb_dim * model_config.embedding_dim
    return 3.0 * global_batch_size * forward

  def load_pretrained(self, path: str, model_config: ST5Config, *, fresh_projection: bool,
                      rng: Array) -> tuple[Any, Any]:
    """A raw T5 checkpoint (T5X, Hugging Face), an ST5 model, or an earlier pre-training work dir.

    What the checkpoint has is loaded; the weak decoder, the projection and -- for
    encoder-only checkpoints (an ST5 enc_mean model) -- the whole T5 decoder start fresh
    when the checkpoint has none of their arrays. A part present only in pieces, or with
    other shapes, is refused.
    """
    fmt = loader.detect_format(path)
    stored, flat = loader.read_flat(path, fmt)
    check_same_architecture(path, fmt, stored.t5, model_config)
    if fresh_projection:
      flat = {k: v for k, v in flat.items() if not k.startswith("projection_layer/")}
    fresh = ["weak_decoder/", "projection_layer/"]
    if not any(k.startswith("decoder/") for k in flat):
      fresh.append("decoder/")
    # Parts the pre-training model does not have (an NLI or layer-attention head) are reported unused.
    return tree.assemble(model_config, flat, source=f"{fmt} checkpoint {path}", fresh_ok=tuple(fresh), rng=rng,
                         abstract_fn=lambda: self.abstract_params(model_config),
                         init_fn=lambda key: self.init_params(model_config, key))


def load_pretrained(path: str, *, model_config: ST5Config, seed_config: SeedEncoder, rng: Array,
                    fresh_projection: bool = False) -> tuple[Any, Any]:
  """`SeedEncoder.load_pretrained` as a function (numpy parameter tree, load report)."""
  return seed_config.load_pretrained(path, model_config, fresh_projection=fresh_projection, rng=rng)
