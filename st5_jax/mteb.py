"""MTEB (the Massive Text Embedding Benchmark, `mteb` 2.x) over any model SentenceEncoder loads.

    import mteb
    from st5_jax import mteb as st5_mteb

    model = st5_mteb.load("path/to/model")            # work dir, HF/ST folder, T5X, SavedModel
    results = mteb.evaluate(model, mteb.get_tasks(tasks=["STSBenchmark"]))

`load` returns an `mteb.models.abs_encoder.AbsEncoder` (which supplies `similarity` /
`similarity_pairwise`) with a filled-in `ModelMeta` (`mteb_model_meta`): without one,
mteb substitutes an empty meta whose loader raises. Prompts as mteb's sentence-transformers
wrapper applies them: a model prompt named after the task (`{task}-{query|document}`, the task,
`{task type}-{query|document}`, the task type, in that order), else `encode_query` (the "query"
prompt) for mteb's query side, `encode_document` (the "document" prompt) for its document side,
`encode` (the default prompt) otherwise. `load(path, truncate_dim=64)` scores the first 64
dimensions (renormalised). The meta's `memory_usage_mb` is the loaded parameters' bytes (each leaf's size
times its dtype's, mteb's `round(bytes / 2**20)`), `training_datasets` the MTEB names of what trained the
model (st5_jax.data.offline.contamination_names): the training tasks an export's training_data.json or a
work dir's operative gin records, plus the MTEB tasks a contamination report (`load(path,
contamination_report=...)`, or an export's contamination.json) finds any contamination of; None (mteb's
"unknown") when neither is known. `local_tasks` builds mteb tasks from
the local evaluation data (`st5 data prepare` layout: STS-B, STS12-16, SICK-R) that run
without network access, the way mteb's own mock tasks do. Needs the `mteb` extra.
"""

from __future__ import annotations

import functools
import os
import pathlib
from typing import Any

import jax
import numpy as np

from st5_jax.checkpoints import loader
from st5_jax.data.offline import contamination_names
from st5_jax.encoder import SentenceEncoder
from st5_jax.evaluation import readers
from st5_jax.export import model_card

try:
  import mteb as _mteb
  from datasets import Dataset, DatasetDict  # mteb's own dependency
  from mteb.abstasks.sts import AbsTaskSTS
  from mteb.abstasks.task_metadata import TaskMetadata
  from mteb.models.abs_encoder import AbsEncoder, get_prompt_name
  from mteb.models.model_meta import ModelMeta
  from mteb.types import PromptType
except ImportError as e:  # pragma: no cover - exercised only without the extra
  raise ImportError("st5_jax.mteb needs the `mteb` package: pip install 'st5_jax[mteb]' "
                    "(mteb==2.26.24).") from e

PAPER = "https://arxiv.org/abs/2108.08877"  # Sentence-T5 (Ni et al., 2021)
CITATION = """@article{ni2021sentence,
  title={Sentence-T5: Scalable Sentence Encoders from Pre-trained Text-to-Text Models},
  author={Ni, Jianmo and Hern{\\'a}ndez {\\'A}brego, Gustavo and Constant, Noah and Ma, Ji and Hall, Keith B. and Cer, Daniel and Yang, Yinfei},
  journal={arXiv preprint arXiv:2108.08877},
  year={2021}
}"""


def _num_params(encoder) -> int | None:
  params = getattr(encoder, "params", None)
  if params is None:
    return None
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))


def _memory_usage_mb(encoder) -> int | None:
  """The parameters' memory as mteb computes it for its models (dtype-aware, MiB rounded)."""
  params = getattr(encoder, "params", None)
  if params is None:
    return None
  total = sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(params))
  return round(total / 2**20)


def training_datasets(path: str, contamination_report: str | dict | None = None) -> set[str] | None:
  """ModelMeta.training_datasets of the model at `path` (module docstring); `contamination_report`: a report file
  or dict, used instead of an export's contamination.json."""
  tasks, report = model_card.recorded_training(path)
  if isinstance(contamination_report, (str, os.PathLike)):
    from st5_jax.data.offline import contamination  # pylint: disable=g-import-not-at-top  (TensorFlow, datasketch)
    report = contamination.read_report(os.fspath(contamination_report))
  elif contamination_report is not None:
    report = contamination_report
  return contamination_names.training_datasets(tasks, report)


