"""The `seed_encoder` objective: T5 span corruption + SEED-Encoder's weak-decoder reconstruction.

    L = L_span + w * L_dec

- L_span, SEED-Encoder's "MLM" term on T5: teacher-forced cross-entropy of the T5
  decoder (tied logits for T5 1.0, `logits_dense` for T5.1.1) on the span-corruption
  targets, given the corrupted text (st5_jax/data/span_corruption.py).
- L_dec: cross-entropy of the weak decoder (st5_jax/model/weak_decoder.py) reconstructing
  the uncorrupted text from the pooled vector of the same encoder pass.

Each term is a mean over its non-padding target tokens of the global batch (so w weighs
two per-token losses, as the official code sums BERT's MLM loss and the decoder loss);
decoder inputs are the targets shifted right behind the start token 0. Examples are
unpacked (one text per row). Selected with `TrainConfig.objective = "seed_encoder"`;
`train.build` then uses `SeedEncoderPretrainer` and `make_value_and_grad`.
"""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from st5_jax.checkpoints import loader, tree
from st5_jax.configs import SeedEncoderConfig, ST5Config
from st5_jax.features import SEED_DECODER_TARGETS, SEED_ENCODER_INPUTS, SEED_WEAK_DECODER_TARGETS
from st5_jax.model import weak_decoder
from st5_jax.vocab import DECODER_START_ID

Array = jax.Array
ValueAndGrad = Callable[[Any, dict[str, Array], Array], tuple[tuple[Array, dict[str, Array]], Any]]


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


def make_model(model_config: ST5Config,
               seed_config: SeedEncoderConfig) -> tuple[weak_decoder.SeedEncoderPretrainer, Any]:
  """The pre-training model and its boxed abstract parameters (for train.build)."""
  model = weak_decoder.SeedEncoderPretrainer(model_config, seed_config)
  return model, weak_decoder.abstract_params(model_config, seed_config)


def make_value_and_grad(*, model: weak_decoder.SeedEncoderPretrainer, boxed_params: Any,
                        train_config: Any) -> ValueAndGrad:
  """(params, batch, dropout key) -> ((loss, metrics), grads) of the seed_encoder objective.

  `boxed_params` (the logically annotated abstract tree) re-boxes the parameters so that
  each use inside the model carries its sharding constraint (as train.make_embed_fn).
  """
  if not isinstance(model, weak_decoder.SeedEncoderPretrainer):
    raise TypeError(f"the seed_encoder objective needs a SeedEncoderPretrainer, got {type(model).__name__}")
  if train_config.grad_cache_chunks > 1:
    raise ValueError("TrainConfig.grad_cache_chunks applies to the contrastive ST5 loss only; set it to 0 for "
                     "the seed_encoder objective (its loss is per token, so plain data parallelism suffices).")
  weight = float(model.seed.decoder_loss_weight)
  needed = (SEED_ENCODER_INPUTS, SEED_DECODER_TARGETS) + ((SEED_WEAK_DECODER_TARGETS,) if weight > 0 else ())
  is_box = lambda x: isinstance(x, nn.LogicallyPartitioned)  # noqa: E731

  def loss_fn(params, batch, key):
    missing = [k for k in needed if k not in batch]
    if missing:
      raise KeyError(f"The seed_encoder objective needs batch features {list(needed)}; missing {missing} "
                     f"(got {sorted(batch)}). A seqio task for it outputs `inputs`, `targets` and `uncorrupted` "
                     "(st5_jax/data/span_corruption.py).")
    params = jax.tree.map(lambda box, x: box.replace_boxed(x), boxed_params, params, is_leaf=is_box)
    weak_targets = batch[SEED_WEAK_DECODER_TARGETS] if weight > 0 else None
    span_logits, weak_logits = model.apply(
        {"params": params}, batch[SEED_ENCODER_INPUTS],
        decoder_input_tokens_BxT=shift_right(batch[SEED_DECODER_TARGETS]),
        weak_decoder_input_tokens_BxS=None if weak_targets is None else shift_right(weak_targets),
        deterministic=False, rngs={"dropout": key})
    return seed_encoder_loss(span_logits, batch[SEED_DECODER_TARGETS], weak_logits, weak_targets,
                             decoder_loss_weight=weight)

  return jax.value_and_grad(loss_fn, has_aux=True)


def load_pretrained(path: str, *, model_config: ST5Config, seed_config: SeedEncoderConfig, rng: Array,
                    fresh_projection: bool = False) -> tuple[Any, Any]:
  """(numpy parameter tree of the pre-training model, load report) from any checkpoint.

  `run.init_from` for the seed_encoder objective: a raw T5 checkpoint (T5X, Hugging
  Face), an ST5 model, or an earlier pre-training work dir. What the checkpoint has is
  loaded; the weak decoder, the projection and -- for encoder-only checkpoints (an ST5
  enc_mean model) -- the whole T5 decoder start fresh when the checkpoint has none of
  their arrays. A part present only in pieces, or with other shapes, is refused.
  """
  fmt = loader.detect_format(path)
  stored, flat = loader.read_flat(path, fmt)
  t = model_config.t5
  numerics = dict(dtype=t.dtype, dropout_rate=t.dropout_rate, scan_layers=t.scan_layers,
                  remat_policy=t.remat_policy)
  if stored.t5.replace(**numerics) != t:
    diffs = {f: (getattr(stored.t5, f), getattr(t, f)) for f in t.__dataclass_fields__
             if f not in numerics and getattr(stored.t5, f) != getattr(t, f)}
    raise ValueError(f"{path} ({fmt}) does not match the configured model: "
                     + ", ".join(f"{k}: checkpoint {a} vs config {b}" for k, (a, b) in diffs.items()))
  if fresh_projection:
    flat = {k: v for k, v in flat.items() if not k.startswith("projection_layer/")}
  fresh = ["weak_decoder/", "projection_layer/"]
  if not any(k.startswith("decoder/") for k in flat):
    fresh.append("decoder/")
  # Parts the pre-training model does not have (an NLI or layer-attention head) are reported unused.
  return tree.assemble(model_config, flat, source=f"{fmt} checkpoint {path}", fresh_ok=tuple(fresh), rng=rng,
                       abstract_fn=lambda: weak_decoder.abstract_params(model_config, seed_config),
                       init_fn=lambda key: weak_decoder.init_params(model_config, seed_config, key))
