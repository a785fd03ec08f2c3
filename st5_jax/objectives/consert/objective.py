"""ConSERT (Yan et al., 2021) training objectives on the Sentence-T5 tower: gin `@ConsertUnsup()`, `@ConsertJoint()`.

  ConsertUnsup   NT-Xent between two augmented views of every sentence of the batch
                 (features: LEFT only). The paper's unsupervised recipe, and -- started
                 from a trained model via `run.init_from` -- its sup-unsup and joint-unsup
                 continuations.
  ConsertJoint   NLI cross-entropy of the classifier on [u, v, |u-v|, max(u, v)^2] (the
                 objective's own head, st5_jax/objectives/consert/model.py) plus
                 weight x (NT-Xent on the premises' two views + NT-Xent on the
                 hypotheses'), features LEFT, RIGHT, LABELS. The cross-entropy uses the
                 first view (the official joint recipe's first view is `none`).
                 With weight 0 it is the plain SBERT-style NLI classifier (no second view).

Each view is its own forward pass of the tower with its own dropout key and per-example
augmentation randomness (st5_jax/objectives/consert/augment.py). The NT-Xent weight follows the
official code: the loss adds `weight * (loss_a + loss_b)`, the sum of the two
directions, per sentence set; 0.15 (the official `cl_rate`) is 0.3 times the paper's
mean-over-2N L_con. With an NT-Xent-only loss the weight merely rescales the gradient,
which Adam (the paper's optimizer) and Adafactor (update clipping, relative scale)
largely ignore; in ConsertJoint it sets the balance against the cross-entropy.

Losses are computed on global [B, D] arrays under jit, so negatives span the whole
batch on every device and host (as the ST5 loss). GradCache applies
(st5_jax/objectives/grad_cache.py): the views are a parameter-free plan (positions /
keep masks) plus a forward pass, so each chunk recomputes exactly its rows; the
adversarial view needs the cross-entropy's gradient before its own forward pass and is
refused with GradCache.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import jax
import jax.numpy as jnp

from st5_jax import flops, losses
from st5_jax.configs import ST5Config
from st5_jax.features import LABELS, LEFT, RIGHT
from st5_jax.objectives import grad_cache
from st5_jax.objectives.base import (Feature, Objective, ObjectiveConfigError, ValueAndGrad, rebox, refuse_asymmetric,
                                     register)
from st5_jax.objectives.consert import augment
from st5_jax.objectives.consert.model import ConsertTower

Array = jax.Array

UNSUP, JOINT = "consert_unsup", "consert_joint"
SHUFFLE_MODES = ("auto", "positions", "tokens")
# Poolings that see the encoder outputs as a set (mean; the decoder's cross-attention has no
# position bias), where permuting token ids equals the faithful position shuffle.
TOKEN_SHUFFLE_POOLINGS = ("enc_mean", "encdec_first")


@dataclasses.dataclass(frozen=True)
class View:
  name: str = "none"
  rate: float = 0.0  # cutoff / dropout rate; for "adversarial" the FGV norm eps


@dataclasses.dataclass(frozen=True)
class Spec:
  """The checked settings of one ConSERT run (`_Consert.spec`)."""

  objective: str  # UNSUP or JOINT
  views: tuple[View, View]
  temperature: float
  weight: float
  shuffle_tokens: bool  # the cheap shuffle: permute token ids (not for enc_first)
  grad_cache_chunks: int


# ------------------------------------------------------------------------------ towers


class Tower:
  """The training-mode tower with augmentation hooks (parameters re-boxed, so logical sharding
  constraints reach scanned layers: st5_jax.objectives.base.rebox)."""

  def __init__(self, model, boxed_params: Any | None, *, shuffle_tokens: bool):
    self.model = model
    self.boxed = boxed_params
    self.shuffle_tokens = shuffle_tokens
    self.dim = model.config.t5.emb_dim

  def apply(self, params, *args, **kw):
    return self.model.apply({"params": rebox(self.boxed, params)}, *args, **kw)

  def inputs(self, params, tokens_BxL: Array, plan: Mapping[str, Array], *,
             need_embeddings: bool = False) -> tuple[Array, dict[str, Array]]:
    """(tokens the tower sees, hooks) of one view. Embeddings are computed only when the view
    changes them (or `need_embeddings`), so `none`/`shuffle` run the unmodified model."""
    mask_BxL = tokens_BxL > 0
    hooks: dict[str, Array] = {}
    tokens = tokens_BxL
    if "positions" in plan:
      if self.shuffle_tokens:
        tokens = augment.permute_tokens(tokens_BxL, plan["positions"])
      else:
        hooks["positions_BxL"] = plan["positions"]
    if "span_keep" in plan:
      # Outside the span: the padding token's embedding (ids set to 0), masked as keys; pooling
      # still averages over the original tokens (as the official Pooling module does).
      hooks["attention_mask_BxL"] = plan["span_keep"]
      lookup = jnp.where(plan["span_keep"], tokens, 0)
    else:
      lookup = tokens
    if need_embeddings or any(k in plan for k in ("row_keep", "col_keep", "elem_keep", "span_keep")):
      x_BxLxD = self.apply(params, lookup, method="embed_tokens")
      hooks["embeddings_BxLxD"] = augment.apply_keep(x_BxLxD, mask_BxL, plan)
    return tokens, hooks

  def encode(self, params, tokens_BxL: Array, hooks: Mapping[str, Array], key: Array) -> Array:
    """The tower's output before its L2 normalisation: the official ConSERT classifies the raw
    mean-pooled vector (AdvCLSoftmaxLoss._reps_to_output; no Normalize module), and NT-Xent
    normalises its inputs itself (losses.nt_xent_loss), so both terms read this one vector.
    Inference and evaluation still use the normalised output (SentenceT5.__call__)."""
    return self.apply(params, tokens_BxL, deterministic=False, rngs={"dropout": key}, method="project", **hooks)

  def __call__(self, params, tokens_BxL: Array, plan: Mapping[str, Array], key: Array) -> Array:
    tokens, hooks = self.inputs(params, tokens_BxL, plan)
    return self.encode(params, tokens, hooks, key)

  def classify(self, params, u_BxD: Array, v_BxD: Array) -> Array:
    return self.apply(params, u_BxD, v_BxD, method="classify")


# ------------------------------------------------------------------------------ losses


def _nt_xent_term(a_BxD, b_BxD, spec: Spec):
  """weight * (loss_a + loss_b) (the official scaling) and the NT-Xent metrics."""
  l_con, m = losses.nt_xent_loss(a_BxD, b_BxD, temperature=spec.temperature)
  return spec.weight * 2.0 * l_con, m


def _unsup_loss(spec: Spec):
  def loss_on(embs, params, batch):
    del params, batch
    term, m = _nt_xent_term(embs["view1"], embs["view2"], spec)
    metrics = {k: v for k, v in m.items() if k != "loss"}
    return term, dict(metrics, loss=term, nt_xent=m["loss"])
  return loss_on


def _joint_loss(spec: Spec, tower: Tower):
  def loss_on(embs, params, batch):
    logits_BxC = tower.classify(params, embs["premise1"], embs["hypothesis1"]).astype(jnp.float32)
    labels_B = batch[LABELS].astype(jnp.int32)
    logp_BxC = jax.nn.log_softmax(logits_BxC, axis=-1)
    ce = -jnp.mean(jnp.sum(jax.nn.one_hot(labels_B, logp_BxC.shape[-1]) * logp_BxC, axis=-1))
    metrics = {"nli_loss": ce, "accuracy": jnp.mean((jnp.argmax(logits_BxC, -1) == labels_B).astype(jnp.float32))}
    loss = ce
    if spec.weight > 0:
      term_p, mp = _nt_xent_term(embs["premise1"], embs["premise2"], spec)
      term_h, mh = _nt_xent_term(embs["hypothesis1"], embs["hypothesis2"], spec)
      loss = ce + term_p + term_h
      metrics.update(nt_xent_premise=mp["loss"], nt_xent_hypothesis=mh["loss"],
                     nt_xent_accuracy=0.5 * (mp["accuracy"] + mh["accuracy"]),
                     positive_similarity=0.5 * (mp["positive_similarity"] + mh["positive_similarity"]),
                     negative_similarity=0.5 * (mp["negative_similarity"] + mh["negative_similarity"]),
                     uniformity=0.5 * (mp["uniformity"] + mh["uniformity"]))
    metrics["loss"] = loss
    return loss, metrics
  return loss_on


def plan_towers(spec: Spec, batch: Mapping[str, Array], key: Array, *, dim: int) -> dict[str, tuple]:
  """{tower name: (tokens, plan, dropout key)} of one step; plans are per example."""
  if spec.objective == UNSUP:
    sides = {"": batch[LEFT]}
  else:
    sides = {"premise": batch[LEFT], "hypothesis": batch[RIGHT]}
  num_views = 1 if (spec.objective == JOINT and spec.weight == 0) else 2
  towers = {}
  keys = jax.random.split(key, 2 * len(sides) * num_views)
  i = 0
  for side, tokens in sides.items():
    for v in range(num_views):
      view = spec.views[v]
      plan = ({} if view.name == "adversarial" else
              augment.sample_plan(view.name, tokens > 0, keys[i], rate=view.rate, dim=dim))
      towers[f"{side or 'view'}{v + 1}"] = (tokens, plan, keys[i + 1])
      i += 2
  return towers


def _adversarial_embeddings(tower: Tower, spec: Spec, params, batch, towers) -> dict[str, Array]:
  """Embeddings of all towers, the second view being FGV on the first view's inputs."""
  inputs = {}
  for side in ("premise", "hypothesis"):
    tokens, plan, _ = towers[f"{side}1"]
    inputs[side] = tower.inputs(params, tokens, plan, need_embeddings=True)

  frozen = jax.lax.stop_gradient(params)

  def nli_loss(xp_BxLxD, xh_BxLxD):
    embs = {}
    for side, x in (("premise", xp_BxLxD), ("hypothesis", xh_BxLxD)):
      tokens, hooks = inputs[side]
      embs[f"{side}1"] = tower.encode(frozen, tokens, dict(hooks, embeddings_BxLxD=x), towers[f"{side}1"][2])
    return _joint_loss(dataclasses.replace(spec, weight=0.0), tower)(embs, frozen, batch)[0]

  x_clean = {s: jax.lax.stop_gradient(inputs[s][1]["embeddings_BxLxD"]) for s in inputs}
  g_p, g_h = jax.grad(nli_loss, argnums=(0, 1))(x_clean["premise"], x_clean["hypothesis"])
  embs = {}
  for side, g in (("premise", g_p), ("hypothesis", g_h)):
    tokens, hooks = inputs[side]
    x = hooks["embeddings_BxLxD"]
    noise = jax.lax.stop_gradient(augment.fgv_noise(g, towers[f"{side}1"][0] > 0, eps=spec.views[1].rate))
    embs[f"{side}1"] = tower.encode(params, tokens, hooks, towers[f"{side}1"][2])
    embs[f"{side}2"] = tower.encode(params, tokens, dict(hooks, embeddings_BxLxD=x + noise.astype(x.dtype)),
                                    towers[f"{side}2"][2])
  return embs


