"""seqio DataSources over the public builders and over users' files.

Beyond the seqio API, a source's `open(split)` resolves its configuration (data
folder, gin bindings, environment, strictness) in the calling thread and returns a
`SplitReader`: a deterministic Python iterator of text examples per shard that the
NumPy path shuffles, skips and tokenises itself (streams.NumpyStream), and that
seqio's `get_dataset` wraps for t5x-style use. SplitReaders run inside tf.data
threads, so they take no locks, call no gin configurables and do not log: a
garbage-collected tf.data iterator can otherwise deadlock against such a lock.
"""

from __future__ import annotations

import json
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np
import seqio
import tensorflow as tf

from st5_jax import features as features_lib
from st5_jax import paths
from st5_jax.data import builders as builders_lib
from st5_jax.data import config, overlap
from st5_jax.data import rows as rows_lib
from st5_jax.data.rows import RowFormat, RowReader, RowStats
from st5_jax.errors import BadRowError, InputFileError

PREPARED_FORMAT_VERSION = 1
_CHUNK = 512


def chunked(examples: Iterator[Mapping[str, str]], features: Sequence[str], size: int = _CHUNK):
  """Groups examples into column-wise chunks {feature: [str, ...]} (cheap tf.data hand-off)."""
  chunk = {f: [] for f in features}
  n = 0
  for ex in examples:
    for f in features:
      chunk[f].append(ex[f])
    n += 1
    if n == size:
      yield chunk
      chunk = {f: [] for f in features}
      n = 0
  if n:
    yield chunk


class SplitReader:
  """Examples of one split, resolved and ready to read from any thread."""

  def __init__(self, *, features: Sequence[str], description: str, build_stats: dict | None = None):
    self.features = tuple(features)
    self.description = description
    self.build_stats = build_stats or {}

  def iter_examples(self, *, shard_index: int = 0, num_shards: int = 1, file_order_seed: int | None = None,
                    stats: RowStats | None = None) -> Iterator[dict[str, str]]:
    raise NotImplementedError

  def count(self, *, shard_index: int = 0, num_shards: int = 1, stats: RowStats | None = None,
            limit: int | None = None) -> int:
    """Examples in a shard (stops early once past `limit`)."""
    n = 0
    for _ in self.iter_examples(shard_index=shard_index, num_shards=num_shards, stats=stats):
      n += 1
      if limit is not None and n > limit:
        break
    return n


class MemorySplit(SplitReader):
  """Examples built in memory; shard i of n is examples[i::n]."""

  def __init__(self, examples: list[dict[str, str]], **kwargs):
    super().__init__(**kwargs)
    self._examples = examples

  def iter_examples(self, *, shard_index=0, num_shards=1, file_order_seed=None, stats=None):
    del file_order_seed, stats  # build rows were counted when building (build_stats)
    features = self.features
    for ex in self._examples[shard_index::num_shards]:
      yield {f: ex[f] for f in features}

  def count(self, *, shard_index=0, num_shards=1, stats=None, limit=None):
    return len(range(shard_index, len(self._examples), num_shards))


class FileSplit(SplitReader):
  """Rows of files; with at least as many files as shards, each shard owns whole files."""

  def __init__(self, reader: RowReader, **kwargs):
    super().__init__(features=reader.features, **kwargs)
    self.reader = reader
    self.files = reader.files()  # missing or empty files fail here, in the caller's thread

  def iter_examples(self, *, shard_index=0, num_shards=1, file_order_seed=None, stats=None):
    order = None
    if file_order_seed is not None and len(self.files) >= num_shards:
      mine = len(self.files[shard_index::num_shards])
      if mine > 1:
        order = np.random.default_rng(file_order_seed).permutation(mine).tolist()
    yield from self.reader.iter_examples(shard_index=shard_index, num_shards=num_shards, file_order=order,
                                         stats=stats)


