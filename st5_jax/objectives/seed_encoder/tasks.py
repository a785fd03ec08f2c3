"""seqio tasks for SEED-Encoder pre-training (objective `seed_encoder`), registered on import.

Each task turns plain text into the three features of st5_jax.features.SEED_*:
`inputs` (span-corrupted text), `targets` (the noise spans after their sentinels) and
`uncorrupted` (the segment before corruption, the weak decoder's reconstruction
target), through `PREPROCESSORS`: text -> `targets`, tokenize, T5 span corruption
(st5_jax/objectives/seed_encoder/span_corruption.py: noise density 0.15, mean span 3, one text per example,
long texts split into segments), EOS. Train with

    DataConfig.task = 'st5_seed_qa_text'
    DataConfig.feature_lengths = {'inputs': 64, 'targets': 14, 'uncorrupted': 57}
    DataConfig.model_features = {'inputs': 'encoder_input_tokens', ...}   # SEED_MODEL_FEATURE_NAMES

(`span_corruption.feature_lengths(inputs_length)` gives the three lengths.)

  st5_seed_qa_text     the distinct texts (questions and answers) of the stage-1 public QA tasks
                       (Qatar Living, TREC-QA, WikiQA; st5_jax.data.tasks), plus the paragraphs of
                       SQuAD v1.1 *train* when squad_v1.1/train-v1.1.json is in the data folder
                       (never SQuAD dev: GLUE QNLI dev is built from it). Decontaminated like every
                       public task: a text found in an evaluation set is dropped and counted.
  st5_seed_user_text   users' text files, one text per line (seqio.TextLineDataSource), from gin
                       `st5_jax.data.seed_user_text.file_pattern` or $ST5_SEED_USER_TEXT (a glob, or
                       'train=...;validation=...'). Not decontaminated: check with `st5 data overlap`.
  st5_seed_tfds_c4     TFDS `c4/en:3.1.0` (`text`), for TPU VMs reading gs://tfds-data; documents
                       are not compared with the (sentence-level) evaluation sets.

`register_text_line_task` registers a text-file task under any name.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Mapping, Sequence

import gin
import seqio
import tensorflow as tf

from st5_jax import paths
from st5_jax.data import builders as builders_lib
from st5_jax.objectives.seed_encoder import span_corruption as sc
from st5_jax.data import registry, sources, tfds_tasks, vocabulary
from st5_jax.data.rows import RowStats

QA_TEXT = "st5_seed_qa_text"
USER_TEXT = "st5_seed_user_text"
TFDS_C4 = "st5_seed_tfds_c4"
TFDS_C4_NAME = "c4/en:3.1.0"
USER_TEXT_ENV = "ST5_SEED_USER_TEXT"
TEXT_FEATURE = "text"
OUTPUT_FEATURE_NAMES = ("inputs", "targets", "uncorrupted")

# The stage-1 QA builders whose texts make up st5_seed_qa_text (the tasks of
# st5_jax.data.tasks.STAGE1_PUBLIC_TASKS).
QA_BUILDERS = (builders_lib.build_qatar_living_good, builders_lib.build_qatar_living_perfect_match,
               builders_lib.build_trecqa, builders_lib.build_wikiqa)


def _text_to_targets(ds: tf.data.Dataset) -> tf.data.Dataset:
  """{"text": ...} (or a bare string, as TextLineDataSource yields) -> {"targets": ...}."""

  def rekey(x):
    return {"targets": x[TEXT_FEATURE] if isinstance(x, Mapping) else x}

  return ds.map(rekey, num_parallel_calls=tf.data.AUTOTUNE)


# text -> targets, tokenize, span corruption keeping the uncorrupted segment, EOS after trimming.
PREPROCESSORS = (
    _text_to_targets,
    functools.partial(seqio.preprocessors.tokenize, copy_pretokenized=False),
    seqio.utils.add_kwargs_to_transform(sc.span_corruption, merge_examples_to_reduce_padding=False,
                                        uncorrupted_feature_key="uncorrupted"),
    seqio.preprocessors.append_eos_after_trim,
)


def output_features() -> dict[str, seqio.Feature]:
  vocab = vocabulary.get_vocabulary()
  return {name: seqio.Feature(vocabulary=vocab, add_eos=True, required=True) for name in OUTPUT_FEATURE_NAMES}


def _add(name: str, source: seqio.DataSource) -> seqio.Task:
  if name in seqio.TaskRegistry.names():
    seqio.TaskRegistry.remove(name)
  return seqio.TaskRegistry.add(name, source=source, preprocessors=list(PREPROCESSORS),
                                output_features=output_features(), shuffle_buffer_size=10_000)


# ----------------------------------------------------------------------------- QA text


def _key(text: str) -> str:
  return " ".join(text.replace(";", ",").lower().split())


def build_qa_text(data_dir, *, stats: RowStats, strict: bool = False) -> builders_lib.Built:
  """The distinct questions and answers of the stage-1 QA tasks (+ SQuAD train paragraphs).

  A text is kept once (case, spacing and the Qatar Living ','->';' cleaning ignored);
  the rows read and skipped are the QA builders' own.
  """
  seen, examples, inputs = set(), [], []
  for build in QA_BUILDERS:
    built = build(data_dir, stats=stats, strict=strict)
    inputs += built.inputs
    for ex in built.examples:
      for feature in ("inputs", "targets"):
        text = ex[feature]
        key = _key(text)
        if key in seen:
          stats.filter("duplicate text")
          continue
        seen.add(key)
        row = {TEXT_FEATURE: text, "source": f"{ex['source']}#{feature}"}
        if feature == "inputs" and builders_lib.DECONTAMINATION_TEXTS in ex:  # a question's body, checked too
          row[builders_lib.DECONTAMINATION_TEXTS] = ex[builders_lib.DECONTAMINATION_TEXTS]
        examples.append(row)
  for rel in builders_lib.SQUAD_TRAIN_FILES:  # only when present: SQuAD dev is an evaluation source
    path = paths.join(data_dir, rel)
    if not paths.exists(path):
      continue
    data = json.loads(paths.read_text(path))
    inputs.append(rel)
    for article in data.get("data", []):
      for i, paragraph in enumerate(article.get("paragraphs", [])):
        stats.rows_read += 1
        text = " ".join(paragraph.get("context", "").split())
        if not text or _key(text) in seen:
          stats.filter("empty or duplicate text")
          continue
        seen.add(_key(text))
        examples.append({TEXT_FEATURE: text, "source": f"{path}:{article.get('title', '?')}/{i}"})
  return builders_lib.Built(examples, stats, inputs)


# ----------------------------------------------------------------------------- users' text files


class _TextLineSource(seqio.DataSource):
  """seqio.TextLineDataSource whose file patterns are resolved when a dataset is built
  (so gin bindings and environment variables set after import apply)."""

  def __init__(self, name: str, resolve, *, splits: Sequence[str], skip_header_lines: int = 0):
    self._name = name
    self._resolve = resolve
    self._skip = skip_header_lines
    super().__init__(splits=splits, caching_permitted=False)

  def _source(self, split: str) -> seqio.TextLineDataSource:
    patterns = self._resolve()
    if split not in patterns:
      raise ValueError(f"Task {self._name} has no files for split {split!r}; configured splits: {sorted(patterns)}.")
    files = patterns[split]
    files = [f.strip() for f in files.split(",")] if isinstance(files, str) else list(files)
    found = [f for p in files for f in tf.io.gfile.glob(p)]
    if not found:
      raise FileNotFoundError(f"Task {self._name}: no file matches {files} (split {split!r}).")
    return seqio.TextLineDataSource({split: sorted(found)}, skip_header_lines=self._skip)

  @property
  def supports_arbitrary_sharding(self) -> bool:
    return False

  def get_dataset(self, split: str = "train", shuffle: bool = True, seed: int | None = None,
                  shard_info: seqio.ShardInfo | None = None, *, sequence_length=None, use_cached=False,
                  num_epochs=1) -> tf.data.Dataset:
    del sequence_length, use_cached, num_epochs
    return self._source(split).get_dataset(split=split, shuffle=shuffle, seed=seed, shard_info=shard_info)

  def list_shards(self, split: str) -> Sequence[str]:
    return self._source(split).list_shards(split)

  def num_input_examples(self, split: str) -> int | None:
    return None


def register_text_line_task(name: str, *, file_pattern: str | Sequence[str] | Mapping[str, str | Sequence[str]],
                            skip_header_lines: int = 0) -> seqio.Task:
  """A pre-training task over text files, one text per line (a glob or list; or split -> glob)."""
  split_files = dict(file_pattern) if isinstance(file_pattern, Mapping) else {"train": file_pattern}
  return _add(name, _TextLineSource(name, lambda: split_files, splits=tuple(split_files),
                                    skip_header_lines=skip_header_lines))


@gin.configurable(module="st5_jax.data")
def seed_user_text(file_pattern=None, skip_header_lines: int = 0):
  """Gin bindings of the `st5_seed_user_text` task (env: ST5_SEED_USER_TEXT)."""
  return dict(file_pattern=file_pattern, skip_header_lines=skip_header_lines)


def _resolve_user_text() -> dict[str, str | Sequence[str]]:
  pattern = seed_user_text()["file_pattern"] or os.environ.get(USER_TEXT_ENV)
  if not pattern:
    raise ValueError(f"Task {USER_TEXT} has no input files: bind st5_jax.data.seed_user_text.file_pattern in gin "
                     f"(a glob, or a dict split -> glob) or set {USER_TEXT_ENV}='gs://bucket/text/*.txt' "
                     "(or 'train=...;validation=...').")
  return registry.parse_split_patterns(pattern) if isinstance(pattern, str) else dict(pattern)


# ----------------------------------------------------------------------------- registration


def register() -> None:
  source = sources.PublicSource(QA_TEXT, {"train": build_qa_text}, features=(TEXT_FEATURE,))
  _add(QA_TEXT, source)
  _add(USER_TEXT, _TextLineSource(USER_TEXT, _resolve_user_text, splits=("train", "validation")))
  # Data folder resolved on first use (gin st5_jax.data.options.tfds_data_dir, $TFDS_DATA_DIR).
  _add(TFDS_C4, tfds_tasks.LazyTfdsDataSource(TFDS_C4_NAME, splits=("train", "validation")))


register()

ALL_TASKS = (QA_TEXT, USER_TEXT, TFDS_C4)