def make_value_and_grad(spec: Spec, model: ConsertTower, boxed_params: Any | None) -> ValueAndGrad:
  """((loss, metrics), grads) of the ConSERT objective `spec`; GradCache when configured."""
  tower = Tower(model, boxed_params, shuffle_tokens=spec.shuffle_tokens)
  loss_on = _unsup_loss(spec) if spec.objective == UNSUP else _joint_loss(spec, tower)
  adversarial = spec.views[1].name == "adversarial" and spec.weight > 0

  def loss_fn(params, batch, key):
    towers = plan_towers(spec, batch, key, dim=tower.dim)
    if adversarial:
      embs = _adversarial_embeddings(tower, spec, params, batch, towers)
    else:
      embs = {name: tower(params, tokens, plan, k) for name, (tokens, plan, k) in towers.items()}
    return loss_on(embs, params, batch)

  def value_and_grad(params, batch, key):
    if not spec.grad_cache_chunks:
      return jax.value_and_grad(loss_fn, has_aux=True)(params, batch, key)
    towers = plan_towers(spec, batch, key, dim=tower.dim)
    return grad_cache.value_and_grad(lambda p, inputs, k: tower(p, *inputs, k), loss_on, params, batch,
                                     {name: ((tokens, plan), k) for name, (tokens, plan, k) in towers.items()},
                                     chunks=spec.grad_cache_chunks)

  return value_and_grad