class ExampleSource(seqio.DataSource):
  """A DataSource whose examples are Python dicts of strings."""

  def __init__(self, *, splits: Sequence[str], features: Sequence[str]):
    self.features = tuple(features)
    self.stats = RowStats()  # for seqio's get_dataset; the pipeline keeps its own per iterator
    super().__init__(splits=splits, caching_permitted=False)

  @property
  def supports_arbitrary_sharding(self) -> bool:
    return True  # by file, or by record when there are fewer files than shards

  def open(self, split: str, *, data_dir: str | None = None, strict: bool | None = None) -> SplitReader:
    raise NotImplementedError

  def iter_examples(self, split: str, *, shard_index: int = 0, num_shards: int = 1,
                    file_order_seed: int | None = None, stats: RowStats | None = None) -> Iterator[dict[str, str]]:
    """Convenience for the caller's thread: open(split).iter_examples(...)."""
    yield from self.open(split).iter_examples(shard_index=shard_index, num_shards=num_shards,
                                              file_order_seed=file_order_seed, stats=stats)

  def get_dataset(self, split: str = "train", shuffle: bool = True, seed: int | None = None,
                  shard_info: seqio.ShardInfo | None = None, *, sequence_length=None, use_cached=False,
                  num_epochs=1) -> tf.data.Dataset:
    del sequence_length, use_cached, num_epochs  # part of seqio's signature only
    index, count = (shard_info.index, shard_info.num_shards) if shard_info else (0, 1)
    reader = self.open(split)
    stats = self.stats
    file_seed = seed if shuffle else None
    if isinstance(reader, MemorySplit):  # no Python inside tf.data: nothing to deadlock on
      rows = list(reader.iter_examples(shard_index=index, num_shards=count))
      return tf.data.Dataset.from_tensor_slices(
          {f: np.asarray([r[f] for r in rows], dtype=object) for f in reader.features})

    def gen():
      yield from chunked(reader.iter_examples(shard_index=index, num_shards=count, file_order_seed=file_seed,
                                              stats=stats), reader.features)

    signature = {f: tf.TensorSpec([None], tf.string) for f in self.features}
    return tf.data.Dataset.from_generator(gen, output_signature=signature).unbatch()

  def list_shards(self, split: str) -> Sequence[str]:
    return [self.open(split).description]


class PublicSource(ExampleSource):
  """A public task: prepared JSONL under <data_dir>/prepared when present, else built in memory."""

  def __init__(self, name: str, builders: Mapping[str, Callable[..., builders_lib.Built]],
               *, features: Sequence[str] = ("inputs", "targets")):
    super().__init__(splits=tuple(builders), features=features)
    self.name = name
    self._builders = dict(builders)
    self._cache: dict[tuple, builders_lib.Built] = {}

  def prepared_file(self, split: str, data_dir: str | None = None) -> str:
    return paths.join(config.prepared_dir(data_dir), self.name, f"{split}.jsonl")

  def _check_split(self, split: str) -> None:
    if split not in self._builders:
      raise ValueError(f"Task {self.name} has no split {split!r}; splits: {sorted(self._builders)}.")

  def build(self, split: str, *, data_dir: str | None = None, strict: bool | None = None,
            decontaminate: bool | None = None) -> builders_lib.Built:
    """Runs the builder on the raw files (what `st5 data prepare` writes out).

    Examples sharing a text with an evaluation set are then dropped and counted
    (st5_jax.data.overlap), unless `decontaminate` (default: the data options) is off.
    """
    self._check_split(split)
    data_dir = data_dir or config.data_dir()
    strict = config.strict() if strict is None else strict
    decontaminate = config.options().decontaminate if decontaminate is None else decontaminate
    stats = RowStats(max_reported=config.options().max_reported)
    built = self._builders[split](data_dir, stats=stats, strict=strict)
    if decontaminate:
      built.examples, built.evaluation_sets_missing = overlap.decontaminate(
          built.examples, self.features, data_dir=data_dir, stats=built.stats)
      overlap.warn_missing(self.name, data_dir, built.evaluation_sets_missing)
    return built

  def _built(self, split: str, data_dir: str, strict: bool) -> builders_lib.Built:
    decontaminate = config.options().decontaminate
    key = (data_dir, split, strict, decontaminate)
    built = self._cache.get(key)
    if built is None:  # no lock on purpose (see module doc); a race only builds twice
      built = self._cache.setdefault(key, self.build(split, data_dir=data_dir, strict=strict,
                                                     decontaminate=decontaminate))
    return built

  def _manifest(self, data_dir: str) -> dict:
    path = paths.join(config.prepared_dir(data_dir), "MANIFEST.json")
    if not paths.exists(path):
      return {}
    manifest = json.loads(paths.read_text(path))
    if manifest.get("format_version") != PREPARED_FORMAT_VERSION:
      raise InputFileError(f"{path} has format_version {manifest.get('format_version')}, this code reads "
                           f"{PREPARED_FORMAT_VERSION}; rerun `st5 data prepare`.")
    return manifest

  def open(self, split, *, data_dir=None, strict=None):
    self._check_split(split)
    data_dir = data_dir or config.data_dir()
    strict = config.strict() if strict is None else strict
    prepared = self.prepared_file(split, data_dir)
    if paths.exists(prepared):
      entry = self._manifest(data_dir).get("tasks", {}).get(self.name, {}).get(split, {})
      reader = RowReader(prepared, RowFormat("jsonl", {f: f for f in self.features}), strict=strict, name=self.name)
      return FileSplit(reader, description=prepared, build_stats=entry.get("stats", {}))
    if paths.is_remote(data_dir):
      raise InputFileError(f"{prepared} does not exist. For gs:// data folders run `st5 data prepare` locally and "
                           "copy its output (including prepared/) to the bucket.")
    built = self._built(split, data_dir, strict)
    return MemorySplit(built.examples, features=self.features, build_stats=built.stats.as_dict(),
                       description=f"{self.name}:{split} built in memory from {data_dir}")

  def examples(self, split: str) -> list[dict[str, str]]:
    """All examples of a split with their `source` provenance (for inspection and tests)."""
    data_dir = config.data_dir()
    prepared = self.prepared_file(split, data_dir)
    if paths.exists(prepared):
      return [json.loads(line) for line in paths.read_text(prepared).splitlines() if line.strip()]
    return list(self._built(split, data_dir, config.strict()).examples)

  def num_input_examples(self, split: str) -> int:
    return self.open(split).count()


