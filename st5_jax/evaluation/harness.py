"""The task registry and `evaluate`: any encoder through the same protocol."""

from __future__ import annotations

import dataclasses
import logging
import platform
import time
from typing import Callable, Sequence

import numpy as np
import sklearn

from st5_jax import paths
from st5_jax.evaluation import geometry, readers, sentglue, sts, transfer
from st5_jax.evaluation.cache import EmbeddingCache, Encode

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  name: str
  suite: str
  # build(data_root, kfold=...) -> (every text the task encodes, run(embed) -> result dict)
  build: Callable
  files: str  # what the number is computed from, relative to the data folder.


def _sts(read: Callable, *, per_subset: bool):
  def build(root, *, kfold: int = 10):
    del kfold
    data = read(root)
    return data.sents1 + data.sents2, lambda embed: sts.evaluate_pairs(data, embed, per_subset=per_subset)
  return build


def _sts_year(year: int):
  return _sts(lambda root: readers.read_sts(root, year=year), per_subset=True)


def _stsb(split: str):
  return _sts(lambda root: readers.read_stsb(root, split=split), per_subset=False)


def _sick(root, *, kfold: int = 10):
  del kfold
  data = readers.read_sick(root, split="test")
  return data.sents1 + data.sents2, lambda embed: sts.evaluate_pairs(data, embed, per_subset=False)


_STS_FILES = "sts12-16/original/STS{yy}-en-test/{prefix}.input|gs.<subset>.txt"
TASKS: dict[str, TaskSpec] = {t.name: t for t in [
    TaskSpec("STS12", "sts", _sts_year(2012), _STS_FILES.format(yy=12, prefix="STS")),
    TaskSpec("STS13", "sts", _sts_year(2013), _STS_FILES.format(yy=13, prefix="STS") + " (no SMT)"),
    TaskSpec("STS14", "sts", _sts_year(2014), _STS_FILES.format(yy=14, prefix="STS")),
    TaskSpec("STS15", "sts", _sts_year(2015), _STS_FILES.format(yy=15, prefix="STS")),
    TaskSpec("STS16", "sts", _sts_year(2016), _STS_FILES.format(yy=16, prefix="STS2016")),
    TaskSpec("STSBenchmark", "sts", _stsb("test"), "stsb/original/sts-test.csv"),
    TaskSpec("SICKRelatedness", "sts", _sick, "sick/brmson_semeval2014/SICK_test_annotated.txt"),
    TaskSpec("MR", "transfer", transfer.binary_task("MR"), "senteval_transfer/MR/rt-polarity.{pos,neg}"),
    TaskSpec("CR", "transfer", transfer.binary_task("CR"), "senteval_transfer/CR/custrev.{pos,neg}"),
    TaskSpec("SUBJ", "transfer", transfer.binary_task("SUBJ"), "senteval_transfer/SUBJ/subj.{objective,subjective}"),
    TaskSpec("MPQA", "transfer", transfer.binary_task("MPQA"), "senteval_transfer/MPQA/mpqa.{pos,neg}"),
    TaskSpec("SST2", "transfer", transfer.sst2_task, "senteval_transfer/SST/binary/sentiment-{train,dev,test}"),
    TaskSpec("TREC", "transfer", transfer.trec_task, "senteval_transfer/TREC/{train_5500,TREC_10}.label"),
    TaskSpec("MRPC", "transfer", transfer.mrpc_task, "senteval_transfer/MRPC/msr_paraphrase_{train,test}.txt"),
    TaskSpec("SentGLUE-CoLA", "sentglue", sentglue.cola_task,
             "glue/CoLA/{train,dev,out_of_domain_dev}.tsv"),
    TaskSpec("SentGLUE-SST2", "sentglue", sentglue.sst2_task, "glue/SST-2/{train,dev}.tsv"),
    TaskSpec("SentGLUE-MRPC", "sentglue", sentglue.mrpc_task, "glue/MRPC/{train,dev}.tsv"),
    TaskSpec("SentGLUE-STSB", "sentglue", sentglue.stsb_task, "glue/STS-B/{train,dev}.tsv"),
    TaskSpec("SentGLUE-RTE", "sentglue", sentglue.rte_task, "glue/RTE/{train,dev}.tsv"),
    TaskSpec("SentGLUE-QNLI", "sentglue", sentglue.qnli_task, "glue/QNLI/dev.tsv (two halves)"),
    TaskSpec("AlignUniform", "geometry", geometry.align_uniform_task, "stsb/original/sts-test.csv"),
    TaskSpec("STSBenchmarkDev", "dev", _stsb("dev"), "stsb/original/sts-dev.csv"),
]}
SUITES = {suite: [t.name for t in TASKS.values() if t.suite == suite]
          for suite in dict.fromkeys(t.suite for t in TASKS.values())}
SUITES["all"] = [t.name for t in TASKS.values() if t.suite != "dev"]
_ALIASES = {"sts-b": "STSBenchmark", "stsb": "STSBenchmark", "sick-r": "SICKRelatedness", "sickr": "SICKRelatedness",
            "sst-2": "SST2", "geometry": "AlignUniform"}


def resolve_tasks(tasks: str | Sequence[str]) -> list[str]:
  """Task and suite names (case-insensitive, comma-separated or a list) -> task names, in order."""
  if isinstance(tasks, str):
    tasks = [tasks]
  lower = {name.lower(): name for name in TASKS}
  out = []
  for item in (t.strip() for entry in tasks for t in entry.split(",")):
    if not item:
      continue
    key = item.lower()
    if key in SUITES:
      out += SUITES[key]
    elif key in lower:
      out.append(lower[key])
    elif key in _ALIASES:
      out.append(_ALIASES[key])
    else:
      raise ValueError(f"unknown task or suite {item!r}; suites: {sorted(SUITES)}, tasks: {list(TASKS)}")
  return list(dict.fromkeys(out))


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