# ------------------------------------------------------------------------------ the objectives


@dataclasses.dataclass(frozen=True)
class _Consert(Objective):
  """Settings shared by the two ConSERT objectives (the official scripts' names in brackets).

  Views: none, shuffle, token_cutoff, feature_cutoff, span_cutoff, dropout, adversarial
  (second view of ConsertJoint only); the rate is the cutoff/dropout rate, or FGV's eps.
  """

  task_modules: ClassVar[tuple[str, ...]] = ("st5_jax.objectives.consert.tasks",)

  view1: str = "none"
  view1_rate: float = 0.0
  view2: str = "none"
  view2_rate: float = 0.0
  temperature: float = 0.1  # [temperature]
  # Multiplies the sum of NT-Xent's two directions (the official `cl_rate`; 0.3 x the paper's L_con).
  weight: float = 0.15
  # The shuffle view: "positions" (per-example relative bias, faithful), "tokens" (permute token
  # ids; equal for enc_mean and encdec_first, not enc_first), "auto" (tokens where equal).
  shuffle: str = "auto"

  def spec(self, model_config: ST5Config, train_config: Any) -> Spec:
    """Validates the settings against the model and run; clear errors."""
    cls = type(self).__name__
    views = (View(self.view1, float(self.view1_rate)), View(self.view2, float(self.view2_rate)))
    for i, v in enumerate(views, 1):
      if v.name not in augment.VIEWS:
        raise ObjectiveConfigError(f"{cls}.view{i} must be one of {augment.VIEWS}, got {v.name!r}")
      if v.name in augment.RATED_VIEWS and not 0.0 < v.rate < 1.0:
        raise ObjectiveConfigError(f"{cls}.view{i}_rate must be in (0, 1) for {v.name}, got {v.rate}")
      if v.name == "adversarial" and not v.rate > 0:
        raise ObjectiveConfigError(f"{cls}.view{i}_rate is the FGV norm eps for 'adversarial'; must be > 0, "
                                   f"got {v.rate} (the official default is 1.0)")
    if views[0].name == "adversarial":
      raise ObjectiveConfigError("'adversarial' can only be the second view (it perturbs the first view's embeddings).")
    if views[1].name == "adversarial" and self.name != JOINT:
      raise ObjectiveConfigError("The 'adversarial' view needs the NLI loss's gradient: use @ConsertJoint().")
    if self.temperature <= 0:
      raise ObjectiveConfigError(f"{cls}.temperature must be > 0, got {self.temperature}")
    if self.weight < 0 or (self.name == UNSUP and self.weight == 0):
      raise ObjectiveConfigError(f"{cls}.weight must be > 0 (>= 0 for ConsertJoint), got {self.weight}")
    if self.shuffle not in SHUFFLE_MODES:
      raise ObjectiveConfigError(f"{cls}.shuffle must be one of {SHUFFLE_MODES}, got {self.shuffle!r}")
    if self.shuffle == "tokens" and model_config.pooling not in TOKEN_SHUFFLE_POOLINGS:
      raise ObjectiveConfigError(
          f"{cls}.shuffle='tokens' (permuting token ids) equals ConSERT's position shuffle only "
          f"for {TOKEN_SHUFFLE_POOLINGS} pooling, not {model_config.pooling}; use 'positions' or 'auto'.")
    chunks = train_config.grad_cache_chunks if train_config.grad_cache_chunks > 1 else 0
    if chunks and views[1].name == "adversarial":
      raise ObjectiveConfigError(
          "GradCache (grad_cache_chunks > 1) cannot compute the adversarial view: its input needs the "
          "full-batch NLI gradient before its own forward pass. Use grad_cache_chunks=0 or another view.")
    shuffle_tokens = self.shuffle == "tokens" or (self.shuffle == "auto" and
                                                  model_config.pooling in TOKEN_SHUFFLE_POOLINGS)
    return Spec(self.name, views, float(self.temperature), float(self.weight), shuffle_tokens, chunks)

  def check(self, model_config, train_config) -> None:
    refuse_asymmetric(self, model_config)
    self.spec(model_config, train_config)

  def make_model(self, model_config: ST5Config) -> ConsertTower:
    return ConsertTower(model_config)

  def make_value_and_grad(self, model, boxed_params, model_config, train_config) -> ValueAndGrad:
    return make_value_and_grad(self.spec(model_config, train_config), model, boxed_params)

  def _sides(self) -> tuple[str, ...]:
    return ("inputs",) if self.name == UNSUP else ("inputs", "targets")

  def step_flops(self, model_config, *, global_batch_size, lengths) -> float:
    """Two views (forward passes) of each sentence set, each set with a [2B, 2B] NT-Xent similarity
    matrix; forward + backward = 3x forward (the NLI classifier is negligible; FGV's extra forward
    and backward pass is not counted)."""
    B = global_batch_size
    sides = [lengths[k] for k in self._sides()]
    forward = sum(2 * B * flops.encoder_forward_flops(model_config, L) for L in sides)
    forward += len(sides) * 2 * (2 * B) ** 2 * model_config.output_dim  # NT-Xent similarities
    return 3.0 * forward


