"""Names of the dual-encoder batch features (t5x_retrieval's), shared by data and trainer.

Kept free of TensorFlow and JAX imports so every side can use them.

ConSERT batches (st5_jax/consert) reuse them: unlabelled sentences are single
sentences under LEFT only; NLI pairs are premise LEFT, hypothesis RIGHT and an int32
class id [B] under LABELS (task feature `label`: contradiction 0, entailment 1,
neutral 2, the official ConSERT/SBERT order).
"""

LEFT = "left_encoder_input_tokens"  # queries / premises (task feature `inputs`)
RIGHT = "right_encoder_input_tokens"  # positives (`targets`)
RIGHT_NEG = "right_negative_encoder_input_tokens"  # hard negatives (`negative_targets`)
LABELS = "labels"  # NLI class ids, int32 [B] (`label`)

MODEL_FEATURE_NAMES = {"inputs": LEFT, "targets": RIGHT, "negative_targets": RIGHT_NEG, "label": LABELS}

# SEED-Encoder pre-training batches (st5_jax/seed_encoder.py): t5x's encoder-decoder names
# plus the weak decoder's targets, each int32 [B, length], 0-padded, EOS-terminated.
SEED_ENCODER_INPUTS = "encoder_input_tokens"  # task feature `inputs`: text, noise spans -> sentinels
SEED_DECODER_TARGETS = "decoder_target_tokens"  # `targets`: each sentinel followed by its span
SEED_WEAK_DECODER_TARGETS = "weak_decoder_target_tokens"  # `uncorrupted`: the same text, uncorrupted

SEED_MODEL_FEATURE_NAMES = {"inputs": SEED_ENCODER_INPUTS, "targets": SEED_DECODER_TARGETS,
                            "uncorrupted": SEED_WEAK_DECODER_TARGETS}
