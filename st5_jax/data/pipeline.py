"""From seqio tasks to global jax.Arrays on the mesh: sharded, deterministic, resumable.

Each process reads only its shard of every task (files, or records when there are
fewer files than readers), tokenises it exactly as the task's seqio preprocessors
and the dual-encoder feature converter do, and contributes its per-process rows to
one global `jax.Array` per feature, sharded over the mesh's data axes.

Order is a pure function of (seed, task, epoch, position): every epoch of a task is
its shard's rows shuffled by a NumPy generator seeded with (seed, task, epoch), and a
mixture interleaves tasks by a deterministic schedule proportional to their rates.
The iterator state is therefore a handful of integers (examples consumed per task),
identical on every process, and restoring it re-derives each process's epoch and
offset and skips there before tokenisation. See docs/data.md for the trade-offs.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import queue
import threading
import weakref
import zlib
from typing import Any, Iterator, Mapping, Sequence

import gin
import jax
import numpy as np
import seqio

from st5_jax.data import feature_converters
from st5_jax.data import sources as sources_lib
from st5_jax.data.rows import RowStats
from st5_jax.features import LEFT

STATE_VERSION = 1
DEFAULT_SHUFFLE_BUFFER = 1 << 17
DEFAULT_DEDUP_WINDOW = 4


class DataConfigError(ValueError):
  """Inconsistent batch size, mesh, task or iterator state; raised before any compilation."""


# ----------------------------------------------------------------------------
# Batch geometry.


def num_data_shards(mesh: jax.sharding.Mesh, data_axes: Sequence[str]) -> int:
  missing = [a for a in data_axes if a not in mesh.shape]
  if missing:
    raise DataConfigError(f"data_axes {tuple(data_axes)} name axes {missing} that the mesh lacks; "
                          f"mesh axes are {dict(mesh.shape)}.")
  return math.prod(mesh.shape[a] for a in data_axes)


def check_global_batch_size(global_batch_size: int, *, mesh: jax.sharding.Mesh, data_axes: Sequence[str],
                            process_count: int | None = None) -> None:
  """Raises DataConfigError unless the batch splits evenly over data shards and processes."""
  process_count = jax.process_count() if process_count is None else process_count
  shards = num_data_shards(mesh, data_axes)
  if global_batch_size <= 0:
    raise DataConfigError(f"global_batch_size must be positive, got {global_batch_size}.")
  if global_batch_size % shards:
    lo = global_batch_size - global_batch_size % shards
    raise DataConfigError(
        f"global_batch_size={global_batch_size} is not divisible by the number of data shards {shards} "
        f"(mesh axes {tuple(data_axes)} of sizes {[mesh.shape[a] for a in data_axes]}); "
        f"use a multiple of {shards}, e.g. {lo or shards} or {lo + shards}.")
  if global_batch_size % process_count:
    raise DataConfigError(f"global_batch_size={global_batch_size} is not divisible by the number of "
                          f"processes {process_count}; each process feeds an equal slice.")


@dataclasses.dataclass(frozen=True)
class ReaderAssignment:
  """Which shard of the data this process reads and how many rows it feeds per batch."""
  reader_id: int
  num_readers: int
  local_batch_size: int


def reader_assignment(*, mesh: jax.sharding.Mesh, data_axes: Sequence[str], global_batch_size: int,
                      process_index: int | None = None) -> ReaderAssignment:
  """Derives this process's shard from the batch rows its devices hold.

  Processes holding the same rows (data replicated across processes) read the same
  shard; in the plain data-parallel case reader_id == process_index.
  """
  process_index = jax.process_index() if process_index is None else process_index
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(tuple(data_axes)))
  rows_of: dict[int, list[tuple[int, int]]] = {}
  for device, index in sharding.devices_indices_map((global_batch_size,)).items():
    s = index[0]
    rows_of.setdefault(device.process_index, []).append(
        (s.start or 0, global_batch_size if s.stop is None else s.stop))
  return assign_readers(rows_of, process_index, mesh_shape=dict(mesh.shape))


def assign_readers(rows_of: Mapping[int, Sequence[tuple[int, int]]], process_index: int, *,
                   mesh_shape: Mapping[str, int] | None = None) -> ReaderAssignment:
  """Reader ids from the batch rows [start, stop) that each process's devices hold."""
  ranges = {}
  for p, spans in rows_of.items():
    spans = sorted(set(spans))
    merged = [list(spans[0])]
    for a, b in spans[1:]:
      if a <= merged[-1][1]:
        merged[-1][1] = max(merged[-1][1], b)
      else:
        merged.append([a, b])
    if len(merged) != 1:
      raise DataConfigError(
          f"Process {p} holds non-contiguous batch rows {merged} on mesh {mesh_shape}; order the mesh's "
          "devices so that each process's devices are adjacent along the data axes "
          "(jax.experimental.mesh_utils.create_device_mesh does this).")
    ranges[p] = tuple(merged[0])
  distinct = sorted(set(ranges.values()))
  sizes = {b - a for a, b in distinct}
  if len(sizes) != 1 or any(x[1] > y[0] for x, y in zip(distinct, distinct[1:])):
    raise DataConfigError(f"Processes hold overlapping or unequal batch slices {distinct} on mesh {mesh_shape}.")
  mine = ranges[process_index]
  return ReaderAssignment(reader_id=distinct.index(mine), num_readers=len(distinct),
                          local_batch_size=mine[1] - mine[0])