@register
@dataclasses.dataclass(frozen=True)
class ConsertUnsup(_Consert):
  """NT-Xent on two views of each LEFT sentence; gin `@ConsertUnsup()`."""

  name: ClassVar[str] = UNSUP
  example_gin: ClassVar[str] = "consert_unsup_tiny_cpu.gin"

  def features(self, lengths: Mapping[str, int]) -> dict[str, Feature]:
    lengths["inputs"]  # noqa: B018  (KeyError: a length the data config must give)
    return {LEFT: Feature("inputs")}


@register
@dataclasses.dataclass(frozen=True)
class ConsertJoint(_Consert):
  """NLI cross-entropy + weight x NT-Xent on both sides' views; gin `@ConsertJoint()`."""

  name: ClassVar[str] = JOINT
  example_gin: ClassVar[str] = "consert_joint_tiny_cpu.gin"
  head_prefixes: ClassVar[tuple[str, ...]] = ("nli_classifier/",)

  # Classes of the NLI classifier (contradiction 0, entailment 1, neutral 2).
  nli_classes: int = 3

  def __post_init__(self):
    if self.nli_classes < 2:
      raise ObjectiveConfigError(f"ConsertJoint.nli_classes must be at least 2, got {self.nli_classes}")

  def make_model(self, model_config: ST5Config) -> ConsertTower:
    return ConsertTower(model_config, nli_classes=self.nli_classes)

  def features(self, lengths: Mapping[str, int]) -> dict[str, Feature]:
    lengths["inputs"], lengths["targets"]  # noqa: B018  (KeyError: a length the data config must give)
    return {LEFT: Feature("inputs"), RIGHT: Feature("targets"), LABELS: Feature(None)}
