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

MODEL_FEATURE_NAMES = {"inputs": LEFT, "targets": RIGHT, "negative_targets": RIGHT_NEG, "label": LABELS}
