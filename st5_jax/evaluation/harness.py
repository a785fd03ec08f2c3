"""The task registry and `evaluate`: any encoder through the same protocol.

What each task reads and encodes is st5_jax.evaluation.sets (light: decontamination uses it
too); how each is scored is `SCORERS` here.
"""

from __future__ import annotations

import dataclasses
import logging
import platform
import time
from typing import Callable, Mapping, Sequence

import numpy as np
import sklearn

from st5_jax import paths
from st5_jax.evaluation import geometry, retrieval, sentglue, sets, sts, transfer
from st5_jax.evaluation.cache import EmbeddingCache, Encode
from st5_jax.evaluation.sets import SUITES, resolve_tasks  # also harness.SUITES, harness.resolve_tasks for callers

log = logging.getLogger(__name__)
ENCODE_SIDE = "encode"  # a sentence task's side in task_prompts (st5_jax.evaluation.prompts.ENCODE)


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
# Sets of a kind share one scorer (every retrieval set, BEIR folders included).
KIND_SCORERS: dict[str, Callable] = {"retrieval": retrieval.retrieval_task}


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  name: str
  suite: str
  read: Callable  # sets.EvalSet.read: data folder -> (every text the task encodes, the parsed data)
  score: Callable  # SCORERS[name], or KIND_SCORERS[kind]
  files: str  # what the number is computed from, relative to the data folder.
  kind: str = "encode"  # "retrieval": encodes by side when it runs, nothing up front

  def build(self, root, *, kfold: int = 10):
    """(every text the task encodes, run(embed) -> result dict)."""
    texts, data = self.read(root)
    return texts, self.score(data, kfold=kfold)


def _spec(s: sets.EvalSet) -> TaskSpec:
  return TaskSpec(s.name, s.suite, s.read, KIND_SCORERS[s.kind] if s.kind in KIND_SCORERS else SCORERS[s.name],
                  s.files, s.kind)


def _tasks() -> dict[str, TaskSpec]:
  named = {n for n, s in sets.SETS.items() if s.kind not in KIND_SCORERS}
  if set(SCORERS) != named:
    raise RuntimeError(f"evaluation sets without a scorer: {sorted(named - set(SCORERS))}; "
                       f"scorers without a set: {sorted(set(SCORERS) - named)}")
  return {name: _spec(s) for name, s in sets.SETS.items()}


TASKS = _tasks()


def task(name: str) -> TaskSpec:
  """A registered task, or a BEIR folder's (`beir:FOLDER[:split]`)."""
  return TASKS[name] if name in TASKS else _spec(sets.get_set(name))


