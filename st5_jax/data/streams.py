"""One task's examples for one reader, epoch after epoch, as rows of the batch layout.

Two implementations of the same contract (`take(n)` -> n rows; `cursor` = (epoch,
offset) of the next row; a stream started at a cursor continues exactly there):

* `SeqioStream` -- any seqio Task: every epoch is `seqio.get_dataset(task, ...,
  num_epochs=1, shard_info=ShardInfo(reader, readers), seed=<seed of this epoch>,
  feature_converter=DualEncoderFeatureConverter)`, i.e. the task's own source
  (TFDS, TextLine, TFExample, Function, ...), preprocessors, shuffle buffer and
  trimming, as t5x runs them. Resuming at (epoch, offset) rebuilds that epoch's
  dataset and skips `offset` examples inside tf.data.
* `NumpyStream` -- this project's ExampleSource tasks whose preprocessors are exactly
  tokenize + append_eos_after_trim: the source's rows are shuffled by a NumPy
  generator and tokenised in blocks from Python (convert.TextEncoder), skipping
  before tokenisation on resume. It yields the same tokens as seqio for the same rows.

Each epoch has its own seed, derived from (seed, task name, epoch), so epochs are
reshuffled and an epoch's order never depends on what came before it.
"""

from __future__ import annotations

import itertools
import zlib
from typing import Any, Iterator

import numpy as np
import seqio

from st5_jax.data import convert, feature_converters
from st5_jax.data import sources as sources_lib
from st5_jax.batch_geometry import DataConfigError
from st5_jax.data.rows import RowStats

# Examples per tf.data batch handed from seqio's pipeline to Python (cheap hand-off).
SEQIO_CHUNK = 256


def task_key(name: str) -> int:
  return zlib.crc32(name.encode("utf-8"))


def epoch_seed(seed: int, task_name: str, epoch: int) -> int:
  """The seqio seed of one epoch of one task (shuffling and seeded preprocessors)."""
  return int(np.random.default_rng([seed, task_key(task_name), epoch, 1]).integers(0, 2**31 - 1))


def shuffle_buffer(items: Iterator[Any], size: int, rng: np.random.Generator) -> Iterator[Any]:
  """Reservoir-style shuffle (as tf.data's): a full shuffle when the data fits in the buffer."""
  buffer = []
  draws = iter(())
  for item in items:
    if len(buffer) < size:
      buffer.append(item)
      continue
    j = next(draws, None)
    if j is None:
      draws = iter(rng.integers(0, size, 4096).tolist())
      j = next(draws)
    buffer[j], item = item, buffer[j]
    yield item
  for j in rng.permutation(len(buffer)).tolist():
    yield buffer[j]


def uses_numpy_path(task: seqio.Task, layout: convert.BatchLayout) -> bool:
  """Whether a task can run on the NumPy path (project sources, standard preprocessors, text only)."""
  return (isinstance(task.source, sources_lib.ExampleSource) and convert.has_standard_preprocessors(task)
          and all(f.is_tokens and f.task_key in task.source.features for f in layout.features))


class TaskStream:
  """Common bookkeeping: the cursor, the epoch size once known, the empty-shard error."""

  kind = ""

  def __init__(self, task: seqio.Task, *, split: str, reader_id: int, num_readers: int, seed: int, shuffle: bool,
               repeat: bool):
    self.task = task
    self.split = split
    self.reader_id, self.num_readers = reader_id, num_readers
    self.seed, self.shuffle, self.repeat = seed, shuffle, repeat
    self.epoch_size: int | None = None
    self.cursor = (0, 0)
    self._finished: tuple[int, int] | None = None  # (epoch, size) of the last epoch read to its end
    self.last_epoch: int | None = None  # set: the stream ends after this epoch (an elastic resume's unit)
    self.stats = RowStats()

  def _empty_message(self, where: str = "") -> str:
    return (f"Task {self.task.name} split {self.split!r} has no usable examples in shard {self.reader_id} of "
            f"{self.num_readers}{where}.")

  def locate(self, position: int) -> tuple[int, int]:
    """(epoch, offset) of the `position`-th example of this reader's stream (counts a pass if needed)."""
    if position == 0:
      return 0, 0
    if self.epoch_size is None:
      n = self._count(limit=position)
      if n > position:
        return 0, position  # still in the first epoch: no need to count it all
      self.epoch_size = n
    if self.epoch_size == 0:
      raise DataConfigError(self._empty_message())
    if not self.repeat and position >= self.epoch_size:
      return 1, 0
    return divmod(position, self.epoch_size)

  def _end_epoch(self, epoch: int, n: int) -> bool:
    """Records that `epoch` ended after n examples; whether another epoch follows."""
    if n == 0:
      raise DataConfigError(self._empty_message())
    self.epoch_size = n
    self._finished = (epoch, n)
    return self.repeat and (self.last_epoch is None or epoch < self.last_epoch)

  def resume_cursor(self) -> tuple[int, int]:
    """The cursor, moved past an epoch that is known to be finished (so resuming skips nothing)."""
    epoch, offset = self.cursor
    if self._finished == (epoch, offset) and self.repeat:
      return epoch + 1, 0
    return epoch, offset

  def count(self) -> int:
    """Examples in one epoch of this reader's shard."""
    if self.epoch_size is None:
      self.epoch_size = self._count(limit=None)
    return self.epoch_size

  def _count(self, limit: int | None) -> int:
    raise NotImplementedError

  def start(self, cursor: tuple[int, int]) -> None:
    raise NotImplementedError

  def take(self, n: int) -> dict[str, np.ndarray]:
    raise NotImplementedError

  def close(self) -> None:
    pass

  def describe(self) -> dict[str, Any]:
    return {"path": self.kind}


