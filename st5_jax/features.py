"""Names of the dual-encoder batch features (t5x_retrieval's), shared by data and trainer.

Kept free of TensorFlow and JAX imports so every side can use them.
"""

LEFT = "left_encoder_input_tokens"  # queries / premises (task feature `inputs`)
RIGHT = "right_encoder_input_tokens"  # positives (`targets`)
RIGHT_NEG = "right_negative_encoder_input_tokens"  # hard negatives (`negative_targets`)

MODEL_FEATURE_NAMES = {"inputs": LEFT, "targets": RIGHT, "negative_targets": RIGHT_NEG}