class FileSource(ExampleSource):
  """Users' files: TSV, CSV, JSON lines or TFRecords of tf.Examples; globs; local or gs://.

  `resolve` returns {split: (file_patterns, RowFormat)}; it is called by `open`, so
  gin bindings and environment variables set after import still apply.
  """

  def __init__(self, name: str, resolve: Callable[[], Mapping[str, tuple[str | Sequence[str], RowFormat]]],
               *, splits: Sequence[str], features: Sequence[str]):
    super().__init__(splits=splits, features=features)
    self.name = name
    self._resolve = resolve

  def open(self, split, *, data_dir=None, strict=None):
    del data_dir  # users' patterns are absolute, gs://, or relative to the working directory
    specs = self._resolve()
    if split not in specs:
      raise ValueError(f"Task {self.name} has no files for split {split!r}; configured splits: {sorted(specs)}.")
    patterns, row_format = specs[split]
    missing = [f for f in self.features if f not in row_format.columns]
    if missing:
      raise ValueError(f"Task {self.name}: columns {dict(row_format.columns)} lack feature(s) {missing}.")
    fmt = RowFormat(row_format.format, {f: row_format.columns[f] for f in self.features}, row_format.header,
                    row_format.num_fields, row_format.label_column, row_format.label_values,
                    row_format.keep_labels, row_format.delimiter)
    strict = config.strict() if strict is None else strict
    reader = RowReader(patterns, fmt, strict=strict, name=self.name)
    return FileSplit(reader, description=",".join(reader.files()))

  def num_input_examples(self, split: str) -> int | None:
    return None  # unknown without reading the files


# ----------------------------------------------------------------------------
# Training files with several negatives per query.


def sample_negatives(negatives: Sequence[str], k: int, rng: np.random.Generator) -> list[str]:
  """K of the row's negatives: K distinct ones when it has K or more; otherwise every one of them (in a random
  order) and the rest drawn again with replacement (Tevatron pads the same way)."""
  n = len(negatives)
  if n >= k:
    picks = rng.choice(n, size=k, replace=False)
  else:
    picks = np.concatenate([rng.permutation(n), rng.integers(0, n, size=k - n)])
  return [negatives[i] for i in picks.tolist()]


