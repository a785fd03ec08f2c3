"""Adafactor as t5x fine-tunes T5, and the paper's learning-rate schedule; AdamW with warm-up as the other choice.

`TrainConfig.optimizer = @OptimizerConfig()` (the default: Adafactor below) or
`@AdamWConfig()`: AdamW as sentence-transformers' `fit` runs it (and so ConSERT's and
SimCSE's official code): decoupled weight decay 0.01 except on biases and layer-norm
scales, global-norm clipping at 1, learning rate linear from 0 over the warm-up fraction
of the steps, then linear to 0 (transformers' get_linear_schedule_with_warmup, whose
first step has learning rate 0).

Adafactor (Shazeer & Stern 2018) with t5x's fine-tuning settings (t5x/adafactor.py):
second-moment decay beta2_t = 1 - t^-0.8 (t = 1 at the first step), epsilon1 = 1e-30
added to squared gradients, second moments factored into row and column means for
parameters whose two largest dims are >= 128, update clipping at RMS 1.0, updates
scaled by the learning rate times the parameter's RMS (floored at epsilon2 = 1e-3),
optional momentum on the scaled update, no weight decay.

Scanned stacks: a parameter dimension whose logical axis is `layers` (the stacked
layers of `nn.scan`) is a batch dimension, as t5x maps it to `FactorDim.BATCH`. The
factoring decision and the factored statistics leave it out (v_row and v_col keep it),
and the update-clipping RMS and the parameter-scale RMS are taken within each layer,
never across the stack. So each layer of a scanned stack gets exactly the update it
would get as a separate (unrolled) parameter. Unlike t5x, which factors a scanned
parameter by its axis names whatever their size, the size heuristic above decides for
both layouts; the two agree for every T5 size (all factored dims >= 128), and the
factored estimate is the same whichever of the two dims is called the row.
`make_optimizer` learns the axes from `param_axes` (`logical_axes` of the boxed
parameters); without them no dimension is a batch dimension.

The optimizer state (`AdafactorState`) holds, per parameter, v_row/v_col (factored) or
v (not factored), with (1,)-shaped placeholders in the unused slots, and m with
momentum. `state_partition_specs` derives each leaf's PartitionSpec from its
parameter's, dimension by dimension (v_row keeps the row dim's entry, v_col the
column's), so the statistics live where their parameter's shards are; `state_shardings`
places them on a mesh.

The optimizer state is always created fresh, so its step count starts at 0 when
training starts from a pre-trained checkpoint (a carried-over count would start the
decay rate near 1).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from st5_jax import partitioning

# Logical axis names that stack independent copies of a parameter (t5x FactorDim.BATCH).
BATCH_AXIS_NAMES = ("layers",)
# Floor of the parameter-scale RMS (t5x epsilon2).
EPSILON2 = 1e-3


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


@dataclasses.dataclass(frozen=True)
class AdamWConfig:
  """AdamW with linear warm-up and linear decay (transformers.AdamW + WarmupLinear)."""

  learning_rate: float = 2e-5
  warmup_fraction: float = 0.1
  weight_decay: float = 0.01
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-6
  max_grad_norm: float | None = 1.0
  # False: no bias correction of the moments (transformers.AdamW(correct_bias=False), which
  # sentence-transformers' fit and ConSERT's main.py use); weight decay then follows the Adam
  # step, as in that class.
  correct_bias: bool = True
  # Parameters (by their last path name) without weight decay: biases and layer-norm scales,
  # sentence-transformers' no_decay = ['bias', 'LayerNorm.bias', 'LayerNorm.weight'].
  no_decay: tuple[str, ...] = ("bias", "scale")


def warmup_linear_schedule(*, learning_rate: float, num_train_steps: int, warmup_fraction: float) -> optax.Schedule:
  """lr * step / warmup while step < warmup, then lr * (steps - step) / (steps - warmup), floored at 0."""
  if num_train_steps < 1:
    raise ValueError(f"num_train_steps must be >= 1, got {num_train_steps}")
  if not 0.0 <= warmup_fraction < 1.0:
    raise ValueError(f"warmup_fraction must be in [0, 1), got {warmup_fraction}")
  warmup = int(warmup_fraction * num_train_steps)  # as sentence-transformers: int(steps * 0.1)

  def schedule(step):
    step = jnp.asarray(step, jnp.result_type(float))  # float32, or float64 under jax.enable_x64
    up = step / max(warmup, 1)
    down = jnp.maximum(0.0, (num_train_steps - step) / max(num_train_steps - warmup, 1))
    return learning_rate * jnp.where(step < warmup, up, down)

  return schedule


def _decay_mask(params: Any, no_decay: Sequence[str]) -> Any:
  def keep(path, _):
    last = path[-1]
    name = getattr(last, "key", getattr(last, "name", str(last)))
    return str(name) not in no_decay
  return jax.tree_util.tree_map_with_path(keep, params)


def _scale_by_adam_uncorrected(b1: float, b2: float, eps: float) -> optax.GradientTransformation:
  """m / (sqrt(v) + eps) with running moments and no bias correction (transformers.AdamW(correct_bias=False))."""

  def init_fn(params):
    zeros = lambda p: jnp.zeros_like(p, jnp.float32)  # noqa: E731
    return optax.ScaleByAdamState(count=jnp.zeros([], jnp.int32), mu=jax.tree.map(zeros, params),
                                  nu=jax.tree.map(zeros, params))

  def update_fn(updates, state, params=None):
    del params
    mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, updates)
    nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state.nu, updates)
    out = jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + eps), mu, nu)
    return out, optax.ScaleByAdamState(count=optax.safe_increment(state.count), mu=mu, nu=nu)

  return optax.GradientTransformation(init_fn, update_fn)


def _decay_after_step(weight_decay: float, schedule: optax.Schedule, mask) -> optax.GradientTransformation:
  """transformers.AdamW's decay: p -= lr * wd * p' on the parameters p' after the Adam step, given
  updates u = -lr * adam: the update becomes u - lr * wd * (p + u)."""

  def init_fn(params):
    del params
    return optax.ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

  def update_fn(updates, state, params=None):
    lr = schedule(state.count)
    keep = mask(params)
    out = jax.tree.map(lambda u, p, k: u - lr * weight_decay * (p + u) if k else u, updates, params, keep)
    return out, optax.ScaleByScheduleState(count=optax.safe_increment(state.count))

  return optax.GradientTransformation(init_fn, update_fn)


def make_adamw(config: AdamWConfig, *, num_train_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
  schedule = warmup_linear_schedule(learning_rate=config.learning_rate, num_train_steps=num_train_steps,
                                    warmup_fraction=config.warmup_fraction)
  mask = lambda params: _decay_mask(params, config.no_decay)  # noqa: E731
  if config.correct_bias:
    adamw = optax.adamw(schedule, b1=config.b1, b2=config.b2, eps=config.eps, weight_decay=config.weight_decay,
                        mask=mask)
  else:
    adamw = optax.chain(_scale_by_adam_uncorrected(config.b1, config.b2, config.eps),
                        optax.scale_by_learning_rate(schedule),
                        _decay_after_step(config.weight_decay, schedule, mask))
  if config.max_grad_norm is None:
    return adamw, schedule
  return optax.chain(optax.clip_by_global_norm(config.max_grad_norm), adamw), schedule


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


# ------------------------------------------------------------------- per-parameter plan


@dataclasses.dataclass(frozen=True)
class ParamPlan:
  """How Adafactor treats one parameter (static: from its shape and logical axes)."""

  shape: tuple[int, ...]
  batch_dims: tuple[int, ...]  # stacked copies (layers): never averaged over
  rms_dims: tuple[int, ...]  # the others: clipping and parameter-scale RMS run over these
  # (row, col) parameter dims of the factored second moment, or None (full v).
  # v_row averages over col (keeps row), v_col averages over row (keeps col).
  factored: tuple[int, int] | None


def plan_param(shape: Sequence[int], axes: Sequence[str | None] | None = None, *,
               min_dim_size_to_factor: int = 128, name: str = "") -> ParamPlan:
  """t5x's rule: factor the two largest non-batch dims if the smaller is >= the minimum."""
  shape = tuple(int(d) for d in shape)
  if axes is not None and len(tuple(axes)) != len(shape):
    raise ValueError(f"Parameter {name or '?'} of shape {shape} has logical axes {tuple(axes)}: one name per "
                     "dimension is needed to find its `layers` (batch) dimension.")
  batch = tuple(i for i, a in enumerate(axes or ()) if a in BATCH_AXIS_NAMES)
  rest = [i for i in range(len(shape)) if i not in batch]
  factored = None
  if len(rest) >= 2:
    by_size = sorted(rest, key=lambda i: shape[i])  # stable: equal sizes keep their order
    row, col = by_size[-2], by_size[-1]
    if shape[row] >= min_dim_size_to_factor:
      factored = (row, col)
  return ParamPlan(shape, batch, tuple(rest), factored)


