"""Evaluation inside a training run: the run's sharded parameters, one compiled encoder.

The training parameters stay where they are (sharded over the mesh, possibly over
several processes); every process calls the encoder with the same texts and gets the
same embeddings back. Batches have one fixed shape per length bucket, so the encoder
is compiled once per bucket for the whole run, not at every evaluation.

What is evaluated (`TrainConfig.eval_metrics`, `EarlyStopping.metric` selects among them):
`stsb_dev_spearman` (STS-B dev Spearman x100) or `TASK/MEASURE` of a dev-suite retrieval
set (`TREC-QA-dev/MRR@10`, `SemEval2016-B-dev/nDCG@10`; st5_jax/evaluation/sets.py):
selection never sees a test split.

Prompts (the model's, st5_model.prompts plus those DataConfig.prompts trained with): as `st5 eval`, STS-B dev
encodes with the model's default prompt (none without one) and a retrieval set's queries and corpus with the
"query" and "document" prompts; `TrainConfig.eval_prompts` chooses others per set, in `st5 eval --prompt`'s
rules ({"STSBenchmarkDev": "query", "dev.query": "q"}; st5_jax/evaluation/prompts.py).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import numpy as np
from jax.sharding import Mesh

from st5_jax import multihost, partitioning
from st5_jax import vocab as vocab_lib
from st5_jax.inference import length_bucket
from st5_jax.evaluation import prompts as prompts_lib, retrieval, sets
from st5_jax.evaluation.sts import sts_dev_spearman
from st5_jax.retrieval import metrics as metrics_lib

log = logging.getLogger(__name__)


class ShardedEncoder:
  """texts -> float32 [N, D] embeddings with parameters laid out as in training.

  Call with the same texts on every process (a collective runs per batch). The batch
  is split over the mesh's batch axes; the output is replicated, so each process reads
  all of it locally.
  """

  def __init__(self, encode: Callable[[Any, jax.Array], jax.Array], *, param_keys: Sequence[str], max_length: int,
               mesh: Mesh, param_shardings: Any, tokenizer: vocab_lib.Tokenizer, batch_size: int = 128):
    """encode(params, tokens_BxL) -> emb_BxD: the tower in inference mode, handed over by the trainer.

    param_keys: the top-level parameter subtrees it reads (training may hold more: a head).
    """
    shards = partitioning.num_batch_shards(mesh)
    self.batch_size = max(shards, -(-batch_size // shards) * shards)  # a multiple of the batch shards
    self.max_length = max_length
    self.tokenizer = tokenizer
    self.mesh = mesh
    self._in_sharding = partitioning.batch_sharding(mesh)
    self._keys = tuple(param_keys)
    param_shardings = {k: param_shardings[k] for k in self._keys}
    self._apply = jax.jit(encode, in_shardings=(param_shardings, self._in_sharding),
                          out_shardings=partitioning.replicated(mesh))
    self._compiled = {}  # (B, L) -> executable: one compile per length bucket for the run

  def __call__(self, params: Any, texts: Sequence[str]) -> np.ndarray:
    params = {k: params[k] for k in self._keys}
    rows = self.tokenizer.encode(list(texts), max_length=self.max_length)
    order = np.argsort([-len(r) for r in rows], kind="stable")
    out_NxD = None
    B = self.batch_size
    with jax.set_mesh(self.mesh):
      for start in range(0, len(rows), B):
        idx = order[start:start + B]
        L = length_bucket(max(len(rows[i]) for i in idx), self.max_length)
        tokens_BxL = vocab_lib.pad_batch([rows[i] for i in idx] + [[]] * (B - len(idx)), L)
        batch = jax.make_array_from_callback(tokens_BxL.shape, self._in_sharding, lambda i: tokens_BxL[i])
        if tokens_BxL.shape not in self._compiled:
          self._compiled[tokens_BxL.shape] = multihost.compile_together(self._apply, params, batch,
                                                                        name=f"encode_{B}x{L}")
        emb_BxD = np.asarray(self._compiled[tokens_BxL.shape](params, batch).addressable_data(0), np.float32)
        if out_NxD is None:
          out_NxD = np.zeros((len(rows), emb_BxD.shape[1]), np.float32)
        out_NxD[idx] = emb_BxD[: len(idx)]
    return out_NxD if out_NxD is not None else np.zeros((0, 0), np.float32)


STSB_DEV = "stsb_dev_spearman"
STSB_DEV_SET = "STSBenchmarkDev"  # the evaluation set STSB_DEV reads (its name in prompt rules)


def check_metric(metric: str) -> None:
  """Refuses a metric the in-training evaluation cannot compute, or one on a set outside the dev suite."""
  if metric == STSB_DEV:
    return
  task, _, measure = metric.partition("/")
  dev_retrieval = [n for n, s in sets.SETS.items() if s.suite == "dev" and s.kind == "retrieval"]
  if task not in dev_retrieval or not measure:
    raise ValueError(f"in-training metric {metric!r}: write {STSB_DEV!r} or TASK/MEASURE with TASK a dev retrieval "
                     f"set {dev_retrieval} (test splits are evaluation-only) and MEASURE e.g. MRR@10")
  parsed = metrics_lib.parse_metric(measure)  # an unknown measure fails here, before training
  if parsed.k > retrieval.DEPTH:
    raise ValueError(f"in-training metric {metric!r}: the dev search keeps the top {retrieval.DEPTH} documents of a "
                     f"query; use a cutoff <= {retrieval.DEPTH}")


def check_metrics(metrics: Sequence[str], *, selected: str | None = None) -> None:
  """`TrainConfig.eval_metrics`, and the one early stopping selects on (which must be among them)."""
  for metric in metrics:
    check_metric(metric)
  if selected and selected not in metrics:
    raise ValueError(f"EarlyStopping.metric {selected!r} is not evaluated: add it to TrainConfig.eval_metrics "
                     f"{list(metrics)}")


class _Sides(NamedTuple):
  query: Callable[[Sequence[str]], np.ndarray]
  document: Callable[[Sequence[str]], np.ndarray]


class DevEvaluator:
  """{metric: value} of the training parameters for each of `metrics` (every process gets the same values).

  `encoder` encodes STS-B dev and a retrieval set's queries; `document_encoder` (default `encoder`) its corpus.
  """

  def __init__(self, encoder: ShardedEncoder, *, metrics: Sequence[str], data_dir,
               document_encoder: ShardedEncoder | None = None,
               task_prompts: Mapping[str, Mapping[str, str]] | None = None):
    for metric in metrics:
      check_metric(metric)
    self.encoder, self.metrics, self.data_dir = encoder, tuple(metrics), data_dir
    self.document_encoder = encoder if document_encoder is None else document_encoder
    self.task_prompts = {k: dict(v) for k, v in (task_prompts or {}).items()}  # task -> {side: prompt text}
    self._data = {}  # retrieval task -> RetrievalData, read once per run

  def _sides(self, params: Any, task: str) -> _Sides:
    chosen = self.task_prompts.get(task, {})

    def side(encoder, prompt):
      return lambda texts: encoder(params, [prompt + t for t in texts] if prompt else texts)

    query = chosen.get(prompts_lib.ENCODE, chosen.get("query", ""))
    return _Sides(side(self.encoder, query), side(self.document_encoder, chosen.get("document", "")))

  def __call__(self, params: Any) -> dict[str, float]:
    out, by_task = {}, {}
    for metric in self.metrics:
      if metric == STSB_DEV:
        # `encode`'s tower, as st5 eval scores STS: the document route of asymmetric towers (the same tower
        # otherwise), with the task's prompt.
        prompt = self.task_prompts.get(STSB_DEV_SET, {}).get(prompts_lib.ENCODE, "")
        encode = self.document_encoder
        out[metric] = float(sts_dev_spearman(
            lambda texts: encode(params, [prompt + t for t in texts] if prompt else texts), data_dir=self.data_dir))
        continue
      task, _, measure = metric.partition("/")
      if task not in by_task:
        if task not in self._data:
          self._data[task] = sets.SETS[task].read(self.data_dir)[1]
        measures = tuple(m.partition("/")[2] for m in self.metrics if m.partition("/")[0] == task)
        by_task[task] = retrieval.retrieval_task(self._data[task], extra_metrics=measures)(self._sides(params, task))
      out[metric] = float(by_task[task][metrics_lib.parse_metric(measure).name])  # "mrr@10" -> "MRR@10"
    return out


def dev_evaluator(encode: Callable[[Any, jax.Array], jax.Array], *, param_keys: Sequence[str], max_length: int,
                  mesh: Mesh, param_shardings: Any, vocab_file: str, batch_size: int, metrics: Sequence[str],
                  data_dir, document: tuple[Callable[[Any, jax.Array], jax.Array], Sequence[str]] | None = None,
                  prompts: Mapping[str, str] | None = None, default_prompt_name: str | None = None,
                  eval_prompts: Mapping[str, str] | None = None) -> DevEvaluator:
  """The trainer's evaluator: `encode(params, tokens_BxL)` (its tower in inference mode) on the run's mesh.

  document: (encode, param_keys) of a separate document tower (an asymmetric objective); default `encode`.
  prompts / default_prompt_name: the model's (st5_model.prompts); eval_prompts: rules choosing among them per
  set (TrainConfig.eval_prompts; the module docstring).
  """
  tokenizer = vocab_lib.Tokenizer(vocab_file)

  def sharded(fn, keys):
    return ShardedEncoder(fn, param_keys=keys, max_length=max_length, mesh=mesh, param_shardings=param_shardings,
                          tokenizer=tokenizer, batch_size=batch_size)

  evaluator = _build(sharded, encode, param_keys, metrics, data_dir, document)
  evaluator.task_prompts = dev_prompts(metrics, prompts or {}, default_prompt_name, eval_prompts)
  return evaluator


def _build(sharded, encode, param_keys, metrics, data_dir, document) -> DevEvaluator:
  """The evaluator around the run's one ShardedEncoder per tower (built once per run)."""
  return DevEvaluator(sharded(encode, param_keys), metrics=metrics, data_dir=data_dir,
                      document_encoder=None if document is None else sharded(*document))


def dev_prompts(metrics: Sequence[str], prompts: Mapping[str, str], default_prompt_name: str | None,
                eval_prompts: Mapping[str, str] | None) -> dict[str, dict[str, str]]:
  """{set: {side: prompt text}} of the dev sets `metrics` read: the defaults of `st5 eval`, then the rules."""
  names = list(dict.fromkeys(STSB_DEV_SET if m == STSB_DEV else m.partition("/")[0] for m in metrics))
  out = {}
  for name in names:
    if sets.SETS[name].kind == "retrieval":
      out[name] = {side: prompts.get(side, "") for side in prompts_lib.SIDES}
    else:
      out[name] = {prompts_lib.ENCODE: prompts[default_prompt_name] if default_prompt_name else ""}
  rules = prompts_lib.parse(eval_prompts, where="TrainConfig.eval_prompts")
  for name, chosen in prompts_lib.plan(rules, names, prompts, where="TrainConfig.eval_prompts").items():
    out[name].update(chosen)
  return out
