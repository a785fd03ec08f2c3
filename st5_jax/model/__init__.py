"""T5 (t5.py) and Sentence-T5 (st5.py) in Flax linen."""

from st5_jax.model.st5 import SentenceT5, abstract_params, init_params, l2_normalize, mean_pool
from st5_jax.model.t5 import T5

__all__ = ["SentenceT5", "T5", "abstract_params", "init_params", "l2_normalize", "mean_pool"]