def logical_axes(boxed_params: Any) -> Any:
  """The tree of logical axis names (tuples; None for an unannotated leaf) of a boxed tree."""
  is_box = lambda x: isinstance(x, nn.LogicallyPartitioned)  # noqa: E731
  return jax.tree.map(lambda b: tuple(b.names) if is_box(b) else None, boxed_params, is_leaf=is_box)


def _plans(params: Any, param_axes: Any | None, min_dim_size_to_factor: int) -> tuple[list, Any]:
  flat, treedef = jax.tree_util.tree_flatten_with_path(params)
  if param_axes is None:
    axes = [None] * len(flat)
  else:
    try:
      axes = treedef.flatten_up_to(param_axes)
    except (ValueError, TypeError) as e:
      raise ValueError("param_axes must have the structure of the parameters (one tuple of logical axis names "
                       f"per parameter): {e}") from None
  plans = [plan_param(np.shape(x), a, min_dim_size_to_factor=min_dim_size_to_factor,
                      name=jax.tree_util.keystr(p)) for (p, x), a in zip(flat, axes)]
  return plans, treedef


# ----------------------------------------------------------------------- the transform


class AdafactorState(NamedTuple):
  count: jax.Array  # steps taken; the decay rate and the learning rate read it
  v_row: Any  # per parameter: running mean of g^2 over the column dim (factored), else (1,)
  v_col: Any  # per parameter: running mean of g^2 over the row dim (factored), else (1,)
  v: Any  # per parameter: running g^2 (not factored), else (1,)
  m: Any  # per parameter: momentum of the scaled update; None without momentum


