"""The Distill objective: a student tower trained on a teacher's vectors of the same texts.

Each batch holds the texts' tokens (LEFT, RIGHT and K hard negatives, as Contrastive's) and, for every
tower, the teacher's vector of each text (float32 [B, E] features `teacher_inputs`, `teacher_targets`,
`teacher_negative_targets`, ..., read from the teacher cache by st5_jax.objectives.distill.tasks). The
loss is a weighted sum of (st5_jax.losses):

  mse_weight         * mean over every tower's rows and dims of (student - teacher)^2   (MSELoss)
  cosine_weight      * mean over every tower's rows of 1 - cos(student, teacher)
  margin_mse_weight  * MarginMSE: ((s(q,p) - s(q,n_k)) - (t(q,p) - t(q,n_k)))^2, mean over queries and
                       their K negatives                                                 (MarginMSELoss)
  kl_weight          * KL(teacher || student) of each query's softmax over the batch's B(1+K) candidates,
                       cosines / kl_temperature, times kl_temperature^2                  (DistillKLDivLoss)

s and t are cosines of the student's and of the teacher's vectors. The two embedding terms compare
vectors directly, so they need the teacher's dimension E to equal the student's (st5_model.embedding_dim;
a clear error otherwise: no projection is learned); the two score terms take any teacher. The teacher's
vectors are used as the cache holds them (its own `encode`). GradCache (TrainConfig.grad_cache_chunks)
works: the loss is over per-example embeddings and the teacher's vectors come with the batch.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Mapping

import jax
import jax.numpy as jnp

from st5_jax import flops, losses
from st5_jax.features import LEFT, MAX_NEGATIVES, NEGATIVE_TARGETS, RIGHT, negative_features
from st5_jax.objectives import grad_cache
from st5_jax.objectives.base import Feature, Objective, ObjectiveConfigError, ValueAndGrad, register
from st5_jax.objectives.contrastive import by_feature, embed_towers, make_embed, negative_lengths, negative_sides

Array = jax.Array
TEACHER_PREFIX = "teacher_"


def teacher_feature(task_key: str) -> str:
  """The batch feature of the teacher's vectors of a text feature: inputs -> teacher_inputs."""
  return TEACHER_PREFIX + task_key


def text_features(num_negatives: int) -> list[tuple[str, str]]:
  """(task feature, model feature) of the texts of an example with K hard negatives, in order."""
  out = [("inputs", LEFT), ("targets", RIGHT)]
  return out + (negative_features(num_negatives) if num_negatives else [])


def teacher_features(num_negatives: int) -> dict[str, str]:
  """model feature of a text tower -> the batch feature of its teacher vectors."""
  return {model_key: teacher_feature(task_key) for task_key, model_key in text_features(num_negatives)}


@dataclasses.dataclass(frozen=True)
class DistillLoss:
  """The weights and temperatures of the loss (the objective's fields), and the loss over embeddings."""

  mse_weight: float
  cosine_weight: float
  margin_mse_weight: float
  kl_weight: float
  kl_temperature: float
  kl_teacher_temperature: float | None

  def __call__(self, emb: Mapping[str, Array], teacher: Mapping[str, Array],
               negatives: list[str]) -> tuple[Array, dict[str, Array]]:
    """(loss, metrics) from the student's [B, D] and the teacher's [B, E] vectors of every tower."""
    sides = [LEFT, RIGHT] + list(negatives)
    D, E = int(emb[LEFT].shape[-1]), int(teacher[LEFT].shape[-1])
    terms = {}
    if self.mse_weight or self.cosine_weight:
      if D != E:
        raise ValueError(f"Distill.mse_weight / Distill.cosine_weight compare the student's {D}-d embeddings with the "
                         f"teacher's {E}-d vectors: set st5_model.embedding_dim = {E} (the teacher's dimension), or "
                         "train on scores only (Distill.margin_mse_weight, Distill.kl_weight take any teacher)")
      student_NxD = jnp.concatenate([emb[s] for s in sides], axis=0)
      teacher_NxD = jnp.concatenate([teacher[s] for s in sides], axis=0)
      if self.mse_weight:
        terms["mse"] = losses.embedding_mse(student_NxD, teacher_NxD)
      if self.cosine_weight:
        terms["cosine"] = losses.embedding_cosine(student_NxD, teacher_NxD)
    if self.margin_mse_weight:
      terms["margin_mse"] = losses.margin_mse(
          emb[LEFT], emb[RIGHT], jnp.stack([emb[s] for s in negatives]),
          teacher[LEFT], teacher[RIGHT], jnp.stack([teacher[s] for s in negatives]))
    if self.kl_weight:
      cands = [RIGHT] + list(negatives)  # st5_jax.losses.contrastive_logits' column order
      terms["kl"] = losses.distill_kl(
          emb[LEFT], jnp.concatenate([emb[s] for s in cands], axis=0),
          teacher[LEFT], jnp.concatenate([teacher[s] for s in cands], axis=0),
          temperature=self.kl_temperature, teacher_temperature=self.kl_teacher_temperature)
    weights = {"mse": self.mse_weight, "cosine": self.cosine_weight, "margin_mse": self.margin_mse_weight,
               "kl": self.kl_weight}
    loss = sum(weights[k] * v for k, v in terms.items())
    return loss, {"loss": loss, **terms}


