"""Contrastive losses of Sentence-T5 (paper eqs. 13-15), pure jnp.

All inputs are L2-normalised embeddings of the *global* batch (under jit on a mesh
the arrays are global, so every query is scored against every positive and hard
negative on every device and host):

  eq. 13   L = -1/B sum_i log( e^{s(q_i, p_i)/t} / sum_j e^{s(q_i, p_j)/t} )
  eq. 14   the denominator also sums e^{s(q_i, n_j)/t} over all hard negatives n_j
  eq. 15   alignment  = E_pos ||f(x) - f(y)||^2
           uniformity = log E_{x != y} e^{-2 ||f(x) - f(y)||^2}

s is the dot product (= cosine for unit vectors) and t the temperature (0.01).

SimCSE's supervised loss (Gao et al. 2021; also LayerAttPooler's, cl/models.py) is eq. 14
with s the cosine, t = 0.05, and a constant `hard_negative_weight` added to the logit of
each query's own hard negative (SimCSE's default 0, LayerAttPooler's 1.0):
`in_batch_softmax_loss(..., similarity="cosine", hard_negative_weight=w)`.

K hard negatives per query (mined negatives: GTR, E5, Tevatron's `num_target_passages`)
generalise eq. 14: each query is scored against all B positives and all B*K negatives of
the batch, logits [B, B*(1+K)], columns [positives | every example's negative 0 | ... |
every example's negative K-1]. `hard_negative_weight` is added to a query's logits against
each of its OWN K negatives. The bidirectional term stays positives -> queries [B, B]:
negatives never act as queries. K = 1 is eq. 14 as before, value for value.

Matryoshka representation learning (Kusupati et al. 2022; sentence-transformers' MatryoshkaLoss):
`matryoshka_loss` evaluates any of these losses on the first d dimensions of every embedding,
re-normalised, for each d of `dims`, and sums the losses weighted by `weights`.

Distillation from a teacher's embeddings (st5_jax.objectives.distill): `embedding_mse` and
`embedding_cosine` compare each student embedding with the teacher's vector of the same text;
`margin_mse` (sentence-transformers' MarginMSELoss) and `distill_kl` (its DistillKLDivLoss, over
the batch's candidates) compare scores, cosines of the student's and of the teacher's vectors.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

Array = jax.Array


def negatives_KBxD(right_neg: Array | Sequence[Array] | None) -> tuple[Array | None, int]:
  """Hard negatives as [K*B, D] rows (negative k of example j at row k*B + j), and K.

  Accepts one [B, D] array (K = 1), a [B, K, D] array, or a sequence of K [B, D] arrays
  (one per negative tower); None is no negatives (K = 0).
  """
  if right_neg is None:
    return None, 0
  if isinstance(right_neg, (list, tuple)):
    if not right_neg:
      raise ValueError("hard negatives: an empty sequence; pass None for no hard negatives")
    return jnp.concatenate(right_neg, axis=0), len(right_neg)
  if right_neg.ndim == 2:
    return right_neg, 1
  if right_neg.ndim != 3:
    raise ValueError(f"hard negatives must be [B, D] or [B, K, D], got shape {right_neg.shape}")
  B, K, D = right_neg.shape
  return jnp.swapaxes(right_neg, 0, 1).reshape(K * B, D), K


def contrastive_logits(left_BxD: Array, right_BxD: Array, right_neg: Array | Sequence[Array] | None = None, *,
                       temperature: float = 0.01) -> Array:
  """Query-vs-candidates logits [B, B*(1+K)]: positives first, then the K negatives (negatives_KBxD's order)."""
  neg_KBxD, _ = negatives_KBxD(right_neg)
  cands_CxD = right_BxD if neg_KBxD is None else jnp.concatenate([right_BxD, neg_KBxD], axis=0)
  sims_BxC = jnp.einsum("bd,cd->bc", left_BxD.astype(jnp.float32), cands_CxD.astype(jnp.float32))
  return sims_BxC / temperature


def _softmax_xent(logits_BxC: Array, label_smoothing: float) -> tuple[Array, Array]:
  """Per-example cross-entropy with targets on the diagonal, and top-1 correctness."""
  B, C = logits_BxC.shape
  labels_BxC = jax.nn.one_hot(jnp.arange(B), C, dtype=jnp.float32)
  if label_smoothing:
    labels_BxC = labels_BxC * (1.0 - label_smoothing) + label_smoothing / C
  logp_BxC = jax.nn.log_softmax(logits_BxC, axis=-1)
  xent_B = -jnp.sum(labels_BxC * logp_BxC, axis=-1)
  correct_B = jnp.argmax(logits_BxC, axis=-1) == jnp.arange(B)
  return xent_B, correct_B


def alignment(x_BxD: Array, y_BxD: Array) -> Array:
  """E ||x_i - y_i||^2 over positive pairs (lower is better)."""
  return jnp.mean(jnp.sum(jnp.square(x_BxD - y_BxD), axis=-1))


def uniformity(x_NxD: Array) -> Array:
  """log E_{i != j} exp(-2 ||x_i - x_j||^2) (lower is better)."""
  N = x_NxD.shape[0]
  # |x_i - x_j|^2 from the Gram matrix: [N, N] memory, never [N, N, D].
  norms_N = jnp.sum(jnp.square(x_NxD), axis=-1)
  sq_NxN = jnp.maximum(norms_N[:, None] + norms_N[None, :] - 2.0 * (x_NxD @ x_NxD.T), 0.0)
  off_diag = ~jnp.eye(N, dtype=bool)
  # logsumexp over off-diagonal pairs minus log(count): stable for any temperature of the data.
  return jax.nn.logsumexp(jnp.where(off_diag, -2.0 * sq_NxN, -jnp.inf)) - jnp.log(N * (N - 1.0))


def _unit(x_BxD: Array) -> Array:
  # As torch.nn.CosineSimilarity (eps 1e-8 on each norm).
  return x_BxD / jnp.maximum(jnp.linalg.norm(x_BxD, axis=-1, keepdims=True), 1e-8)


def in_batch_softmax_loss(left_BxD: Array, right_BxD: Array, right_neg: Array | Sequence[Array] | None = None, *,
                          temperature: float = 0.01, bidirectional: bool = False,
                          label_smoothing: float = 0.0, similarity: str = "dot",
                          hard_negative_weight: float = 0.0) -> tuple[Array, dict[str, Array]]:
  """Mean loss (eq. 13, or eq. 14 with hard negatives) and batch metrics.

  right_neg: None, [B, D] (one hard negative per query), [B, K, D] or a sequence of K
  [B, D] arrays (K per query); each query is scored against every positive and every
  negative of the batch, logits [B, B*(1+K)]. With `bidirectional`, the loss is the mean
  of the query->candidate term and an answer->question term (positives scored against
  all queries of the batch, [B, B]; negatives are never queries). `similarity="cosine"`
  normalises the embeddings first; `hard_negative_weight` is added to the logits of
  query i against its own K hard negatives (SimCSE).
  """
  if similarity not in ("dot", "cosine"):
    raise ValueError(f"similarity must be 'dot' or 'cosine', got {similarity!r}")
  left_BxD = left_BxD.astype(jnp.float32)
  right_BxD = right_BxD.astype(jnp.float32)
  neg_KBxD, K = negatives_KBxD(right_neg)
  if neg_KBxD is not None:
    neg_KBxD = neg_KBxD.astype(jnp.float32)
  if similarity == "cosine":
    left_BxD, right_BxD = _unit(left_BxD), _unit(right_BxD)
    neg_KBxD = None if neg_KBxD is None else _unit(neg_KBxD)
  logits_BxC = contrastive_logits(left_BxD, right_BxD, neg_KBxD, temperature=temperature)
  B = left_BxD.shape[0]
  sims_BxC = logits_BxC * temperature
  if neg_KBxD is not None and hard_negative_weight:
    # Query i's own negatives are columns B + k*B + i, k < K.
    own_negatives_BxC = jnp.pad(jnp.tile(jnp.eye(B, dtype=jnp.float32), (1, K)), ((0, 0), (B, 0)))
    logits_BxC = logits_BxC + hard_negative_weight * own_negatives_BxC
  xent_B, correct_B = _softmax_xent(logits_BxC, label_smoothing)
  loss = jnp.mean(xent_B)
  if bidirectional:
    logits_rev_BxB = contrastive_logits(right_BxD, left_BxD, temperature=temperature)
    xent_rev_B, _ = _softmax_xent(logits_rev_BxB, label_smoothing)
    loss = 0.5 * (loss + jnp.mean(xent_rev_B))

  sims_BxB = sims_BxC[:, :B]
  off_diag = ~jnp.eye(B, dtype=bool)
  metrics = {
      "loss": loss,
      "accuracy": jnp.mean(correct_B.astype(jnp.float32)),
      "positive_similarity": jnp.mean(jnp.diagonal(sims_BxB)),
      "negative_similarity": jnp.sum(jnp.where(off_diag, sims_BxB, 0.0)) / max(B * (B - 1.0), 1.0),
      "alignment": alignment(left_BxD, right_BxD),
      "uniformity": uniformity(jnp.concatenate([left_BxD, right_BxD], axis=0)),
  }
  if neg_KBxD is not None:
    # Mean similarity of each query to its own K negatives (the diagonal of every [B, B] negative block).
    sims_KxBxB = sims_BxC[:, B:].reshape(B, K, B).swapaxes(0, 1)
    metrics["hard_negative_similarity"] = jnp.mean(jnp.diagonal(sims_KxBxB, axis1=1, axis2=2))
  return loss, metrics


def nt_xent_loss(a_BxD: Array, b_BxD: Array, *, temperature: float = 0.1) -> tuple[Array, dict[str, Array]]:
  """NT-Xent (SimCLR; ConSERT eq. 10) between two views a, b of the same N sentences.

  Views are L2-normalised here. Anchor a_i scores its positive b_i against b_j (j != i)
  and a_k (k != i): 1 positive, 2N - 2 negatives; anchors b_i likewise. Returns the
  paper's L_con, the mean over all 2N anchors, = (loss_a + loss_b) / 2 with loss_a,
  loss_b the mean over each view's anchors (also in the metrics).

  The official code (yym6472/ConSERT, AdvCLSoftmaxLoss._contrastive_loss_forward) returns
  loss_a + loss_b = 2 L_con and multiplies that by its `cl_rate` 0.15; st5_jax.objectives.consert
  keeps that convention for its weight, so the default 0.15 means 0.3 L_con.
  """
  a = a_BxD.astype(jnp.float32)
  b = b_BxD.astype(jnp.float32)
  a = a / jnp.maximum(jnp.linalg.norm(a, axis=-1, keepdims=True), 1e-12)
  b = b / jnp.maximum(jnp.linalg.norm(b, axis=-1, keepdims=True), 1e-12)
  N = a.shape[0]
  self_mask_NxN = jnp.eye(N, dtype=bool)
  sim_ab_NxN = a @ b.T
  sim_aa_NxN = a @ a.T
  sim_bb_NxN = b @ b.T

  def one_direction(cross_NxN, same_NxN):
    # [positives and cross-view negatives | same-view negatives without the anchor itself]
    logits_Nx2N = jnp.concatenate([cross_NxN, jnp.where(self_mask_NxN, -jnp.inf, same_NxN)], axis=1) / temperature
    xent_N = jax.nn.logsumexp(logits_Nx2N, axis=1) - jnp.diagonal(cross_NxN) / temperature
    correct_N = jnp.argmax(logits_Nx2N, axis=1) == jnp.arange(N)
    return jnp.mean(xent_N), correct_N

  loss_a, correct_a = one_direction(sim_ab_NxN, sim_aa_NxN)
  loss_b, correct_b = one_direction(sim_ab_NxN.T, sim_bb_NxN)
  loss = 0.5 * (loss_a + loss_b)
  off_diag = ~self_mask_NxN
  metrics = {
      "loss": loss,
      "loss_a": loss_a,
      "loss_b": loss_b,
      "accuracy": jnp.mean(jnp.concatenate([correct_a, correct_b]).astype(jnp.float32)),
      "positive_similarity": jnp.mean(jnp.diagonal(sim_ab_NxN)),
      "negative_similarity": jnp.sum(jnp.where(off_diag, sim_ab_NxN, 0.0)) / max(N * (N - 1.0), 1.0),
      "alignment": alignment(a, b),
      "uniformity": uniformity(jnp.concatenate([a, b], axis=0)),
  }
  return loss, metrics


# ----------------------------------------------------------------------------- Matryoshka


def truncate_unit(x_NxD: Array, dim: int) -> Array:
  """The first `dim` dimensions of each row, re-normalised to unit length ([N, dim])."""
  return _unit(x_NxD[..., :dim].astype(jnp.float32))


def matryoshka_loss(loss_fn: Callable[[Any], tuple[Array, dict[str, Array]]], embeddings: Any, *,
                    dims: Sequence[int], weights: Sequence[float]) -> tuple[Array, dict[str, Array]]:
  """sum_i weights[i] * loss_fn(embeddings cut to their first dims[i] dimensions and re-normalised).

  embeddings: a pytree of [N, D] arrays (every tower of the batch); loss_fn maps such a tree to
  (loss, metrics). The metrics are those at dims[0], with `loss` the weighted sum and
  `loss_dim_{d}` the unweighted loss at each d (sentence-transformers' MatryoshkaLoss, all
  dimensions every step).
  """
  if len(dims) != len(weights) or not dims:
    raise ValueError(f"Matryoshka needs one weight per dimension, got dims {tuple(dims)} and weights {tuple(weights)}")
  widths = {int(x.shape[-1]) for x in jax.tree.leaves(embeddings)}
  too_wide = [d for d in dims if d > min(widths)]
  if too_wide:
    raise ValueError(f"Matryoshka dimensions {too_wide} are larger than the embeddings' {min(widths)}; use dimensions "
                     f"<= {min(widths)} (st5_model.embedding_dim)")
  total, first_metrics, per_dim = jnp.float32(0.0), None, {}
  for d, w in zip(dims, weights):
    loss_d, metrics_d = loss_fn(jax.tree.map(lambda x: truncate_unit(x, d), embeddings))  # noqa: B023
    total = total + w * loss_d
    per_dim[f"loss_dim_{d}"] = loss_d
    if first_metrics is None:
      first_metrics = metrics_d
  return total, {**first_metrics, **per_dim, "loss": total}


# ----------------------------------------------------------------------------- distillation


def embedding_mse(student_NxD: Array, teacher_NxD: Array) -> Array:
  """Mean over rows and dimensions of (student - teacher)^2 (torch MSELoss; sentence-transformers' MSELoss)."""
  return jnp.mean(jnp.square(student_NxD.astype(jnp.float32) - teacher_NxD.astype(jnp.float32)))


def embedding_cosine(student_NxD: Array, teacher_NxD: Array) -> Array:
  """Mean over rows of 1 - cos(student, teacher)."""
  cos_N = jnp.sum(_unit(student_NxD.astype(jnp.float32)) * _unit(teacher_NxD.astype(jnp.float32)), axis=-1)
  return jnp.mean(1.0 - cos_N)


def cosine_scores(query_BxD: Array, candidates_CxD: Array) -> Array:
  """cos(q_i, c_j) [B, C]."""
  return jnp.einsum("bd,cd->bc", _unit(query_BxD.astype(jnp.float32)), _unit(candidates_CxD.astype(jnp.float32)))


def margin_mse(q_BxD: Array, p_BxD: Array, negs_KxBxD: Array, tq_BxE: Array, tp_BxE: Array,
               tnegs_KxBxE: Array) -> Array:
  """MarginMSE (Hofstaetter et al. 2020; sentence-transformers' MarginMSELoss with K negatives): mean over
  queries and negatives of ((s(q, p) - s(q, n_k)) - (t(q, p) - t(q, n_k)))^2, s and t the cosines of the
  student's and the teacher's vectors (the teacher's dimension E may differ from the student's D)."""
  def margins_BxK(q, p, negs):
    q_u, p_u, n_u = _unit(q.astype(jnp.float32)), _unit(p.astype(jnp.float32)), _unit(negs.astype(jnp.float32))
    pos_B = jnp.sum(q_u * p_u, axis=-1)
    neg_KxB = jnp.sum(q_u[None] * n_u, axis=-1)
    return (pos_B[None] - neg_KxB).T

  student_BxK = margins_BxK(q_BxD, p_BxD, negs_KxBxD)
  teacher_BxK = jax.lax.stop_gradient(margins_BxK(tq_BxE, tp_BxE, tnegs_KxBxE))
  return jnp.mean(jnp.square(student_BxK - teacher_BxK))


def distill_kl(q_BxD: Array, cands_CxD: Array, tq_BxE: Array, tcands_CxE: Array, *, temperature: float,
               teacher_temperature: float | None = None) -> Array:
  """KL(teacher || student) of each query's softmax over the batch's candidates, mean over queries, times
  temperature^2 (sentence-transformers' DistillKLDivLoss with batchmean, over every candidate of the batch
  rather than the query's own). Scores are cosines divided by the (student's / teacher's) temperature."""
  t_teacher = temperature if teacher_temperature is None else teacher_temperature
  student_logp_BxC = jax.nn.log_softmax(cosine_scores(q_BxD, cands_CxD) / temperature, axis=-1)
  teacher_logp_BxC = jax.lax.stop_gradient(jax.nn.log_softmax(cosine_scores(tq_BxE, tcands_CxE) / t_teacher, axis=-1))
  kl_B = jnp.sum(jnp.exp(teacher_logp_BxC) * (teacher_logp_BxC - student_logp_BxC), axis=-1)
  return jnp.mean(kl_B) * temperature ** 2