# ----------------------------------------------------------------------------
# One task's stream of padded token rows for one reader.


def _task_key(name: str) -> int:
  return zlib.crc32(name.encode("utf-8"))


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


def _is_tokenize(fn) -> bool:
  fn = getattr(fn, "func", fn)
  return fn is seqio.preprocessors.tokenize


class _Encoder:
  """The task's preprocessors and the feature converter, on a list of text examples.

  Equals seqio's `tokenize` + `append_eos_after_trim` + DualEncoderFeatureConverter
  (tested against them) but runs SentencePiece directly from Python: tf.data
  pipelines fed by Python generators can deadlock when an iterator is destroyed
  while its generator runs (the destroying thread holds the GIL the generator needs).
  """

  def __init__(self, task: seqio.Task, feature_lengths: Mapping[str, int]):
    steps = list(task.preprocessors)
    if not (len(steps) == 2 and _is_tokenize(steps[0]) and steps[1] is seqio.preprocessors.append_eos_after_trim):
      raise DataConfigError(
          f"Task {task.name} has preprocessors {steps}; the training pipeline supports tasks whose preprocessors "
          "are seqio's tokenize + append_eos_after_trim (register text changes in the source, e.g. with "
          "st5_jax.data.registry).")
    self.features = []
    for name, length in feature_lengths.items():
      feature = task.output_features[name]
      vocab = feature.vocabulary
      self.features.append((name, feature_converters.MODEL_FEATURE_NAMES[name], int(length), vocab.tokenizer,
                            vocab.eos_id if feature.add_eos else None))

  def __call__(self, examples: Sequence[Mapping[str, str]]) -> dict[str, np.ndarray]:
    out = {}
    n = len(examples)
    for name, model_name, length, processor, eos in self.features:
      keep = length - 1 if eos is not None else length
      ids = [row[:keep] for row in processor.encode([ex[name] for ex in examples], out_type=int)]
      lengths_B = np.fromiter(map(len, ids), np.int64, count=n)
      flat = np.fromiter(itertools.chain.from_iterable(ids), np.int32, count=int(lengths_B.sum()))
      starts_B = np.cumsum(lengths_B) - lengths_B
      rows = np.repeat(np.arange(n), lengths_B)
      cols = np.arange(flat.size) - np.repeat(starts_B, lengths_B)
      tokens_BxL = np.zeros((n, length), np.int32)
      tokens_BxL[rows, cols] = flat
      if eos is not None:
        tokens_BxL[np.arange(n), lengths_B] = eos
      out[model_name] = tokens_BxL
    return out