_PLACEHOLDER = (1,)


def _state_shapes(plan: ParamPlan) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
  if plan.factored is None:
    return _PLACEHOLDER, _PLACEHOLDER, plan.shape
  row, col = plan.factored
  drop = lambda d: tuple(s for i, s in enumerate(plan.shape) if i != d)  # noqa: E731
  return drop(col), drop(row), _PLACEHOLDER


def _rms(x, dims):
  return jnp.sqrt(jnp.mean(x * x, axis=dims, keepdims=True))


def scale_by_adafactor(config: OptimizerConfig, schedule: optax.Schedule, *,
                       param_axes: Any | None = None) -> optax.GradientTransformation:
  """Adafactor's update (learning rate and sign included: apply with optax.apply_updates)."""
  if config.clipping_threshold is not None and config.clipping_threshold <= 0:
    raise ValueError(f"clipping_threshold must be > 0 or None, got {config.clipping_threshold}")
  if config.momentum is not None and not 0.0 <= config.momentum < 1.0:
    raise ValueError(f"momentum must be in [0, 1) or None, got {config.momentum}")

  def init_fn(params):
    plans, treedef = _plans(params, param_axes, config.min_dim_size_to_factor)
    shapes = [_state_shapes(p) for p in plans]
    zeros = lambda i: treedef.unflatten([jnp.zeros(s[i], jnp.float32) for s in shapes])  # noqa: E731
    m = treedef.unflatten([jnp.zeros(p.shape, jnp.float32) for p in plans]) if config.momentum is not None else None
    return AdafactorState(count=jnp.zeros([], jnp.int32), v_row=zeros(0), v_col=zeros(1), v=zeros(2), m=m)

  def update_fn(grads, state, params=None):
    if params is None:
      raise ValueError("Adafactor needs the parameters (parameter scale): call update(grads, state, params).")
    plans, treedef = _plans(params, param_axes, config.min_dim_size_to_factor)
    t = state.count.astype(jnp.float32) + 1.0
    decay = 1.0 - t ** (-config.decay_rate)  # 0 at the first step: statistics start as this gradient's
    lr = schedule(state.count)
    leaves = [treedef.flatten_up_to(x) for x in (grads, params, state.v_row, state.v_col, state.v)]
    ms = treedef.flatten_up_to(state.m) if config.momentum is not None else [None] * len(plans)
    out = [_update_one(plan, g, p, vr, vc, v, m, decay=decay, lr=lr, config=config)
           for plan, g, p, vr, vc, v, m in zip(plans, *leaves, ms)]
    updates, v_row, v_col, v, m = ([o[i] for o in out] for i in range(5))
    new_m = treedef.unflatten(m) if config.momentum is not None else None
    new_state = AdafactorState(count=optax.safe_increment(state.count), v_row=treedef.unflatten(v_row),
                               v_col=treedef.unflatten(v_col), v=treedef.unflatten(v), m=new_m)
    return treedef.unflatten(updates), new_state

  return optax.GradientTransformation(init_fn, update_fn)


