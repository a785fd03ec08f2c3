"""Names of the dual-encoder batch features (t5x_retrieval's), shared by data and the objectives.

Kept free of TensorFlow and JAX imports so every side can use them. An objective with
other features names its own (SEED-Encoder: st5_jax/objectives/seed_encoder/objective.py).

ConSERT batches (st5_jax/objectives/consert) reuse them: unlabelled sentences are single
sentences under LEFT only; NLI pairs are premise LEFT, hypothesis RIGHT and an int32
class id [B] under LABELS (task feature `label`: contradiction 0, entailment 1,
neutral 2, the official ConSERT/SBERT order).
"""

LEFT = "left_encoder_input_tokens"  # queries / premises (task feature `inputs`)
RIGHT = "right_encoder_input_tokens"  # positives (`targets`)
RIGHT_NEG = "right_negative_encoder_input_tokens"  # hard negatives (`negative_targets`)
LABELS = "labels"  # NLI class ids, int32 [B] (`label`)
NEGATIVE_TARGETS = "negative_targets"
# The most hard negatives per example a batch names (Contrastive.num_negatives refuses more).
MAX_NEGATIVES = 64


def negative_features(k: int) -> list[tuple[str, str]]:
  """(task feature, model feature) of K hard negatives per example, in order.

  The first is the single negative of a triple (`negative_targets`, RIGHT_NEG); the others
  `negative_targets_{i}` -> f"{RIGHT_NEG}_{i}" for i = 1..K-1. They all take the
  `negative_targets` length unless their own is given (st5_jax.data.convert.batch_layout).
  """
  if not 1 <= k <= MAX_NEGATIVES:
    raise ValueError(f"hard negatives per example must be in 1..{MAX_NEGATIVES}, got {k}")
  return [(NEGATIVE_TARGETS, RIGHT_NEG)] + [(f"{NEGATIVE_TARGETS}_{i}", f"{RIGHT_NEG}_{i}") for i in range(1, k)]


MODEL_FEATURE_NAMES = {"inputs": LEFT, "targets": RIGHT, **dict(negative_features(MAX_NEGATIVES)), "label": LABELS}
