"""The trainable module of ConSERT's joint objective: the sentence tower plus its NLI classifier.

The classifier is the objective's (sentence-transformers' `SoftmaxLoss` owns its own the
same way); the tower in st5_jax/model/ carries no training head. `ConsertTower` keeps the
tower's parameter names and adds `nli_classifier/{kernel,bias}` beside them, so work dirs
written when the head lived in the tower restore unchanged, and inference drops the head.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from st5_jax.model.st5 import SentenceT5

Array = jax.Array


def nli_pair_features(u_BxD: Array, v_BxD: Array) -> Array:
  """[u, v, |u - v|, max(u, v)^2], float32 [B, 4D] (ConSERT's concatenation, official scripts)."""
  u, v = u_BxD.astype(jnp.float32), v_BxD.astype(jnp.float32)
  return jnp.concatenate([u, v, jnp.abs(u - v), jnp.square(jnp.maximum(u, v))], axis=-1)


class NliClassifier(nn.Module):
  """Linear classifier with bias over `nli_pair_features` (torch nn.Linear's uniform init)."""

  num_classes: int

  @nn.compact
  def __call__(self, u_BxD: Array, v_BxD: Array) -> Array:
    f_BxF = nli_pair_features(u_BxD, v_BxD)
    # Axis names unknown to the rule table are replicated: the head is a few KB.
    init = nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")
    kernel = self.param("kernel", nn.with_logical_partitioning(init, ("nli_features", "nli_classes")),
                        (f_BxF.shape[-1], self.num_classes), jnp.float32)
    bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, ("nli_classes",)),
                      (self.num_classes,), jnp.float32)
    return f_BxF @ kernel + bias


class ConsertTower(SentenceT5):
  """SentenceT5 + `nli_classifier` (created with the tower's parameters at init); `classify` gives NLI logits."""

  nli_classes: int = 0

  def setup(self):
    super().setup()
    if self.nli_classes:
      self.nli_classifier = NliClassifier(self.nli_classes)

  def __call__(self, tokens_BxL: Array, *, deterministic: bool = True, **hooks) -> Array:
    out_BxD = super().__call__(tokens_BxL, deterministic=deterministic, **hooks)
    if self.nli_classes and self.is_initializing():
      self.nli_classifier(out_BxD, out_BxD)  # create the head's parameters with the tower's
    return out_BxD

  def classify(self, u_BxD: Array, v_BxD: Array) -> Array:
    """NLI logits [B, nli_classes] of two tower outputs (training only)."""
    if not self.nli_classes:
      raise ValueError("This tower has no NLI head (ConsertJoint.nli_classes).")
    return self.nli_classifier(u_BxD, v_BxD)
