"""The task registry and `evaluate`: any encoder through the same protocol.

What each task reads and encodes is st5_jax.evaluation.sets (light: decontamination uses it
too); how each is scored is `SCORERS` here.
"""

from __future__ import annotations

import dataclasses
import logging
import platform
import time
from typing import Callable, Sequence

import numpy as np
import sklearn

from st5_jax import paths
from st5_jax.evaluation import geometry, sentglue, sets, sts, transfer
from st5_jax.evaluation.cache import EmbeddingCache, Encode
from st5_jax.evaluation.sets import SUITES, resolve_tasks  # also harness.SUITES, harness.resolve_tasks for callers

log = logging.getLogger(__name__)


def _sts(*, per_subset: bool) -> Callable:
  def score(data, *, kfold: int = 10):
    del kfold
    return lambda embed: sts.evaluate_pairs(data, embed, per_subset=per_subset)
  return score


# How each evaluation set of sets.SETS is scored, by the same name:
# score(the data sets.SETS[name].read returns, kfold=...) -> run(embed) -> result dict.
SCORERS: dict[str, Callable] = {
    **{f"STS{year}": _sts(per_subset=True) for year in (12, 13, 14, 15, 16)},
    "STSBenchmark": _sts(per_subset=False),
    "SICKRelatedness": _sts(per_subset=False),
    **{task: transfer.binary_task for task in ("MR", "CR", "SUBJ", "MPQA")},
    "SST2": transfer.sst2_task,
    "TREC": transfer.trec_task,
    "MRPC": transfer.mrpc_task,
    "SentGLUE-CoLA": sentglue.cola_task,
    "SentGLUE-SST2": sentglue.sst2_task,
    "SentGLUE-MRPC": sentglue.mrpc_task,
    "SentGLUE-STSB": sentglue.stsb_task,
    "SentGLUE-RTE": sentglue.rte_task,
    "SentGLUE-QNLI": sentglue.qnli_task,
    "AlignUniform": geometry.align_uniform_task,
    "STSBenchmarkDev": _sts(per_subset=False),
}


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  name: str
  suite: str
  read: Callable  # sets.EvalSet.read: data folder -> (every text the task encodes, the parsed data)
  score: Callable  # SCORERS[name]
  files: str  # what the number is computed from, relative to the data folder.

  def build(self, root, *, kfold: int = 10):
    """(every text the task encodes, run(embed) -> result dict)."""
    texts, data = self.read(root)
    return texts, self.score(data, kfold=kfold)


def _tasks() -> dict[str, TaskSpec]:
  if set(SCORERS) != set(sets.SETS):
    raise RuntimeError(f"evaluation sets without a scorer: {sorted(set(sets.SETS) - set(SCORERS))}; "
                       f"scorers without a set: {sorted(set(SCORERS) - set(sets.SETS))}")
  return {name: TaskSpec(name, s.suite, s.read, SCORERS[name], s.files) for name, s in sets.SETS.items()}


TASKS = _tasks()


def summarise(results: dict[str, dict]) -> dict:
  """Per-suite averages of each task's headline number."""
  summary = {}
  for suite, names in SUITES.items():
    if suite in ("all", "geometry"):
      continue
    mains = [results[n]["main"] for n in names if n in results and results[n].get("main") is not None]
    if mains:
      summary[suite] = {"mean": float(np.mean(mains)), "n_tasks": len(mains), "complete": len(mains) == len(names)}
  sts_means = [results[n]["spearman_mean"] for n in SUITES["sts"] if n in results]
  if sts_means and "sts" in summary:
    summary["sts"]["mean_senteval"] = float(np.mean(sts_means))
  if "AlignUniform" in results:
    summary["geometry"] = {k: results["AlignUniform"][k] for k in ("alignment", "uniformity")}
  return summary


def evaluate(encode: Encode, tasks: str | Sequence[str] = "all", data_dir=None, *, kfold: int = 10,
             cache: EmbeddingCache | None = None, chunk_size: int = 4096) -> dict:
  """Runs tasks and suites (sts, transfer, sentglue, geometry, all) for one encoder.

  Args:
    encode: list of strings -> np.ndarray [N, D]; any encoder.
    tasks: names of tasks or suites (see `TASKS`, `SUITES`).
    data_dir: the data folder `st5 data prepare --out DIR` writes (default $ST5_DATA_DIR; docs/data.md).
    kfold: folds of SentEval's cross-validations (SentEval's standard setting is 10).
    cache: an EmbeddingCache to reuse across calls; by default a new one over `encode`.
    chunk_size: texts per `encode` call.

  Returns:
    {"tasks": {name: {"main", "metric", ...}}, "summary": {suite: ...}, "meta": {...}}.
    Every distinct text of all tasks is encoded once, before any task runs.
  """
  start = time.perf_counter()
  root = paths.data_dir(data_dir)
  names = resolve_tasks(tasks)
  if cache is None:
    cache = EmbeddingCache(encode, chunk_size=chunk_size)
  built, load_seconds = {}, {}
  for name in names:
    t0 = time.perf_counter()
    built[name] = TASKS[name].build(root, kfold=kfold)
    load_seconds[name] = time.perf_counter() - t0
  texts = [t for texts, _ in built.values() for t in texts]
  n_new = cache.add(texts)
  log.info("encoded %d distinct texts in %.1fs", n_new, cache.encode_seconds)
  results = {}
  for name, (_, run) in built.items():
    t0 = time.perf_counter()
    result = run(cache)
    result.update(suite=TASKS[name].suite, files=TASKS[name].files,
                  seconds=time.perf_counter() - t0 + load_seconds[name])
    results[name] = result
    main = result.get("main")
    log.info("%s: %s in %.1fs", name, "-" if main is None else f"{main:.2f}", result["seconds"])
  meta = {
      "data_dir": str(root), "kfold": kfold, "tasks": names, "n_texts": len(set(texts)), "dim": cache.dim,
      "encode_seconds": cache.encode_seconds, "total_seconds": time.perf_counter() - start,
      "numpy": np.__version__, "sklearn": sklearn.__version__, "python": platform.python_version(),
  }
  return {"tasks": results, "summary": summarise(results), "meta": meta}