class _TaskStream:
  """Epochs of one task's shuffled shard for one reader, as text examples."""

  def __init__(self, task: seqio.Task, *, split: str, reader_id: int, num_readers: int, seed: int, shuffle: bool,
               repeat: bool, shuffle_buffer_size: int, start: int, epoch_size: int | None, stats: RowStats):
    self.task = task
    source = task.source
    if not isinstance(source, sources_lib.ExampleSource):
      raise DataConfigError(f"Task {task.name} uses {type(source).__name__}; the training pipeline needs an "
                            "st5_jax ExampleSource (register the task with st5_jax.data.registry).")
    self.split = split
    self.reader_id, self.num_readers = reader_id, num_readers
    self.seed, self.shuffle, self.repeat = seed, shuffle, repeat
    self.shuffle_buffer_size = shuffle_buffer_size
    self.stats = stats
    self.reader = source.open(split)  # missing files and unset config fail here
    self.epoch_size = epoch_size
    if self.epoch_size is None and isinstance(self.reader, sources_lib.MemorySplit):
      self.epoch_size = self.reader.count(shard_index=reader_id, num_shards=num_readers)
    self._preflight()
    self.start_epoch, self._start_offset = self._locate(start)
    self._rows = self._iter_rows()

  def _preflight(self) -> None:
    first = next(iter(self.reader.iter_examples(shard_index=self.reader_id, num_shards=self.num_readers,
                                                stats=self.stats)), None)
    if first is None:
      raise DataConfigError(self._empty_message())

  def _empty_message(self) -> str:
    return (f"Task {self.task.name} split {self.split!r} has no usable examples in shard {self.reader_id} of "
            f"{self.num_readers} ({self.reader.description}); rows skipped: {self.stats.rows_skipped} "
            f"{self.stats.first_skipped}.")

  def count(self) -> int:
    if self.epoch_size is None:
      self.epoch_size = self.reader.count(shard_index=self.reader_id, num_shards=self.num_readers, stats=self.stats)
    return self.epoch_size

  def _locate(self, position: int) -> tuple[int, int]:
    """(epoch, offset) of the `position`-th example of this reader's stream."""
    if position == 0:
      return 0, 0
    if self.epoch_size is None:
      n = self.reader.count(shard_index=self.reader_id, num_shards=self.num_readers, stats=self.stats,
                            limit=position)
      if n > position:
        return 0, position  # still in the first epoch: no need to count it all
      self.epoch_size = n
    if self.epoch_size == 0:
      raise DataConfigError(self._empty_message())
    if not self.repeat and position >= self.epoch_size:
      return 1, 0
    return divmod(position, self.epoch_size)

  def _epoch_rows(self, epoch: int) -> Iterator[dict[str, str]]:
    if not self.shuffle:
      return self.reader.iter_examples(shard_index=self.reader_id, num_shards=self.num_readers, stats=self.stats)
    rng = np.random.default_rng([self.seed, _task_key(self.task.name), epoch])
    rows = self.reader.iter_examples(shard_index=self.reader_id, num_shards=self.num_readers,
                                     file_order_seed=int(rng.integers(0, 2**31 - 1)), stats=self.stats)
    return shuffle_buffer(rows, self.shuffle_buffer_size, rng)

  def _iter_rows(self) -> Iterator[dict[str, str]]:
    epoch, offset = self.start_epoch, self._start_offset
    if not self.repeat and epoch > 0:
      return
    while True:
      n = 0
      for ex in self._epoch_rows(epoch):
        n += 1
        if n > offset:  # resuming skips here, before any tokenisation
          yield ex
      if n == 0:
        raise DataConfigError(self._empty_message())
      self.epoch_size = n
      if not self.repeat:
        return
      epoch, offset = epoch + 1, 0

  def take(self, n: int) -> list[dict[str, str]]:
    return list(itertools.islice(self._rows, n))


@dataclasses.dataclass
class _Block:
  """Batches made together (one dedup window) and the position before them."""
  start_step: int
  start_positions: np.ndarray
  end_positions: np.ndarray
  batches: list


_END = object()


class _Producer:
  """Runs a block generator in a daemon thread, `depth` blocks ahead; depth 0 runs it inline."""

  def __init__(self, blocks: Iterator[_Block], depth: int):
    self._blocks = blocks
    self._depth = depth
    self._queue: queue.Queue = queue.Queue(maxsize=max(depth, 1))
    self._stop = threading.Event()
    self._done = False
    self._thread = None
    if depth > 0:
      self._thread = threading.Thread(target=self._run, name="st5-data-producer", daemon=True)
      self._thread.start()

  def _run(self) -> None:
    try:
      for block in self._blocks:
        if not self._put(block):
          return
      self._put(_END)
    except Exception as e:  # pylint: disable=broad-except  # re-raised in the consumer
      self._put(e)

  def _put(self, item) -> bool:
    while not self._stop.is_set():
      try:
        self._queue.put(item, timeout=0.1)
        return True
      except queue.Full:
        continue
    return False

  def get(self) -> _Block:
    if self._done:
      raise StopIteration
    if self._thread is None:
      item = next(self._blocks, _END)
    else:
      item = self._queue.get()
    if item is _END:
      self._done = True
      raise StopIteration
    if isinstance(item, Exception):
      self._done = True
      raise item
    return item

  def close(self) -> None:
    self._stop.set()
    if self._thread is not None:
      while self._thread.is_alive():
        try:
          self._queue.get(timeout=0.05)
        except queue.Empty:
          pass
      self._thread.join()


# ----------------------------------------------------------------------------
# Mixing and de-duplication.


def schedule(positions: np.ndarray, rates: np.ndarray, n: int, limits: np.ndarray | None = None) -> np.ndarray:
  """Task ids of the next n examples of a mixture.

  Item j of task t is due at time (j + 0.5) / rate_t; examples are taken in order of
  due time (ties to the lower task id). The order depends only on `positions`, so a
  restored iterator continues the exact sequence, and each task's share of any
  window is within one example of its rate.
  """
  ids, times = [], []
  for t, (pos, rate) in enumerate(zip(positions, rates)):
    avail = n if limits is None else max(0, min(n, int(limits[t] - pos)))
    if avail == 0 or rate <= 0:
      continue
    j = np.arange(avail, dtype=np.float64)
    times.append((pos + j + 0.5) / rate)
    ids.append(np.full(avail, t, np.int64))
  if not ids:
    return np.zeros(0, np.int64)
  times_all, ids_all = np.concatenate(times), np.concatenate(ids)
  order = np.lexsort((ids_all, times_all))[:n]
  return ids_all[order]


