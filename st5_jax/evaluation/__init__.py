"""Evaluation harness: STS, SentEval transfer, SentGLUE and embedding geometry for any encoder.

  from st5_jax.evaluation import evaluate
  results = evaluate(encode, ["sts", "transfer"], data_dir)  # encode: list[str] -> [N, D]

See docs/evaluation.md for the files, settings and classifier protocol of each number.
"""

from st5_jax.evaluation.cache import EmbeddingCache
from st5_jax.evaluation.harness import SUITES, TASKS, evaluate, resolve_tasks
from st5_jax.evaluation.sts import sts_dev_spearman

__all__ = ["EmbeddingCache", "SUITES", "TASKS", "evaluate", "resolve_tasks", "sts_dev_spearman"]