class NumpyStream(TaskStream):
  """Epochs of an ExampleSource task's shuffled shard, tokenised in blocks in NumPy."""

  kind = "numpy"

  def __init__(self, task: seqio.Task, *, layout: convert.BatchLayout, shuffle_buffer_size: int,
               stats: RowStats, **kwargs):
    super().__init__(task, **kwargs)
    self.stats = stats
    self.shuffle_buffer_size = shuffle_buffer_size
    self.encoder = convert.TextEncoder(task, layout)
    self.reader = task.source.open(self.split)  # missing files and unset config fail here
    if isinstance(self.reader, sources_lib.MemorySplit):
      self.epoch_size = self.reader.count(shard_index=self.reader_id, num_shards=self.num_readers)
    first = next(iter(self.reader.iter_examples(shard_index=self.reader_id, num_shards=self.num_readers,
                                                stats=self.stats)), None)
    if first is None:
      raise DataConfigError(self._empty_message(f" ({self.reader.description}); rows skipped: "
                                                f"{self.stats.rows_skipped} {self.stats.first_skipped}"))
    self._rows: Iterator[dict[str, str]] = iter(())

  def _count(self, limit):
    return self.reader.count(shard_index=self.reader_id, num_shards=self.num_readers, stats=self.stats, limit=limit)

  def _epoch_rows(self, epoch: int) -> Iterator[dict[str, str]]:
    if not self.shuffle:
      return self.reader.iter_examples(shard_index=self.reader_id, num_shards=self.num_readers, stats=self.stats)
    rng = np.random.default_rng([self.seed, task_key(self.task.name), epoch])
    rows = self.reader.iter_examples(shard_index=self.reader_id, num_shards=self.num_readers,
                                     file_order_seed=int(rng.integers(0, 2**31 - 1)), stats=self.stats)
    return shuffle_buffer(rows, self.shuffle_buffer_size, rng)

  def start(self, cursor):
    self.cursor = tuple(cursor)
    self._rows = self._iter_rows(*cursor)

  def _iter_rows(self, epoch: int, offset: int) -> Iterator[dict[str, str]]:
    if not self.repeat and epoch > 0:
      return
    while True:
      n = 0
      for ex in self._epoch_rows(epoch):
        n += 1
        if n > offset:  # resuming skips here, before any tokenisation
          self.cursor = (epoch, n)
          yield ex
      if not self._end_epoch(epoch, n):
        return
      epoch, offset = epoch + 1, 0

  def resume_cursor(self):
    epoch, offset = super().resume_cursor()
    if self.epoch_size and offset >= self.epoch_size and self.repeat:  # every epoch has the same rows
      return epoch + 1, 0
    return epoch, offset

  def take(self, n):
    rows = list(itertools.islice(self._rows, n))
    return self.encoder(rows) if rows else self.encoder.layout.zeros(0)

  def describe(self):
    return {"path": self.kind, "read": self.stats.as_dict(), "build": dict(self.reader.build_stats)}


