"""Registration of Sentence-T5 seqio tasks: public sets, users' files, mixtures.

Every task has the features `inputs`, `targets` and (hard-negative tasks)
`negative_targets`, all tokenised with the T5 vocabulary, truncated to the
sequence length minus one and terminated with EOS.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Callable, Mapping, Sequence

import gin
import seqio

from st5_jax.data import builders as builders_lib
from st5_jax.data import rows as rows_lib
from st5_jax.data import sources
from st5_jax.data import vocabulary
from st5_jax.data.rows import RowFormat

QA_FEATURES = ("inputs", "targets")
NLI_FEATURES = ("inputs", "targets", "negative_targets")
DEFAULT_QA_COLUMNS = {"inputs": "question", "targets": "answer"}
DEFAULT_NLI_COLUMNS = dict(builders_lib.SIMCSE_COLUMNS)

# Tokenise, then truncate to length-1 and append EOS (EOS is never cut off).
PREPROCESSORS = (
    functools.partial(seqio.preprocessors.tokenize, copy_pretokenized=False),
    seqio.preprocessors.append_eos_after_trim,
)


def output_features(*, negatives: bool, names: Sequence[str] | None = None) -> dict[str, seqio.Feature]:
  """The token features of a pair or triple task (or of `names`)."""
  vocab = vocabulary.get_vocabulary()
  names = names or (NLI_FEATURES if negatives else QA_FEATURES)
  return {name: seqio.Feature(vocabulary=vocab, add_eos=True, required=True) for name in names}


def _add_task(name: str, source: sources.ExampleSource, *, negatives: bool) -> seqio.Task:
  if name in seqio.TaskRegistry.names():
    seqio.TaskRegistry.remove(name)
  return seqio.TaskRegistry.add(name, source=source, preprocessors=list(PREPROCESSORS),
                                output_features=output_features(negatives=negatives, names=source.features),
                                shuffle_buffer_size=10_000)


def register_public_task(name: str, split_builders: Mapping[str, Callable[..., builders_lib.Built]], *,
                         negatives: bool = False) -> seqio.Task:
  """A task fed by builders over the public raw files (or their prepared JSONL)."""
  source = sources.PublicSource(name, split_builders, features=NLI_FEATURES if negatives else QA_FEATURES)
  return _add_task(name, source, negatives=negatives)


def _as_split_map(file_pattern) -> dict[str, str | Sequence[str]]:
  if isinstance(file_pattern, Mapping):
    return dict(file_pattern)
  return {"train": file_pattern}


def _row_format(*, files, format, columns, header, num_fields, label_column, label_values, keep_labels,
                delimiter) -> RowFormat:
  first = files if isinstance(files, str) else files[0]
  fmt = format or rows_lib.infer_format(first.split(",")[0])
  return RowFormat(fmt, dict(columns), header=header, num_fields=num_fields, label_column=label_column,
                   label_values=tuple(label_values) if label_values is not None else None,
                   keep_labels=tuple(keep_labels) if keep_labels is not None else None, delimiter=delimiter)


def register_user_task(name: str, *, file_pattern: str | Sequence[str] | Mapping[str, str | Sequence[str]],
                       format: str | None = None, columns: Mapping[str, str | int] | None = None,
                       negatives: bool | None = None, header: bool | None = None, num_fields: int | None = None,
                       label_column: str | int | None = None, label_values: Sequence[str] | None = None,
                       keep_labels: Sequence[str] | None = None, delimiter: str = ",") -> seqio.Task:
  """Registers (or replaces) a task over users' files.

  Args:
    name: task name.
    file_pattern: glob(s), comma-separated or a list, local or gs://; or a mapping
      split -> pattern(s). A plain pattern is the "train" split.
    format: "tsv", "csv", "jsonl" or "tfrecord" (tf.Example); inferred from the name.
    columns: feature -> column name/index (TSV/CSV), key (JSON lines) or tf.Example
      feature. Defaults: question/answer, or SimCSE's sent0/sent1/hard_neg when
      `negatives`.
    negatives: whether the task has `negative_targets` (default: from `columns`).
    header, num_fields, label_column, label_values, keep_labels, delimiter: see
      st5_jax.data.rows.RowFormat.
  """
  if negatives is None:
    negatives = columns is not None and "negative_targets" in columns
  columns = dict(columns or (DEFAULT_NLI_COLUMNS if negatives else DEFAULT_QA_COLUMNS))
  split_files = _as_split_map(file_pattern)
  formats = {split: _row_format(files=files, format=format, columns=columns, header=header, num_fields=num_fields,
                                label_column=label_column, label_values=label_values, keep_labels=keep_labels,
                                delimiter=delimiter) for split, files in split_files.items()}
  specs = {split: (split_files[split], formats[split]) for split in split_files}
  features = NLI_FEATURES if negatives else QA_FEATURES
  source = sources.FileSource(name, lambda: specs, splits=tuple(specs), features=features)
  return _add_task(name, source, negatives=negatives)


def register_hard_negatives_task(name: str, *, file_pattern: str | Sequence[str] | Mapping[str, str | Sequence[str]],
                                 num_negatives: int, seed: int = 0,
                                 keys: Sequence[str] = rows_lib.HARD_NEGATIVE_KEYS) -> seqio.Task:
  """Registers (or replaces) a task over `{query, pos: [...], neg: [...]}` JSON lines with K negatives an example.

  Each row yields `inputs` (the query), `targets` (one positive) and `num_negatives` = K negatives
  (`negative_targets`, `negative_targets_1`, ..., `negative_targets_{K-1}`), drawn again every epoch and
  deterministically (st5_jax.data.sources.HardNegativesSplit); a row with fewer than K negatives repeats some.
  Train it with `Contrastive.num_negatives = K`.

  Args:
    name: task name.
    file_pattern: as register_user_task's: glob(s), local or gs://, or a mapping split -> pattern(s).
    num_negatives: K, 1..st5_jax.features.MAX_NEGATIVES.
    seed: mixed into every draw (with the iterator's seed, the epoch and the row's place).
    keys: the rows' query, positives and negatives keys.
  """
  split_files = _as_split_map(file_pattern)
  source = sources.HardNegativesSource(name, lambda: split_files, splits=tuple(split_files),
                                       num_negatives=num_negatives, seed=seed, keys=keys)
  return _add_task(name, source, negatives=True)


USER_HARD_NEGATIVES = "st5_user_hard_negatives"
USER_HARD_NEGATIVES_ENV = "ST5_USER_HARD_NEGATIVES"


@gin.configurable(module="st5_jax.data")
def hard_negatives_task(name: str = USER_HARD_NEGATIVES, *, num_negatives: int, file_pattern=None, seed: int = 0,
                        keys: Sequence[str] = rows_lib.HARD_NEGATIVE_KEYS,
                        splits: Sequence[str] = ("train", "validation")) -> str:
  """Registers a `{query, pos, neg}` task and returns its name: `DataConfig.task = @st5_jax.data.hard_negatives_task()`.

  K (`num_negatives`) sets the task's features, so the task is registered when gin builds the run
  (K is known then), not on import. The files are read when data is: `file_pattern` (a glob, a dict
  split -> glob) or else $ST5_USER_HARD_NEGATIVES ('gs://b/mined/part-*.jsonl' or 'train=...;validation=...').
  """

  def resolve():
    pattern = file_pattern or os.environ.get(USER_HARD_NEGATIVES_ENV)
    if not pattern:
      raise ValueError(f"Task {name} has no input files: bind st5_jax.data.hard_negatives_task.file_pattern in gin "
                       f"(a glob, or a dict split -> glob) or set {USER_HARD_NEGATIVES_ENV}='out/part-*.jsonl' (the "
                       "files `st5 data mine` writes).")
    return parse_split_patterns(pattern) if isinstance(pattern, str) else _as_split_map(pattern)

  source = sources.HardNegativesSource(name, resolve, splits=tuple(splits), num_negatives=num_negatives, seed=seed,
                                       keys=keys)
  _add_task(name, source, negatives=True)
  return name


# ----------------------------------------------------------------------------
# Tasks whose files come from gin or the environment when data is read.


@gin.configurable(module="st5_jax.data")
def user_qa_pairs(file_pattern=None, format=None, columns=None, header=None, num_fields=None, label_column=None,
                  label_values=None, keep_labels=None, delimiter=","):
  """Gin bindings of the `st5_user_qa_pairs` task (env: ST5_USER_QA_PAIRS, ST5_USER_QA_COLUMNS)."""
  return dict(file_pattern=file_pattern, format=format, columns=columns, header=header, num_fields=num_fields,
              label_column=label_column, label_values=label_values, keep_labels=keep_labels, delimiter=delimiter)


@gin.configurable(module="st5_jax.data")
def user_nli_triples(file_pattern=None, format=None, columns=None, header=None, num_fields=None,
                     label_column=None, label_values=None, keep_labels=None, delimiter=","):
  """Gin bindings of the `st5_user_nli_triples` task (env: ST5_USER_NLI_TRIPLES, ST5_USER_NLI_COLUMNS)."""
  return dict(file_pattern=file_pattern, format=format, columns=columns, header=header, num_fields=num_fields,
              label_column=label_column, label_values=label_values, keep_labels=keep_labels, delimiter=delimiter)


def parse_split_patterns(value: str) -> dict[str, str]:
  """'gs://b/qa-*.tsv' (the train split) or 'train=gs://b/train-*.tsv;validation=gs://b/dev.tsv'."""
  parts = [p.strip() for p in value.split(";") if p.strip()]
  pairs = [p.partition("=") for p in parts]
  if pairs and all(sep and re.fullmatch(r"[A-Za-z_][\w-]*", key.strip()) for key, sep, _ in pairs):
    return {key.strip(): pattern.strip() for key, _, pattern in pairs}
  return {"train": value}


def parse_columns(value: str) -> dict[str, str | int]:
  """'inputs=question,targets=answer' (integers are column indices)."""
  out = {}
  for part in value.split(","):
    if part.strip():
      key, _, col = part.partition("=")
      col = col.strip()
      out[key.strip()] = int(col) if col.isdigit() else col
  return out


def register_configured_user_task(name: str, *, configurable: Callable[[], dict], env: str, columns_env: str,
                                  negatives: bool, splits: Sequence[str] = ("train", "validation")) -> seqio.Task:
  """A user-file task whose patterns and columns are read from gin/env at data time."""
  default_columns = DEFAULT_NLI_COLUMNS if negatives else DEFAULT_QA_COLUMNS

  def resolve():
    cfg = dict(configurable())
    pattern = cfg.pop("file_pattern") or os.environ.get(env)
    if not pattern:
      raise ValueError(
          f"Task {name} has no input files: bind st5_jax.data.{configurable.__name__}.file_pattern in gin "
          f"(a glob, or a dict split -> glob) or set {env}='gs://bucket/path/*.tsv' "
          f"(or 'train=...;validation=...').")
    split_files = parse_split_patterns(pattern) if isinstance(pattern, str) else _as_split_map(pattern)
    columns = cfg.pop("columns") or (parse_columns(os.environ[columns_env]) if os.environ.get(columns_env)
                                     else default_columns)
    return {split: (files, _row_format(files=files, columns=columns, **cfg)) for split, files in split_files.items()}

  source = sources.FileSource(name, resolve, splits=splits, features=NLI_FEATURES if negatives else QA_FEATURES)
  return _add_task(name, source, negatives=negatives)


def size_rate(task: seqio.Task, *, split: str = "train") -> float:
  """Mixing rate proportional to the number of examples (a mixture then behaves like concatenation)."""
  n = task.source.num_input_examples(split)
  if n is None:
    raise ValueError(f"Task {task.name} cannot count its examples; give the mixture explicit rates.")
  return float(n)


def register_mixture(name: str, tasks_and_rates: Sequence[tuple[str, float | Callable]] | Sequence[str]) -> seqio.Mixture:
  """Registers (or replaces) a mixture; bare task names get rates proportional to their sizes."""
  entries = [(t, size_rate) if isinstance(t, str) else t for t in tasks_and_rates]
  if name in seqio.MixtureRegistry.names():
    seqio.MixtureRegistry.remove(name)
  return seqio.MixtureRegistry.add(name, entries)