def model_meta(encoder, *, path: str, name: str | None = None, revision: str | None = None,
               license: str | None = "apache-2.0", load_kwargs: dict[str, Any] | None = None,
               contamination_report: str | dict | None = None) -> ModelMeta:
  """mteb's ModelMeta for a loaded SentenceEncoder / SavedModelEncoder of `path`."""
  folder = pathlib.Path(str(path).rstrip("/")).name or "model"
  savedmodel = type(encoder).__name__ == "SavedModelEncoder"
  return ModelMeta(
      loader=functools.partial(load, path), loader_kwargs=dict(load_kwargs or {}),
      name=name or f"st5_jax/{folder}", revision=revision, release_date=None, languages=["eng-Latn"],
      n_parameters=_num_params(encoder), memory_usage_mb=_memory_usage_mb(encoder),
      max_tokens=encoder.config.max_length,
      embed_dim=encoder.dim, license=license, open_weights=True,
      public_training_code=None, public_training_data=None,
      framework=["JAX", "TensorFlow"] if savedmodel else ["JAX"], reference=PAPER,
      similarity_fn_name="cosine", use_instructions=bool(getattr(encoder, "prompts", None)),
      training_datasets=training_datasets(path, contamination_report),
      citation=CITATION,
  )


def _revision(path) -> str:
  """mteb keys its result cache by revision: the checkpoint step of a work dir, else "local"."""
  try:
    step = loader.model_step(path, loader.detect_format(path))
  except (OSError, ValueError):
    step = None
  return f"step{step}" if step is not None else "local"


class SentenceT5Encoder(AbsEncoder):
  """mteb's EncoderProtocol over a SentenceEncoder (or SavedModelEncoder): text in, float32 out."""

  def __init__(self, encoder, meta: ModelMeta, *, batch_size: int | None = None):
    self.model = encoder
    self.mteb_model_meta = meta
    self.batch_size = batch_size
    self.model_prompts = dict(getattr(encoder, "prompts", None) or {}) or None  # what AbsEncoder reads

  def encode(self, inputs, *, task_metadata, hf_split: str, hf_subset: str, prompt_type=None,
             **kwargs) -> np.ndarray:
    """float32 [N, D] for every text of the DataLoader, in order, with the prompt mteb's
    sentence-transformers wrapper would choose (module docstring); each side's tower (encode_query /
    encode_document) when the model has asymmetric towers."""
    del hf_split, hf_subset
    texts = [str(t) for batch in inputs for t in batch["text"]]
    batch_size = kwargs.get("batch_size") or self.batch_size
    prompt_name = get_prompt_name(self.model_prompts, task_metadata, prompt_type)
    side = PromptType(prompt_type) if prompt_type is not None else None
    encode = {PromptType.query: self.model.encode_query,
              PromptType.document: self.model.encode_document}.get(side, self.model.encode)
    return encode(texts, batch_size=batch_size, prompt_name=prompt_name,
                  show_progress_bar=bool(kwargs.get("show_progress_bar")))


def load(path: str | os.PathLike, *, name: str | None = None, revision: str | None = None,
         license: str | None = "apache-2.0", contamination_report: str | dict | None = None,
         **load_kwargs) -> SentenceT5Encoder:
  """An mteb encoder for `path`; `load_kwargs` go to SentenceEncoder.load (pooling, vocab, max_length,
  truncate_dim, ...); `contamination_report`: a `st5 data overlap --out` report for training_datasets."""
  path = os.fspath(path)
  encoder = SentenceEncoder.load(path, **load_kwargs)
  return wrap(encoder, path=path, name=name, revision=revision, license=license, load_kwargs=load_kwargs,
              batch_size=load_kwargs.get("batch_size"), contamination_report=contamination_report)


def wrap(encoder, *, path: str, name: str | None = None, revision: str | None = None,
         license: str | None = "apache-2.0", load_kwargs: dict[str, Any] | None = None,
         batch_size: int | None = None, contamination_report: str | dict | None = None) -> SentenceT5Encoder:
  """An mteb encoder over an already loaded SentenceEncoder / SavedModelEncoder of `path`."""
  meta = model_meta(encoder, path=os.fspath(path), name=name, revision=revision or _revision(path),
                    license=license, load_kwargs=load_kwargs, contamination_report=contamination_report)
  return SentenceT5Encoder(encoder, meta, batch_size=batch_size)


# ------------------------------------------------------------------ offline tasks from local data

_GENERAL = dict(
    dataset={"path": "NA", "revision": "NA"},  # never downloaded: load_data reads the local files
    category="t2t", eval_splits=["test"], eval_langs=["eng-Latn"], main_score="cosine_spearman",
    date=("2012-01-01", "2017-12-31"), dialect=["Written"], domains=[], task_subtypes=[], license="not specified",
    annotations_creators="human-annotated", modalities=["text"], sample_creation="found", bibtex_citation="",
)