def _update_one(plan: ParamPlan, g, p, v_row, v_col, v, m, *, decay, lr, config: OptimizerConfig):
  g = g.astype(jnp.float32)
  g2 = g * g + config.epsilon1
  if plan.factored is not None:
    row, col = plan.factored
    v_row = decay * v_row + (1.0 - decay) * jnp.mean(g2, axis=col)
    v_col = decay * v_col + (1.0 - decay) * jnp.mean(g2, axis=row)
    # v_hat = v_row v_col / mean(v_row): the mean runs over the row dim only (per layer).
    row_in_v_row = row if row < col else row - 1
    row_factor = (v_row / jnp.mean(v_row, axis=row_in_v_row, keepdims=True)) ** -0.5
    y = g * jnp.expand_dims(row_factor, col) * jnp.expand_dims(v_col ** -0.5, row)
  else:
    v = decay * v + (1.0 - decay) * g2
    y = g * v ** -0.5
  if config.clipping_threshold is not None:
    y = y / jnp.maximum(1.0, _rms(y, plan.rms_dims) / config.clipping_threshold)
  scale = lr
  if config.multiply_by_parameter_scale:
    scale = lr * jnp.maximum(_rms(p.astype(jnp.float32), plan.rms_dims), EPSILON2)
  u = scale * y
  if config.momentum is not None:
    m = config.momentum * m + (1.0 - config.momentum) * u
    u = m
  return (-u).astype(p.dtype), v_row, v_col, v, m


def make_optimizer(config: OptimizerConfig | AdamWConfig, *, num_train_steps: int, param_axes: Any | None = None
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """Adafactor with the paper's schedule, or AdamW. `param_axes`: `logical_axes(boxed_params)`."""
  if isinstance(config, AdamWConfig):
    return make_adamw(config, num_train_steps=num_train_steps)
  if not isinstance(config, OptimizerConfig):
    raise TypeError(f"TrainConfig.optimizer must be @OptimizerConfig() (Adafactor) or @AdamWConfig(), got "
                    f"{type(config).__name__}.")
  schedule = learning_rate_schedule(learning_rate=config.learning_rate, num_train_steps=num_train_steps,
                                    constant_fraction=config.constant_fraction)
  return scale_by_adafactor(config, schedule, param_axes=param_axes), schedule


# ---------------------------------------------------------------------------- sharding


def _pad(spec: P, ndim: int) -> tuple:
  entries = tuple(spec)
  if len(entries) > ndim:
    raise ValueError(f"PartitionSpec {spec} has more entries than the parameter's {ndim} dims")
  return entries + (None,) * (ndim - len(entries))


def state_partition_specs(config: OptimizerConfig | AdamWConfig, *, abstract_params: Any, param_specs: Any,
                          param_axes: Any | None = None) -> Any:
  """PartitionSpecs of the optimizer state, from each parameter's spec.

  Adafactor: v and m: the parameter's spec; v_row: its spec without the column dim's entry;
  v_col: without the row dim's; placeholders and the count: replicated. AdamW: its moments
  take their parameter's spec (optax.tree_map_params), counts are replicated.
  """
  if isinstance(config, AdamWConfig):
    tx, _ = make_adamw(config, num_train_steps=1)
    state = jax.eval_shape(tx.init, abstract_params)
    return optax.tree_map_params(tx, lambda _, spec: spec, state, param_specs,
                                 transform_non_params=lambda _: P(), is_leaf=lambda x: isinstance(x, P))
  plans, treedef = _plans(abstract_params, param_axes, config.min_dim_size_to_factor)
  specs = [_pad(s, len(pl.shape)) for s, pl in zip(treedef.flatten_up_to(param_specs), plans)]
  rep = P()

  def keep(entries, drop):
    return P(*(e for i, e in enumerate(entries) if i != drop))

  v_row, v_col, v = [], [], []
  for pl, s in zip(plans, specs):
    if pl.factored is None:
      v_row.append(rep), v_col.append(rep), v.append(P(*s))
    else:
      row, col = pl.factored
      v_row.append(keep(s, col)), v_col.append(keep(s, row)), v.append(rep)
  m = treedef.unflatten([P(*s) for s in specs]) if config.momentum is not None else None
  return AdafactorState(count=rep, v_row=treedef.unflatten(v_row), v_col=treedef.unflatten(v_col),
                        v=treedef.unflatten(v), m=m)


def state_shardings(config: OptimizerConfig | AdamWConfig, boxed_abstract_params: Any, mesh: Mesh,
                    rules=partitioning.DEFAULT_RULES) -> Any:
  """NamedShardings of the optimizer state, derived from the parameters' specs (`state_partition_specs`).

  Each state leaf takes exactly the spec entries of the parameter dims it keeps (v_row the
  row dim's, v_col the column's, a scanned stack's `layers` dim in both) -- never a guess
  from shapes, which goes wrong for square kernels.
  """
  specs = state_partition_specs(config, abstract_params=nn.unbox(boxed_abstract_params),
                                param_specs=partitioning.param_specs(boxed_abstract_params, rules),
                                param_axes=logical_axes(boxed_abstract_params))
  return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))