@register
@dataclasses.dataclass(frozen=True)
class Distill(Objective):
  """A student trained on a teacher cache's vectors (module docstring); gin `@Distill()`."""

  name: ClassVar[str] = "distill"
  example_gin: ClassVar[str] = "distill_tiny_cpu.gin"
  task_modules: ClassVar[tuple[str, ...]] = ("st5_jax.objectives.distill.tasks",)

  mse_weight: float = 1.0
  cosine_weight: float = 0.0
  margin_mse_weight: float = 0.0
  kl_weight: float = 0.0
  kl_temperature: float = 0.05
  kl_teacher_temperature: float | None = None  # None: kl_temperature
  # K: hard negatives per example in the batch (0: pairs); the task's (distill_task.num_negatives) must match.
  num_negatives: int = 0

  def __post_init__(self):
    weights = {"mse_weight": self.mse_weight, "cosine_weight": self.cosine_weight,
               "margin_mse_weight": self.margin_mse_weight, "kl_weight": self.kl_weight}
    for k, w in weights.items():
      if isinstance(w, bool) or not isinstance(w, (int, float)) or w < 0:
        raise ObjectiveConfigError(f"Distill.{k} must be a number >= 0, got {w!r}")
    if not any(weights.values()):
      raise ObjectiveConfigError(f"Distill has every weight at 0 ({', '.join(weights)}): set at least one")
    for k in ("kl_temperature", "kl_teacher_temperature"):
      t = getattr(self, k)
      if t is not None and not t > 0:
        raise ObjectiveConfigError(f"Distill.{k} must be > 0, got {t!r}")
    if isinstance(self.num_negatives, bool) or not isinstance(self.num_negatives, int) \
        or not 0 <= self.num_negatives <= MAX_NEGATIVES:
      raise ObjectiveConfigError(f"Distill.num_negatives must be an int in 0..{MAX_NEGATIVES} (hard negatives per "
                                 f"example), got {self.num_negatives!r}")
    if self.margin_mse_weight and not self.num_negatives:
      raise ObjectiveConfigError("Distill.margin_mse_weight needs hard negatives (a margin is s(q,p) - s(q,n)): set "
                                 "Distill.num_negatives >= 1 with a cache of triples, or use Distill.kl_weight")

  def loss(self) -> DistillLoss:
    return DistillLoss(self.mse_weight, self.cosine_weight, self.margin_mse_weight, self.kl_weight,
                       self.kl_temperature, self.kl_teacher_temperature)

  def features(self, lengths: Mapping[str, int]) -> dict[str, Feature]:
    K = self.num_negatives
    out = {LEFT: Feature("inputs"), RIGHT: Feature("targets")}
    if K:
      lengths[NEGATIVE_TARGETS]  # noqa: B018  (KeyError: negatives need their length)
      out.update({model_key: Feature(k) for model_key, k in negative_lengths(lengths, K)})
    teacher = {name: Feature(name, "float32") for name in teacher_features(K).values()}
    dims = {name: lengths[name] for name in teacher}  # KeyError: a length the data config must give
    if len(set(dims.values())) != 1:
      raise ObjectiveConfigError(f"the teacher's vectors have one dimension; DataConfig.feature_lengths gives {dims} "
                                 "(set them all to the teacher's, e.g. the TEACHER_DIM macro of distill_tiny_cpu.gin)")
    for f in out.values():
      lengths[f.length_key]  # noqa: B018
    return {**out, **teacher}

  def make_value_and_grad(self, model, boxed_params, model_config, train_config) -> ValueAndGrad:
    embed = make_embed(model, boxed_params, model_config)  # by side for asymmetric towers
    loss_on, chunks, K = self.loss(), train_config.grad_cache_chunks, self.num_negatives
    teacher_of = teacher_features(K)

    def sides_of(batch):
      return [LEFT, RIGHT] + (negative_sides(batch, K) if K else [])

    def loss_fn(params, batch, key):
      sides = sides_of(batch)
      emb = embed_towers(embed, params, {s: batch[s] for s in sides}, key)
      return loss_on(emb, {s: batch[teacher_of[s]] for s in sides}, sides[2:])

    def grad_cache_value_and_grad(params, batch, key):
      sides = sides_of(batch)
      all_sides = [m for _, m in text_features(K)]
      side_keys = dict(zip(all_sides, jax.random.split(key, len(all_sides))))

      def loss_on_embeddings(e, params_, batch_):
        del params_
        return loss_on(e, {s: batch_[teacher_of[s]] for s in sides}, sides[2:])

      return grad_cache.value_and_grad(by_feature(embed, sides), loss_on_embeddings, params, batch,
                                       {s: (batch[s], side_keys[s]) for s in sides}, chunks=chunks)

    if chunks > 1:
      return grad_cache_value_and_grad
    return jax.value_and_grad(loss_fn, has_aux=True)

  def step_flops(self, model_config, *, global_batch_size: int, lengths: Mapping[str, int]) -> float:
    """3x the student's forward (every tower, the score matrices), plus the teacher's score matrices once."""
    B, K = global_batch_size, self.num_negatives
    towers = [lengths["inputs"], lengths["targets"]]
    towers += [lengths[k] for _, k in negative_lengths(lengths, K)] if K else []
    forward = sum(B * flops.encoder_forward_flops(model_config, L) for L in towers)
    D, E = model_config.output_dim, lengths[teacher_feature("inputs")]
    teacher = 0.0
    if self.kl_weight:  # [B, B(1+K)] cosines of the student's and of the teacher's vectors
      forward += 2 * B * B * (1 + K) * D
      teacher += 2 * B * B * (1 + K) * E
    return 3.0 * forward + teacher