class HardNegativesSplit(SplitReader):
  """`{query, pos: [...], neg: [...]}` JSON lines (FlagEmbedding's, Tevatron's, `st5 data mine`'s) as examples.

  Each row is one example: `inputs` the query, `targets` one of its positives and K negatives
  (`negative_targets`, `negative_targets_1`, ... as st5_jax.features.negative_features names them),
  drawn by `numpy.random.default_rng([seed, epoch key, file number, line])`. The epoch key is the
  `file_order_seed` the streams derive from (iterator seed, task, epoch) when they shuffle (0 when they do
  not), so an example's draw is a pure function of the seeds, the epoch and where the row is: the same
  whatever the shard, the file order or the point a resumed run restarts from, and new every epoch.
  Rows whose negatives are all missing or empty are filtered ("no negatives"); malformed rows are bad rows.
  """

  def __init__(self, file_patterns: str | Sequence[str], *, num_negatives: int, seed: int = 0,
               keys: Sequence[str] = rows_lib.HARD_NEGATIVE_KEYS, strict: bool = False, name: str = ""):
    negatives = [task_key for task_key, _ in features_lib.negative_features(num_negatives)]
    self.files = rows_lib.list_files(file_patterns)  # missing or empty files fail here, in the caller's thread
    super().__init__(features=("inputs", "targets", *negatives), description=",".join(self.files))
    self.negative_keys = tuple(negatives)
    self.seed, self.keys, self.strict, self.name = int(seed), tuple(keys), strict, name

  def _rows(self, shard_index: int, num_shards: int, file_order_seed: int | None,
            stats: RowStats) -> Iterator[tuple[int, int, tuple[str, list[str], list[str]]]]:
    """(file number, line, (query, positives, negatives)) of this shard's usable rows; files and records shard as
    RowReader's (whole files with at least as many files as shards, else record i of every file to shard i % n)."""
    numbered = list(enumerate(self.files))
    if len(numbered) >= num_shards:
      mine, record_shard = numbered[shard_index::num_shards], None
      if file_order_seed is not None and len(mine) > 1:
        mine = [mine[i] for i in np.random.default_rng(file_order_seed).permutation(len(mine)).tolist()]
    else:
      mine, record_shard = numbered, (shard_index, num_shards)
    record_index = -1
    for number, path in mine:
      for line, record in rows_lib.iter_jsonl_records(path):
        record_index += 1
        if record_shard and record_index % record_shard[1] != record_shard[0]:
          continue
        new = stats.is_new(path, line)
        if new:
          stats.rows_read += 1
        values = record if isinstance(record, str) else rows_lib.hard_negative_values(record, self.keys)
        if isinstance(values, str):
          if new:
            if self.strict:
              raise BadRowError(f"{path}:{line}: {values} (strict mode; set strict=False to skip and count bad rows)")
            stats.skip(f"{path}:{line}", values, kind=values.split(" (")[0])
          continue
        if not values[2]:
          if new:
            stats.filter("no negatives")
          continue
        yield number, line, values

  def iter_examples(self, *, shard_index=0, num_shards=1, file_order_seed=None, stats=None):
    stats = stats if stats is not None else RowStats()
    epoch_key = 0 if file_order_seed is None else int(file_order_seed)
    k = len(self.negative_keys)
    for number, line, (query, positives, negatives) in self._rows(shard_index, num_shards, file_order_seed, stats):
      rng = np.random.default_rng([self.seed, epoch_key, number, line])
      example = {"inputs": query, "targets": positives[int(rng.integers(len(positives)))]}
      example.update(zip(self.negative_keys, sample_negatives(negatives, k, rng)))
      yield example

  def count(self, *, shard_index=0, num_shards=1, stats=None, limit=None):
    n = 0
    for _ in self._rows(shard_index, num_shards, None, stats if stats is not None else RowStats()):
      n += 1
      if limit is not None and n > limit:
        break
    return n


class HardNegativesSource(ExampleSource):
  """Users' `{query, pos, neg}` JSON lines with K negatives per example (HardNegativesSplit).

  `resolve` returns {split: file patterns}; it is called by `open`, so gin bindings and
  environment variables set after registration still apply.
  """

  def __init__(self, name: str, resolve: Callable[[], Mapping[str, str | Sequence[str]]], *, splits: Sequence[str],
               num_negatives: int, seed: int = 0, keys: Sequence[str] = rows_lib.HARD_NEGATIVE_KEYS):
    negatives = [task_key for task_key, _ in features_lib.negative_features(num_negatives)]
    super().__init__(splits=splits, features=("inputs", "targets", *negatives))
    self.name = name
    self.num_negatives, self.seed, self.keys = num_negatives, seed, tuple(keys)
    self._resolve = resolve

  def open(self, split, *, data_dir=None, strict=None):
    del data_dir  # users' patterns are absolute, gs://, or relative to the working directory
    specs = self._resolve()
    if split not in specs:
      raise ValueError(f"Task {self.name} has no files for split {split!r}; configured splits: {sorted(specs)}.")
    strict = config.strict() if strict is None else strict
    return HardNegativesSplit(specs[split], num_negatives=self.num_negatives, seed=self.seed, keys=self.keys,
                              strict=strict, name=self.name)

  def num_input_examples(self, split: str) -> int | None:
    return None  # unknown without reading the files