class Sides:
  """What a task's `run` gets: callable as the shared encoder; `.query` / `.document` for retrieval sets.

  A side given no encoder of its own is the shared one (the same cache: nothing encoded twice).
  """

  def __init__(self, shared: EmbeddingCache, query: EmbeddingCache | None = None,
               document: EmbeddingCache | None = None):
    # `is None`, not `or`: an EmbeddingCache with nothing encoded yet has length 0, so it is falsy.
    self.shared = shared
    self.query = shared if query is None else query
    self.document = shared if document is None else document

  def __call__(self, texts):
    return self.shared(texts)

  @property
  def encode_seconds(self) -> float:
    return sum(c.encode_seconds for c in {id(c): c for c in (self.shared, self.query, self.document)}.values())


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
             cache: EmbeddingCache | None = None, chunk_size: int = 4096, encode_query: Encode | None = None,
             encode_document: Encode | None = None, task_prompts: Mapping[str, Mapping[str, str]] | None = None,
             prompted: Callable[[str, str], Encode] | None = None) -> dict:
  """Runs tasks and suites (sts, transfer, sentglue, geometry, retrieval, all) for one encoder.

  Args:
    encode: list of strings -> np.ndarray [N, D]; any encoder.
    tasks: names of tasks or suites (see `TASKS`, `SUITES`), or `beir:FOLDER[:split]`.
    data_dir: the data folder `st5 data prepare --out DIR` writes (default $ST5_DATA_DIR; docs/data.md).
    kfold: folds of SentEval's cross-validations (SentEval's standard setting is 10).
    cache: an EmbeddingCache to reuse across calls; by default a new one over `encode`.
    chunk_size: texts per `encode` call.
    encode_query, encode_document: the retrieval sets' query and document encoders (e.g. other max
      lengths); default `encode`.
    task_prompts: {task: {side: prompt text}} (st5_jax.evaluation.prompts.plan: side "encode" for a sentence
      task, "query" / "document" for a retrieval set's sides); a side named here is encoded by
      `prompted(text, side)` (one cache per prompt and side), the others as without it.

  Returns:
    {"tasks": {name: {"main", "metric", ...}}, "summary": {suite: ...}, "meta": {...}}.
    Every distinct text of all tasks but the retrieval sets is encoded once, before any task runs;
    a retrieval set encodes its queries and corpus by side when it runs (each side cached).
    meta["n_texts"] counts the texts this call encoded, over all sides (none a cache held already).
  """
  start = time.perf_counter()
  root = paths.data_dir(data_dir)
  names = resolve_tasks(tasks)
  if cache is None:
    cache = EmbeddingCache(encode, chunk_size=chunk_size)
  sides = Sides(cache, *(EmbeddingCache(e, chunk_size=chunk_size) if e is not None else None
                         for e in (encode_query, encode_document)))
  task_prompts = {k: dict(v) for k, v in (task_prompts or {}).items() if k in names and v}
  if task_prompts and prompted is None:
    raise ValueError("evaluate: task_prompts need `prompted` (prompt text, side -> encode)")
  prompt_caches: dict[tuple[str, str], EmbeddingCache] = {}  # (side, prompt text) -> its cache

  def prompt_cache(side: str, text: str) -> EmbeddingCache:
    if (side, text) not in prompt_caches:
      prompt_caches[side, text] = EmbeddingCache(prompted(text, side), chunk_size=chunk_size)
    return prompt_caches[side, text]

  def task_sides(name: str) -> Sides:
    chosen = task_prompts.get(name)
    if not chosen:
      return sides
    shared = prompt_cache(ENCODE_SIDE, chosen[ENCODE_SIDE]) if ENCODE_SIDE in chosen else sides.shared
    return Sides(shared, *(prompt_cache(side, chosen[side]) if side in chosen else getattr(sides, side)
                           for side in ("query", "document")))

  for side, text in sorted({(s_, t) for chosen in task_prompts.values() for s_, t in chosen.items()}):
    prompt_cache(side, text)
  caches = list({id(c): c for c in (sides.shared, sides.query, sides.document, *prompt_caches.values())}.values())
  held_before = [len(c) for c in caches]  # a caller's cache may hold texts already
  specs = {name: task(name) for name in names}
  built, load_seconds = {}, {}
  for name in names:
    t0 = time.perf_counter()
    built[name] = specs[name].build(root, kfold=kfold)
    load_seconds[name] = time.perf_counter() - t0
  by_cache: dict[int, tuple[EmbeddingCache, list[str]]] = {}
  for name, (texts, _) in built.items():
    if specs[name].kind == "encode":
      shared = task_sides(name).shared
      by_cache.setdefault(id(shared), (shared, []))[1].extend(texts)
  n_new = sum(c.add(texts) for c, texts in by_cache.values())
  log.info("encoded %d distinct texts in %.1fs", n_new, sum(c.encode_seconds for c, _ in by_cache.values()))
  results = {}
  for name, (_, run) in built.items():
    t0 = time.perf_counter()
    result = run(task_sides(name))
    result.update(suite=specs[name].suite, files=specs[name].files,
                  seconds=time.perf_counter() - t0 + load_seconds[name])
    results[name] = result
    main = result.get("main")
    log.info("%s: %s in %.1fs", name, "-" if main is None else f"{main:.2f}", result["seconds"])
  meta = {
      "data_dir": str(root), "kfold": kfold, "tasks": names,
      "n_texts": sum(len(c) - n for c, n in zip(caches, held_before)), "dim": cache.dim,
      "encode_seconds": sum(c.encode_seconds for c in caches), "total_seconds": time.perf_counter() - start,
      "numpy": np.__version__, "sklearn": sklearn.__version__, "python": platform.python_version(),
  }
  if task_prompts:
    meta["prompts"] = task_prompts
  return {"tasks": results, "summary": summarise(results), "meta": meta}


def evaluate_bm25(tasks: str | Sequence[str], data_dir=None, **bm25_kwargs) -> dict:
  """The retrieval sets among `tasks` scored by BM25 (the baseline row); other tasks are left out.

  bm25_kwargs: st5_jax.retrieval.bm25.BM25's settings (k1, b). Same output layout as `evaluate`.
  """
  start = time.perf_counter()
  root = paths.data_dir(data_dir)
  names = [n for n in resolve_tasks(tasks) if task(n).kind == "retrieval"]
  results = {}
  for name in names:
    spec = task(name)
    t0 = time.perf_counter()
    _, data = spec.read(root)
    results[name] = {**retrieval.bm25_task(data, **bm25_kwargs), "suite": spec.suite, "files": spec.files,
                     "seconds": time.perf_counter() - t0}
    log.info("%s (BM25): %.3f in %.1fs", name, results[name]["main"], results[name]["seconds"])
  meta = {"data_dir": str(root), "tasks": names, "baseline": "bm25", "bm25": dict(bm25_kwargs),
          "total_seconds": time.perf_counter() - start, "python": platform.python_version()}
  return {"tasks": results, "summary": summarise(results), "meta": meta}