def _local_sts_task(mteb_name: str, read, *, reference: str, min_score: float, max_score: float):
  """An AbsTaskSTS subclass reading `read(data_dir) -> PairScores` from the local data folder."""

  def load_data(self, num_proc: int | None = None, **kwargs) -> None:
    del num_proc, kwargs
    if getattr(self, "data_loaded", False):
      return
    data = read(self.data_dir)
    self.dataset = DatasetDict({"test": Dataset.from_dict(
        {"sentence1": list(data.sents1), "sentence2": list(data.sents2), "score": [float(s) for s in data.scores]})})
    self.data_loaded = True

  def __init__(self, data_dir=None, **kwargs):
    AbsTaskSTS.__init__(self, **kwargs)
    self.data_dir = data_dir

  metadata = TaskMetadata(name=mteb_name, type="STS", reference=reference,
                          description=f"{mteb_name} read from the local st5_jax data folder (offline).", **_GENERAL)
  return type(f"Local{mteb_name.replace('-', '')}", (AbsTaskSTS,), {
      "metadata": metadata, "load_data": load_data, "__init__": __init__,
      "min_score": min_score, "max_score": max_score})


def _tasks():
  out = {
      "STSBenchmark": _local_sts_task("STSBenchmark", lambda d: readers.read_stsb(d, split="test"),
                                      reference="https://ixa2.si.ehu.eus/stswiki/index.php/STSbenchmark",
                                      min_score=0, max_score=5),
      "SICK-R": _local_sts_task("SICK-R", lambda d: readers.read_sick(d, split="test"),
                                reference="https://aclanthology.org/L14-1314/", min_score=1, max_score=5),
  }
  for year in (2012, 2013, 2014, 2015, 2016):
    name = f"STS{year % 100}"
    out[name] = _local_sts_task(name, functools.partial(lambda d, y: readers.read_sts(d, year=y), y=year),
                                reference="https://aclanthology.org/S12-1051/", min_score=0, max_score=5)
  return out


LOCAL_TASKS = ("STSBenchmark", "SICK-R", "STS12", "STS13", "STS14", "STS15", "STS16")


def local_tasks(names, data_dir=None) -> list:
  """mteb tasks of these names built from the local data folder (default $ST5_DATA_DIR); no network."""
  classes = _tasks()
  lower = {k.lower(): k for k in classes}
  tasks = []
  for n in names:
    key = lower.get(n.lower())
    if key is None:
      raise ValueError(f"no local data for mteb task {n!r}; local tasks: {', '.join(LOCAL_TASKS)}")
    tasks.append(classes[key](data_dir=data_dir))
  return tasks


def get_tasks(names, *, data_dir=None) -> list:
  """mteb tasks by name, in order: local copies for LOCAL_TASKS (the same data, no network),
  mteb's registry for the rest (downloaded by `datasets`, or read from its cache)."""
  local = {t.lower() for t in LOCAL_TASKS}
  tasks = []
  for name in names:
    if name.lower() in local:
      tasks += local_tasks([name], data_dir)
      continue
    try:
      tasks += list(_mteb.get_tasks(tasks=[name]))
    except (KeyError, ValueError) as e:
      raise ValueError(f"unknown mteb task {name!r} ({e}); local tasks: {', '.join(LOCAL_TASKS)}") from e
  return tasks


def scores(results, tasks=()) -> dict[str, dict[str, Any]]:
  """{task: {"main": x100, "metric", "split", "subsets"}} from mteb.evaluate's ModelResult.

  `main` is mteb's main_score (x100, as every st5 eval number), averaged over the task's
  subsets (languages) of its first evaluation split.
  """
  metric = {t.metadata.name: t.metadata.main_score for t in tasks}
  out = {}
  for task_result in results.task_results:
    split, rows = next(iter(task_result.scores.items()))
    out[task_result.task_name] = {
        "main": 100 * float(np.mean([row["main_score"] for row in rows])),
        "metric": metric.get(task_result.task_name, "main_score"), "split": split,
        "subsets": {row.get("hf_subset", "default"): 100 * float(row["main_score"]) for row in rows},
        "mteb_version": rows[0].get("mteb_version") if rows else None,
    }
  return out


def evaluate(model: SentenceT5Encoder, names, *, data_dir=None, batch_size: int | None = None,
             output_folder: str | None = None) -> dict[str, dict[str, Any]]:
  """Runs mteb tasks by name (local copies where we have the data) and returns `scores`.

  `output_folder`: mteb's own result cache (one JSON per task) is written there; None
  keeps nothing on disk, so a rerun evaluates again.
  """
  tasks = get_tasks(names, data_dir=data_dir)
  kwargs = {"encode_kwargs": {"batch_size": batch_size}} if batch_size else {}
  cache = _mteb.ResultCache(output_folder) if output_folder else None
  results = _mteb.evaluate(model, tasks, cache=cache, show_progress_bar=False, **kwargs)
  return scores(results, tasks)
