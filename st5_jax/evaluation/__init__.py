"""Evaluation harness: STS, SentEval transfer, SentGLUE and embedding geometry for any encoder.

  from st5_jax.evaluation import evaluate
  results = evaluate(encode, ["sts", "transfer"], data_dir)  # encode: list[str] -> [N, D]

See docs/evaluation.md for the files, settings and classifier protocol of each number.
The names below are imported on first use, so that importing a light submodule
(`sets`, `readers`: what decontamination and the objectives' tasks read) does not
import the harness and scikit-learn.
"""

import importlib

_EXPORTS = {
    "EmbeddingCache": "st5_jax.evaluation.cache",
    "SUITES": "st5_jax.evaluation.sets",
    "TASKS": "st5_jax.evaluation.harness",
    "evaluate": "st5_jax.evaluation.harness",
    "resolve_tasks": "st5_jax.evaluation.sets",
    "sts_dev_spearman": "st5_jax.evaluation.sts",
}


def __getattr__(name):
  if name in _EXPORTS:
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
