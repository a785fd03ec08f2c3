"""The example objective of docs/architecture.md ("adding an objective"): alignment + uniformity.

Wang & Isola (2020) train encoders directly on the two properties the Sentence-T5 paper
measures (its eq. 15), over pairs (LEFT, RIGHT) of unit vectors:

    L = alignment(u, v) + weight * (uniformity(u) + uniformity(v)) / 2
    alignment  = E ||u_i - v_i||^2          uniformity(x) = log E_{i != j} exp(-2 ||x_i - x_j||^2)

It is small on purpose: everything an objective declares is here, and the contract test
(tests/test_objectives_contract.py) covers it like the others. Gin: `@AlignUniform()`,
`gin/align_uniform_tiny_cpu.gin`.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Mapping

import jax

from st5_jax import flops, losses
from st5_jax.features import LEFT, RIGHT
from st5_jax.objectives.base import Feature, Objective, ObjectiveConfigError, ValueAndGrad, rebox, register


@register
@dataclasses.dataclass(frozen=True)
class AlignUniform(Objective):
  """Alignment + weight x uniformity on (LEFT, RIGHT) pairs of the tower's (normalised) embeddings."""

  name: ClassVar[str] = "align_uniform"
  example_gin: ClassVar[str] = "align_uniform_tiny_cpu.gin"
  task_modules: ClassVar[tuple[str, ...]] = ("st5_jax.data.tasks",)

  weight: float = 1.0  # Wang & Isola's lambda (their STL-10 choice: 1)

  def check(self, model_config, train_config) -> None:
    if not model_config.normalize:
      raise ObjectiveConfigError("AlignUniform is defined on the unit sphere: keep st5_model.normalize = True.")
    if self.weight < 0:
      raise ObjectiveConfigError(f"AlignUniform.weight must be >= 0, got {self.weight}")
    if train_config.grad_cache_chunks > 1:
      raise ObjectiveConfigError("AlignUniform does not implement GradCache; set TrainConfig.grad_cache_chunks = 0.")

  def features(self, lengths: Mapping[str, int]) -> dict[str, Feature]:
    lengths["inputs"], lengths["targets"]  # noqa: B018  (KeyError: a length the data config must give)
    return {LEFT: Feature("inputs"), RIGHT: Feature("targets")}

  def make_value_and_grad(self, model, boxed_params, model_config, train_config) -> ValueAndGrad:
    self.check(model_config, train_config)

    def loss_fn(params, batch, key):
      k_left, k_right = jax.random.split(key)
      side_kw = (lambda side: {"side": side}) if model_config.asymmetric else (lambda side: {})  # noqa: E731
      embed = lambda tokens, k, side: model.apply({"params": rebox(boxed_params, params)}, tokens,  # noqa: E731
                                                  deterministic=False, rngs={"dropout": k}, **side_kw(side))
      u_BxD, v_BxD = embed(batch[LEFT], k_left, "query"), embed(batch[RIGHT], k_right, "document")
      align = losses.alignment(u_BxD, v_BxD)
      uniform = 0.5 * (losses.uniformity(u_BxD) + losses.uniformity(v_BxD))
      loss = align + self.weight * uniform
      return loss, {"loss": loss, "alignment": align, "uniformity": uniform}

    return jax.value_and_grad(loss_fn, has_aux=True)

  def step_flops(self, model_config, *, global_batch_size, lengths) -> float:
    """3x the forward: both towers, and the two [B, B] distance matrices of the uniformity terms."""
    B = global_batch_size
    forward = sum(B * flops.encoder_forward_flops(model_config, lengths[k]) for k in ("inputs", "targets"))
    forward += 2 * 2 * B * B * model_config.output_dim
    return 3.0 * forward
