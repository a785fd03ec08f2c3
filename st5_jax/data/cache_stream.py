"""One task's epochs read from its token cache (st5_jax.data.cache): a stream for the batch iterator.

Reader r of R owns the cache's shards r, r + R, r + 2R, ... (as batch_geometry.py's reader
split assigns readers; a cache needs at least R shards). An epoch of reader r is its
shards in an order drawn from (seed, task, epoch), each shard's records passed through
a shuffle buffer of at most `shuffle_buffer_size` records seeded by (seed, task, epoch,
shard) and flushed at the end of the shard. Memory is one shard's read buffer and the
shuffle buffer, never the dataset; records are parsed only when taken.

The cursor keeps the stream contract of streams.py, (epoch, offset into this reader's
epoch), so the iterator's state, mixing and dedup windows work unchanged; it is the
same information as (epoch, shard position in this epoch's order, record in the
shard), which `position()` gives, because shard sizes come from the manifest.
Resuming therefore skips whole shards by their counts without opening them and reads
at most one shard's records to reach the record (`resume_records_read` counts them).
"""

from __future__ import annotations

import itertools
from typing import Iterator

import numpy as np
import seqio

from st5_jax.data import cache as cache_lib
from st5_jax.data import convert, streams
from st5_jax.data.rows import RowStats


class CacheStream(streams.TaskStream):
  """Epochs of this reader's cache shards, shuffled by shard order and a bounded in-shard buffer."""

  kind = "cache"

  def __init__(self, task: seqio.Task, *, layout: convert.BatchLayout, cache_dir: str, shuffle_buffer_size: int,
               stats: RowStats, **kwargs):
    super().__init__(task, **kwargs)
    self.stats = stats
    self.layout = layout
    self.cache = cache_lib.CacheReader(cache_lib.task_dir(cache_dir, task.name, self.split))
    self.cache.check(task, self.split, layout)
    if self.cache.num_shards < self.num_readers:
      raise cache_lib.CacheError(
          f"Cache {self.cache.folder} has {self.cache.num_shards} shards for {self.num_readers} data readers; "
          f"rewrite it with --num_shards {self.num_readers} or a multiple of it.")
    self.shards = list(range(self.reader_id, self.cache.num_shards, self.num_readers))
    for i in self.shards:
      self.cache.check_size(i)
    self.counts = [int(self.cache.shards[i]["examples"]) for i in self.shards]
    self.epoch_size = sum(self.counts)
    if self.epoch_size == 0:
      raise cache_lib.CacheError(self._empty_message(f" (cache {self.cache.folder}, shards {self.shards})"))
    self.shuffle_buffer_size = max(1, int(shuffle_buffer_size))
    self.records_read = 0
    self.resume_records_read = 0
    self._resuming = False
    self._records: Iterator[bytes] = iter(())

  def _count(self, limit):
    return self.epoch_size

  def shard_order(self, epoch: int) -> list[int]:
    """Positions in self.shards, in the order epoch `epoch` reads them."""
    if not self.shuffle:
      return list(range(len(self.shards)))
    rng = np.random.default_rng([self.seed, streams.task_key(self.task.name), epoch, 2])
    return rng.permutation(len(self.shards)).tolist()

  def position(self, cursor: tuple[int, int] | None = None) -> tuple[int, int, int]:
    """(epoch, shard position in that epoch's order, record within the shard) of a cursor."""
    epoch, offset = self.cursor if cursor is None else cursor
    done = 0
    for pos, j in enumerate(self.shard_order(epoch)):
      if offset < done + self.counts[j]:
        return epoch, pos, offset - done
      done += self.counts[j]
    return epoch + 1, 0, 0

  def _on_read(self) -> None:
    self.records_read += 1
    if self._resuming:
      self.resume_records_read += 1

  def _shard_records(self, epoch: int, j: int) -> Iterator[bytes]:
    shard = self.shards[j]
    records = self.cache.iter_shard(shard, self._on_read)
    if not self.shuffle:
      return records
    rng = np.random.default_rng([self.seed, streams.task_key(self.task.name), epoch, shard, 3])
    return streams.shuffle_buffer(records, self.shuffle_buffer_size, rng)

  def start(self, cursor):
    self.cursor = tuple(cursor)
    self.resume_records_read = 0
    self._resuming = True
    self._records = self._iter_records(*cursor)

  def _iter_records(self, epoch: int, offset: int) -> Iterator[bytes]:
    if not self.repeat and epoch > 0:
      return
    while True:
      done = 0
      for j in self.shard_order(epoch):
        count = self.counts[j]
        if done + count <= offset:  # a whole shard before the position: skipped by its count, not opened
          done += count
          continue
        skip = max(0, offset - done)
        k = 0
        for record in self._shard_records(epoch, j):
          k += 1
          if k > skip:
            self._resuming = False
            self.cursor = (epoch, done + k)
            yield record
        done += count
      self._resuming = False
      if not self._end_epoch(epoch, done):
        return
      epoch, offset = epoch + 1, 0

  def resume_cursor(self):
    epoch, offset = super().resume_cursor()
    if offset >= self.epoch_size and self.repeat:  # every epoch has the same size
      return epoch + 1, 0
    return epoch, offset

  def take(self, n):
    records = list(itertools.islice(self._records, n))
    if not records:
      return self.layout.zeros(0)
    return cache_lib.decode_rows(records, self.layout, self.cache.features)

  def close(self):
    self._records = iter(())

  def describe(self):
    return {"path": self.kind, "cache": self.cache.folder, "build": dict(self.cache.manifest["stats"]),
            "records_read": self.records_read, "resume_records_read": self.resume_records_read,
            "position": list(self.position()), "shards": self.shards}