_HASH_MULTIPLIERS = np.random.default_rng(20240611).integers(1, 2**63, 4096, dtype=np.uint64) | np.uint64(1)


def _row_hashes(tokens_BxL: np.ndarray) -> list[int]:
  """64-bit hash of each row's tokens; padding (0) adds nothing, so lengths do not matter.

  A collision (odds ~2^-64 per pair) would only move a row to another batch.
  """
  length = tokens_BxL.shape[1]
  if length > len(_HASH_MULTIPLIERS):
    raise ValueError(f"dedup supports sequences up to {len(_HASH_MULTIPLIERS)} tokens, got {length}")
  with np.errstate(over="ignore"):
    return (tokens_BxL.astype(np.uint64) * _HASH_MULTIPLIERS[:length]).sum(axis=1, dtype=np.uint64).tolist()


def _swap_into(i, keys, batches, left_keys, right_keys, open_batches) -> bool:
  """Places row i in a full batch k by moving one of k's rows to an open batch; False if none fits."""
  lk, rk = keys[i]
  # A text already in every batch cannot be placed cleanly anywhere: do not search.
  if all(lk in keys_j for keys_j in left_keys) or any(all(k in keys_j for keys_j in right_keys) for k in rk):
    return False
  for j in open_batches:
    for k, batch in enumerate(batches):
      if k == j:
        continue
      for pos, r in enumerate(batch):
        lr, rr = keys[r]
        if lr in left_keys[j] or rr & right_keys[j]:
          continue  # r would clash in j
        if (lk in left_keys[k] and lk != lr) or rk & (right_keys[k] - rr):
          continue  # i would clash in k even without r
        batch[pos] = i
        left_keys[k].discard(lr)
        right_keys[k] -= rr
        left_keys[k].add(lk)
        right_keys[k] |= rk
        batches[j].append(r)
        left_keys[j].add(lr)
        right_keys[j] |= rr
        return True
  return False


