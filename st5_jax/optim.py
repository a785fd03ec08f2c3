"""Adafactor as t5x fine-tunes T5, and the paper's learning-rate schedule.

Adafactor (optax.adafactor, whose defaults are t5x's fine-tuning settings): factored
second moments for matrices whose two largest dims are >= 128, decay rate 0.8
(beta2_t = 1 - t^-0.8), update clipping at RMS 1.0, updates scaled by the parameter's
RMS (floored at epsilon2 = 1e-3), epsilon1 = 1e-30, no momentum.

The optimizer state is always created fresh, so its step count starts at 0 when
training starts from a pre-trained checkpoint (a carried-over count would start the
decay rate near 1).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import optax


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  learning_rate: float = 1e-3
  # Fraction of the steps at constant learning rate; then linear decay to 0 at the end.
  constant_fraction: float = 0.1
  decay_rate: float = 0.8
  clipping_threshold: float | None = 1.0
  min_dim_size_to_factor: int = 128
  multiply_by_parameter_scale: bool = True
  momentum: float | None = None
  # Added to squared gradients (t5x's epsilon1).
  epsilon1: float = 1e-30


def learning_rate_schedule(*, learning_rate: float, num_train_steps: int,
                           constant_fraction: float = 0.1) -> optax.Schedule:
  """lr for step < constant_fraction * steps, then linear to 0 at step == num_train_steps."""
  if num_train_steps < 1:
    raise ValueError(f"num_train_steps must be >= 1, got {num_train_steps}")
  constant_steps = int(round(constant_fraction * num_train_steps))
  decay_steps = max(num_train_steps - constant_steps, 1)

  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    frac_left = jnp.clip((num_train_steps - step) / decay_steps, 0.0, 1.0)
    return jnp.where(step < constant_steps, learning_rate, learning_rate * frac_left)

  return schedule


def make_optimizer(config: OptimizerConfig, *, num_train_steps: int
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
  schedule = learning_rate_schedule(learning_rate=config.learning_rate, num_train_steps=num_train_steps,
                                    constant_fraction=config.constant_fraction)
  tx = optax.adafactor(learning_rate=schedule, min_dim_size_to_factor=config.min_dim_size_to_factor,
                       decay_rate=config.decay_rate, multiply_by_parameter_scale=config.multiply_by_parameter_scale,
                       clipping_threshold=config.clipping_threshold, momentum=config.momentum,
                       eps=config.epsilon1)
  return tx, schedule