class SeqioStream(TaskStream):
  """Epochs of any seqio Task through seqio.get_dataset and the dual-encoder feature converter."""

  kind = "seqio"

  def __init__(self, task: seqio.Task, *, layout: convert.BatchLayout, **kwargs):
    super().__init__(task, **kwargs)
    self.layout = layout
    self.converter = feature_converters.DualEncoderFeatureConverter(layout=layout)
    self.shard_info = seqio.ShardInfo(self.reader_id, self.num_readers) if self.num_readers > 1 else None
    self._pending = self._dataset(0)  # configuration errors (missing files, bad features) surface here
    self._chunks: Iterator[tuple[int, int, dict[str, np.ndarray]]] = iter(())
    self._buffer: tuple[int, int, dict[str, np.ndarray]] | None = None

  def _dataset(self, epoch: int):
    return seqio.get_dataset(self.task, task_feature_lengths=self.layout.task_feature_lengths,
                             feature_converter=self.converter, dataset_split=self.split, shuffle=self.shuffle,
                             num_epochs=1, shard_info=self.shard_info, seed=epoch_seed(self.seed, self.task.name, epoch),
                             use_cached=False, verbose=False)

  def _count(self, limit):
    ds = self._dataset(0)
    if limit is not None:
      ds = ds.take(limit + 1)
    return int(ds.reduce(np.int64(0), lambda n, _: n + 1).numpy())

  def start(self, cursor):
    self.cursor = tuple(cursor)
    self._buffer = None
    self._chunks = self._iter_chunks(*cursor)

  def _iter_chunks(self, epoch: int, offset: int) -> Iterator[tuple[int, int, dict[str, np.ndarray]]]:
    """(epoch, offset of the chunk's first example, chunk) from the cursor on."""
    if not self.repeat and epoch > 0:
      return
    while True:
      ds = self._pending if (self._pending is not None and epoch == 0) else self._dataset(epoch)
      self._pending = None
      if offset:
        ds = ds.skip(offset)  # inside tf.data: no Python per skipped example
      n = offset
      for chunk in ds.batch(SEQIO_CHUNK).prefetch(2).as_numpy_iterator():
        size = len(next(iter(chunk.values())))
        yield epoch, n, chunk
        n += size
      if not self._end_epoch(epoch, n):
        return
      epoch, offset = epoch + 1, 0

  def take(self, n):
    parts = []
    while n > 0:
      if self._buffer is None:
        item = next(self._chunks, None)
        if item is None:
          break
        self._buffer = item
      epoch, start, chunk = self._buffer
      size = len(next(iter(chunk.values())))
      k = min(n, size)
      parts.append({key: v[:k] for key, v in chunk.items()})
      self.cursor = (epoch, start + k)
      self._buffer = (epoch, start + k, {key: v[k:] for key, v in chunk.items()}) if k < size else None
      n -= k
    if not parts:
      return self.layout.zeros(0)
    return {f.model_key: np.concatenate([p[f.model_key] for p in parts]).astype(f.dtype, copy=False)
            for f in self.layout.features}

  def close(self):
    self._chunks = iter(())
    self._buffer = None
    self._pending = None


def make_stream(task: seqio.Task, *, layout: convert.BatchLayout, numpy_path: bool, shuffle_buffer_size: int,
                stats: RowStats, **kwargs) -> TaskStream:
  """The NumPy stream where it applies and is wanted, else seqio's pipeline."""
  if numpy_path and uses_numpy_path(task, layout):
    return NumpyStream(task, layout=layout, shuffle_buffer_size=shuffle_buffer_size, stats=stats, **kwargs)
  return SeqioStream(task, layout=layout, **kwargs)


def get_provider(name: str) -> seqio.DatasetProviderBase:
  """A registered task or mixture (importing st5_jax.data.tasks registers the st5_* ones; an
  objective's own tasks are registered by its module, which the trainer imports)."""
  # Registered on first use, not when this module is imported (the contract of st5_jax.data).
  from st5_jax.data import tasks as _  # noqa: F401  pylint: disable=g-import-not-at-top
  try:
    return seqio.get_mixture_or_task(name)
  except ValueError as e:
    known = sorted(n for n in itertools.chain(seqio.TaskRegistry.names(), seqio.MixtureRegistry.names())
                   if n.startswith("st5_"))
    raise DataConfigError(f"Unknown task or mixture {name!r}; registered st5 names: {known}. Tasks of your own "
                          "are registered by importing their module, e.g. `import my_tasks` at the top of the "
                          "gin file (on PYTHONPATH).") from e