def dedup_assign(left_BxL: np.ndarray, rights: Sequence[np.ndarray], *, batch_size: int,
                 num_batches: int) -> tuple[list[np.ndarray], int, int]:
  """Splits rows into batches with no repeated left text and no repeated right text per batch.

  Greedy in stream order: each row goes to the earliest batch with room and no clash;
  a row that clashes everywhere swaps with a row of a full batch when that resolves
  both, else goes to the first batch with room and is counted as unresolved.
  Returns (row indices per batch, rows moved, rows unresolved).
  """
  batches = [[] for _ in range(num_batches)]
  left_keys = [set() for _ in range(num_batches)]
  right_keys = [set() for _ in range(num_batches)]
  right_hashes = [_row_hashes(r) for r in rights]
  keys = [(lk, set(rk)) for lk, *rk in zip(_row_hashes(left_BxL), *right_hashes)]
  first_open = 0
  deferred = []
  for i, (lk, rk) in enumerate(keys):
    while first_open < num_batches and len(batches[first_open]) == batch_size:
      first_open += 1
    for j in range(first_open, num_batches):
      if len(batches[j]) < batch_size and lk not in left_keys[j] and not (rk & right_keys[j]):
        batches[j].append(i)
        left_keys[j].add(lk)
        right_keys[j].update(rk)
        break
    else:
      deferred.append(i)
  unresolved = 0
  for i in deferred:
    lk, rk = keys[i]
    open_batches = [j for j in range(num_batches) if len(batches[j]) < batch_size]
    clean = [j for j in open_batches if lk not in left_keys[j] and not (rk & right_keys[j])]
    if clean:
      j = clean[0]
    elif _swap_into(i, keys, batches, left_keys, right_keys, open_batches):
      continue
    else:
      j = open_batches[0]
      unresolved += 1
    batches[j].append(i)
    left_keys[j].add(lk)
    right_keys[j].update(rk)
  moved = sum(1 for j, b in enumerate(batches) for i in b if i // batch_size != j)
  return [np.asarray(b, np.int64) for b in batches], moved, unresolved


# ----------------------------------------------------------------------------


@dataclasses.dataclass
class _BlockMaker:
  """Makes blocks of batches from task streams; owned by the producer thread.

  Holds no reference to the BatchIterator, so a dropped iterator can be collected
  and its producer stopped.
  """
  streams: list
  encoders: list
  rates: np.ndarray
  batch_size: int
  window: int
  dedup: bool
  limits: np.ndarray | None = None
  num_batches: int | None = None
  dedup_moved: int = 0
  dedup_unresolved: int = 0

  def blocks(self, step: int, positions: np.ndarray) -> Iterator[_Block]:
    """Blocks of `window` batches from (step, positions) on."""
    b = self.batch_size
    while True:
      num = self.window
      if self.num_batches is not None:
        num = min(num, self.num_batches - step)
        if num <= 0:
          return
      ids = schedule(positions, self.rates, num * b, self.limits)
      n = len(ids) // b
      if n == 0:
        return
      encoded = []
      for t, stream in enumerate(self.streams):
        where = np.flatnonzero(ids == t)
        if not len(where):
          continue
        got = stream.take(len(where))
        if len(got) < len(where):
          raise DataConfigError(f"Task {stream.task.name} ran out of examples ({len(got)} of {len(where)}) "
                                "although its count said otherwise; did its files change during the run?")
        encoded.append((where, self.encoders[t](got)))
      rows = {k: np.zeros((len(ids), v.shape[1]), np.int32) for k, v in encoded[0][1].items()}
      for where, arrays in encoded:
        for k, v in arrays.items():
          rows[k][where] = v  # back into schedule order
      end = positions + np.bincount(ids, minlength=len(self.streams))
      if self.dedup:
        rights = [rows[k] for k in ("right_encoder_input_tokens", "right_negative_encoder_input_tokens") if k in rows]
        index_lists, moved, unresolved = dedup_assign(rows[LEFT], rights, batch_size=b,
                                                      num_batches=n)
        self.dedup_moved += moved
        self.dedup_unresolved += unresolved
      else:
        index_lists = [np.arange(j * b, (j + 1) * b) for j in range(n)]
      batches = [{k: np.ascontiguousarray(v[idx]) for k, v in rows.items()} for idx in index_lists]
      yield _Block(step, positions.copy(), end.copy(), batches)
      step += n
      positions = end


class BatchIterator:
  """Yields dicts of int32 batches: global jax.Arrays on a mesh, or NumPy arrays without one.

  `get_state()`/`set_state()` save and restore the position exactly; `stats` reports
  rows read and skipped per task. Batches are made `prefetch` dedup windows ahead in
  a background thread.
  """

  def __init__(self, *, provider: seqio.DatasetProviderBase, split: str, feature_lengths: Mapping[str, int],
               global_batch_size: int, local_batch_size: int, reader_id: int, num_readers: int,
               mesh: jax.sharding.Mesh | None, data_axes: Sequence[str], seed: int, shuffle: bool, dedup: bool,
               repeat: bool, dedup_window: int, shuffle_buffer_size: int, prefetch: int = 2):
    self.name = provider.name
    self.tasks: list[seqio.Task] = list(provider.tasks) if isinstance(provider, seqio.Mixture) else [provider]
    if not self.tasks:
      raise DataConfigError(f"Mixture {self.name} has no tasks.")
    self.rates = np.asarray([float(provider.get_rate(t)) if isinstance(provider, seqio.Mixture) else 1.0
                             for t in self.tasks], np.float64)
    if not np.all(np.isfinite(self.rates)) or np.any(self.rates < 0) or self.rates.sum() <= 0:
      raise DataConfigError(f"Mixture {self.name} has invalid rates {self.rates.tolist()}.")
    negatives = {("negative_targets" in t.output_features) for t in self.tasks}
    if len(negatives) != 1:
      raise DataConfigError(f"Mixture {self.name} mixes tasks with and without negative_targets.")
    self.negatives = negatives.pop()
    self.split = split
    self.feature_lengths = feature_converters.complete_feature_lengths(feature_lengths, negatives=self.negatives)
    converter = feature_converters.DualEncoderFeatureConverter(negatives=self.negatives)
    self.model_feature_lengths = dict(converter.get_model_feature_lengths(self.feature_lengths))
    self._encoders = [_Encoder(t, self.feature_lengths) for t in self.tasks]
    self.global_batch_size = global_batch_size
    self.local_batch_size = local_batch_size
    self.reader_id, self.num_readers = reader_id, num_readers
    self.mesh, self.data_axes = mesh, tuple(data_axes)
    self.seed, self.shuffle, self.dedup, self.repeat = int(seed), bool(shuffle), bool(dedup), bool(repeat)
    self.window = max(1, int(dedup_window)) if dedup else 1
    self.shuffle_buffer_size = int(shuffle_buffer_size)
    self.prefetch = int(prefetch)
    self._task_stats = {t.name: RowStats() for t in self.tasks}
    self._lock = threading.Lock()
    self._producer: _Producer | None = None
    self._maker: _BlockMaker | None = None
    if mesh is not None:
      self._sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(self.data_axes, None))
    self._epoch_sizes: dict[str, dict[str, int]] = {}
    self._start(step=0, block_start_step=0, positions=np.zeros(len(self.tasks), np.int64))

  # --- construction and restore -------------------------------------------------

  def close(self) -> None:
    """Stops the background producer (also done when the iterator is collected or at exit)."""
    if self._producer is not None:
      self._finalizer.detach()
      self._producer.close()
      self._producer = None

  def _start(self, *, step: int, block_start_step: int, positions: np.ndarray) -> None:
    self.close()
    streams = []
    for t, task in enumerate(self.tasks):
      hint = self._epoch_sizes.get(task.name, {}).get(str(self.reader_id))
      streams.append(_TaskStream(
          task, split=self.split, reader_id=self.reader_id, num_readers=self.num_readers, seed=self.seed,
          shuffle=self.shuffle, repeat=self.repeat, shuffle_buffer_size=self.shuffle_buffer_size,
          start=int(positions[t]), epoch_size=hint, stats=self._task_stats[task.name]))
    self._streams = streams
    moved, unresolved = (self._maker.dedup_moved, self._maker.dedup_unresolved) if self._maker else (0, 0)
    self._maker = _BlockMaker(streams=streams, encoders=self._encoders, rates=self.rates,
                              batch_size=self.local_batch_size, window=self.window, dedup=self.dedup,
                              dedup_moved=moved, dedup_unresolved=unresolved)
    if not self.repeat:
      self._maker.limits = np.asarray([s.count() for s in streams], np.int64)
      self._maker.num_batches = self._agree_num_batches(int(self._maker.limits.sum()) // self.local_batch_size)
    self._step = block_start_step
    self._block: _Block | None = None
    self._block_index = 0
    self._positions = positions.astype(np.int64).copy()
    self._producer = _Producer(self._maker.blocks(block_start_step, self._positions.copy()), self.prefetch)
    self._finalizer = weakref.finalize(self, _Producer.close, self._producer)
    while self._step < step:  # replay inside the current dedup window
      self._next_local()

  def _agree_num_batches(self, local: int) -> int:
    # Every process must stop at the same step or the collective of the last step hangs.
    if jax.process_count() == 1 or self.mesh is None:
      return local
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    return int(np.min(multihost_utils.process_allgather(np.asarray([local]))))

  # --- iteration --------------------------------------------------------------

  def __iter__(self) -> "BatchIterator":
    return self

  def __next__(self) -> dict[str, Any]:
    with self._lock:
      batch = self._next_local()
    for name, stats in self._task_stats.items():
      stats.log_new(f"task {name}: ")
    if self.mesh is None:
      return batch
    return {k: jax.make_array_from_process_local_data(self._sharding, v, (self.global_batch_size, v.shape[1]))
            for k, v in batch.items()}

  def _next_local(self) -> dict[str, np.ndarray]:
    if self._block is None or self._block_index == len(self._block.batches):
      self._block = self._producer.get()
      self._block_index = 0
      self._positions = self._block.start_positions.copy()
    batch = self._block.batches[self._block_index]
    self._block_index += 1
    self._step += 1
    if self._block_index == len(self._block.batches):
      self._positions = self._block.end_positions.copy()
    return batch

  # --- state ------------------------------------------------------------------

  def _epoch_size_hints(self) -> dict[str, dict[str, int]]:
    hints = {k: dict(v) for k, v in self._epoch_sizes.items()}
    for stream in self._streams:
      if stream.epoch_size is not None:
        hints.setdefault(stream.task.name, {})[str(self.reader_id)] = int(stream.epoch_size)
    return hints

  def _config(self) -> dict[str, Any]:
    return {
        "task": self.name, "split": self.split, "seed": self.seed, "shuffle": self.shuffle, "dedup": self.dedup,
        "dedup_window": self.window, "repeat": self.repeat, "global_batch_size": self.global_batch_size,
        "num_readers": self.num_readers, "feature_lengths": dict(self.feature_lengths),
        "tasks": [t.name for t in self.tasks], "shuffle_buffer_size": self.shuffle_buffer_size,
    }

  def get_state(self) -> dict[str, Any]:
    """JSON-serialisable position; the same on every process (plus per-reader size hints)."""
    with self._lock:
      block = self._block
      if block is not None and self._block_index < len(block.batches):
        step0, positions = block.start_step, block.start_positions  # restore replays the window
      else:
        step0, positions = self._step, self._positions
      state = {"version": STATE_VERSION, **self._config(), "step": self._step, "block_start_step": int(step0),
               "positions": {t.name: int(p) for t, p in zip(self.tasks, positions)},
               "epoch_sizes": self._epoch_size_hints()}
    json.dumps(state)  # fail here, not in the checkpointer
    return state

  def set_state(self, state: Mapping[str, Any]) -> None:
    """Continues exactly where the iterator that produced `state` was."""
    if state.get("version") != STATE_VERSION:
      raise DataConfigError(f"Iterator state version {state.get('version')} is not {STATE_VERSION}.")
    mine = self._config()
    diffs = {k: (state.get(k), v) for k, v in mine.items() if state.get(k) != v}
    if diffs:
      detail = "; ".join(f"{k}: saved {a!r}, now {b!r}" for k, (a, b) in diffs.items())
      raise DataConfigError(f"Iterator state does not match this iterator ({detail}). Resume with the same "
                            "task, split, seed, batch size, feature lengths and number of data readers.")
    positions = np.asarray([int(state["positions"][t.name]) for t in self.tasks], np.int64)
    with self._lock:
      self._epoch_sizes = {k: dict(v) for k, v in state.get("epoch_sizes", {}).items()}
      self._start(step=int(state["step"]), block_start_step=int(state["block_start_step"]), positions=positions)

  # --- reporting --------------------------------------------------------------

  @property
  def step(self) -> int:
    return self._step

  @property
  def shard_info(self) -> seqio.ShardInfo:
    """The shard this process reads, as seqio names it."""
    return seqio.ShardInfo(index=self.reader_id, num_shards=self.num_readers)

  @property
  def stats(self) -> dict[str, Any]:
    """Rows read/skipped/filtered per task (at read time and when its examples were built),
    epochs, examples consumed and dedup counts."""
    per_task = {}
    read_total = RowStats(max_reported=10)
    build_skipped = 0
    build_reasons: dict[str, int] = {}
    build_first: list[str] = []
    build_rows = 0
    for t, (task, stream) in enumerate(zip(self.tasks, self._streams)):
      read = self._task_stats[task.name]
      build = dict(stream.reader.build_stats)
      consumed = int(self._positions[t])
      epoch = consumed // stream.epoch_size if stream.epoch_size else stream.start_epoch
      per_task[task.name] = {"read": read.as_dict(), "build": build, "epoch": epoch,
                             "examples_consumed": consumed, "epoch_size": stream.epoch_size}
      read_total.merge(read)
      build_rows += build.get("rows_read", 0)
      build_skipped += build.get("rows_skipped", 0)
      for k, v in build.get("skipped_by_reason", {}).items():
        build_reasons[k] = build_reasons.get(k, 0) + v
      build_first += build.get("first_skipped", [])
    out = read_total.as_dict()
    reasons = dict(out["skipped_by_reason"])
    for k, v in build_reasons.items():
      reasons[k] = reasons.get(k, 0) + v
    out.update(rows_skipped=out["rows_skipped"] + build_skipped, skipped_by_reason=reasons,
               first_skipped=(out["first_skipped"] + build_first)[:10], build_rows_read=build_rows,
               step=self._step, tasks=per_task, dedup_moved=self._maker.dedup_moved,
               dedup_unresolved=self._maker.dedup_unresolved, reader_id=self.reader_id,
               num_readers=self.num_readers)
    return out

  @property
  def element_spec(self) -> dict[str, tuple[int, int]]:
    return {k: (self.global_batch_size, v) for k, v in self.model_feature_lengths.items()}


def import_tasks():
  """Imports the repository's `tasks` package, which registers the st5 tasks."""
  import tasks as tasks_module  # pylint: disable=g-import-not-at-top
  if getattr(tasks_module, "__file__", None) is None:
    # An editable install made before tasks/__init__.py existed maps `tasks` to a
    # namespace package outside the repo root; load the real one next to st5_jax.
    import importlib.util  # pylint: disable=g-import-not-at-top
    import pathlib  # pylint: disable=g-import-not-at-top
    import sys  # pylint: disable=g-import-not-at-top
    path = pathlib.Path(__file__).resolve().parents[2] / "tasks" / "__init__.py"
    spec = importlib.util.spec_from_file_location("tasks", path, submodule_search_locations=[str(path.parent)])
    tasks_module = importlib.util.module_from_spec(spec)
    sys.modules["tasks"] = tasks_module
    spec.loader.exec_module(tasks_module)
  return tasks_module


def _get_provider(task: str) -> seqio.DatasetProviderBase:
  import_tasks()
  try:
    return seqio.get_mixture_or_task(task)
  except ValueError as e:
    known = sorted(n for n in itertools.chain(seqio.TaskRegistry.names(), seqio.MixtureRegistry.names())
                   if n.startswith("st5_"))
    raise DataConfigError(f"Unknown task or mixture {task!r}; registered st5 names: {known}.") from e


def make_train_iterator(*, task: str, feature_lengths: Mapping[str, int], global_batch_size: int,
                        mesh: jax.sharding.Mesh, data_axes: Sequence[str] = ("data",), seed: int = 0,
                        shuffle: bool = True, dedup: bool = False, split: str = "train", repeat: bool = True,
                        dedup_window: int = DEFAULT_DEDUP_WINDOW,
                        shuffle_buffer_size: int = DEFAULT_SHUFFLE_BUFFER, prefetch: int = 2) -> BatchIterator:
  """Global batches of a registered task or mixture, sharded over `data_axes` of `mesh`.

  Args:
    task: seqio task or mixture name (importing `tasks` registers the st5 ones).
    feature_lengths: {"inputs": L_in, "targets": L_tgt[, "negative_targets": L_neg]};
      for hard-negative tasks negative_targets defaults to the targets length.
    global_batch_size: rows per step over all processes; must divide by the number of
      data shards (product of the data axes' sizes) and by the process count.
    mesh: the device mesh; the batch dimension is sharded over `data_axes` and
      replicated over the other axes.
    data_axes: mesh axis names whose product shards the batch.
    seed: shuffling seed; the same seed gives the same batches.
    shuffle: shuffle rows (per epoch) and file order.
    dedup: keep duplicate texts out of the same per-process batch (within windows of
      `dedup_window` batches).
    split: split of every task.
    repeat: cycle through epochs forever; otherwise one epoch, last partial batch dropped.
    dedup_window: batches rearranged together when dedup is on.
    shuffle_buffer_size: rows held for shuffling (a full shuffle for smaller shards).
    prefetch: dedup windows (batches when dedup is off) prepared ahead in a background
      thread; 0 prepares each one when it is asked for.

  Returns:
    A BatchIterator of {"left_encoder_input_tokens": [B, L_in], "right_encoder_input_tokens":
    [B, L_tgt][, "right_negative_encoder_input_tokens": [B, L_neg]]} int32 jax.Arrays.
  """
  data_axes = tuple(data_axes)
  check_global_batch_size(global_batch_size, mesh=mesh, data_axes=data_axes)
  provider = _get_provider(task)
  assignment = reader_assignment(mesh=mesh, data_axes=data_axes, global_batch_size=global_batch_size)
  return BatchIterator(provider=provider, split=split, feature_lengths=feature_lengths,
                       global_batch_size=global_batch_size, local_batch_size=assignment.local_batch_size,
                       reader_id=assignment.reader_id, num_readers=assignment.num_readers, mesh=mesh,
                       data_axes=data_axes, seed=seed, shuffle=shuffle, dedup=dedup, repeat=repeat,
                       dedup_window=dedup_window, shuffle_buffer_size=shuffle_buffer_size, prefetch=prefetch)


def make_local_iterator(*, task: str, feature_lengths: Mapping[str, int], batch_size: int, reader_id: int = 0,
                        num_readers: int = 1, seed: int = 0, shuffle: bool = True, dedup: bool = False,
                        split: str = "train", repeat: bool = True, dedup_window: int = DEFAULT_DEDUP_WINDOW,
                        shuffle_buffer_size: int = DEFAULT_SHUFFLE_BUFFER, prefetch: int = 2) -> BatchIterator:
  """NumPy batches of one reader's shard: what one process contributes (benchmarks, tests, debugging)."""
  if batch_size <= 0:
    raise DataConfigError(f"batch_size must be positive, got {batch_size}.")
  if not 0 <= reader_id < num_readers:
    raise DataConfigError(f"reader_id {reader_id} is not in [0, {num_readers}).")
  provider = _get_provider(task)
  return BatchIterator(provider=provider, split=split, feature_lengths=feature_lengths,
                       global_batch_size=batch_size * num_readers, local_batch_size=batch_size,
                       reader_id=reader_id, num_readers=num_readers, mesh=None, data_axes=(), seed=seed,
                       shuffle=shuffle, dedup=dedup, repeat=repeat, dedup_window=dedup_window,
                       shuffle_buffer_size=shuffle_buffer_size, prefetch=prefetch)


@gin.configurable(module="st5_jax.data", denylist=["mesh"])
def train_input(*, mesh: jax.sharding.Mesh, task: str = gin.REQUIRED, feature_lengths: Mapping[str, int] = gin.REQUIRED,
                global_batch_size: int = gin.REQUIRED, data_axes: Sequence[str] = ("data",), seed: int = 0,
                shuffle: bool = True, dedup: bool = False, split: str = "train", repeat: bool = True) -> BatchIterator:
  """Gin entry point: `train_input.feature_lengths = %TASK_FEATURE_LENGTHS` etc."""
  return make_train_iterator(task=task, feature_lengths=dict(feature_lengths), global_batch_size=global_batch_size,
                             mesh=mesh, data_axes=tuple(data_axes), seed=seed, shuffle=shuffle, dedup=dedup,
                             split=split, repeat=repeat)
