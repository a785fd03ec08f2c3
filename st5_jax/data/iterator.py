"""From a seqio task or mixture to global jax.Arrays on the mesh: sharded, deterministic, resumable.

Each process reads only its shard of every task (st5_jax.batch_geometry decides which), turns it
into rows of the batch layout (streams.py: seqio's own pipeline for any task, or the
NumPy path for this project's sources), interleaves tasks by the deterministic
mixture schedule (mixing.py), optionally keeps duplicate texts out of a batch
(dedup.py), and contributes its per-process rows to one global `jax.Array` per
feature. Batches are made `prefetch` blocks ahead in a daemon thread.

The state (`get_state`) is JSON: the examples consumed per task (the same on every
process, since every process takes the same rows per step and the schedule is the
same everywhere) and, per reader, each task's cursor (epoch, offset). Restoring
rebuilds each task's current epoch from its seed and skips `offset` examples, so the
cost of resuming grows with one epoch of a shard, never with the step. A state saved by
another number of readers resumes elastically (elastic.py). See docs/data.md for the
measurements and the trade-offs against tf.data checkpoints.
"""

from __future__ import annotations

import dataclasses
import json
import queue
import threading
import weakref
from typing import Any, Iterator, Mapping, Sequence

import jax
import numpy as np
import seqio
from jax.experimental import multihost_utils

from st5_jax import batch_geometry as geometry
from st5_jax.batch_geometry import DataConfigError
from st5_jax.data import convert, dedup as dedup_lib, elastic, mixing, streams as streams_lib
from st5_jax.data import prompts as prompts_lib
from st5_jax.data.streams import get_provider  # noqa: F401  (re-exported: its old home)
from st5_jax.data.rows import RowStats

STATE_VERSION = 2
DEFAULT_SHUFFLE_BUFFER = 1 << 17
DEFAULT_DEDUP_WINDOW = 4


@dataclasses.dataclass
class _Block:
  """Batches made together (one dedup window) and the position before and after them."""
  start_step: int
  start_positions: np.ndarray
  end_positions: np.ndarray
  start_cursors: list
  end_cursors: list
  batches: list


_END = object()


class _Producer:
  """Runs a block generator in a daemon thread, `depth` blocks ahead; depth 0 runs it inline."""

  def __init__(self, blocks: Iterator[_Block], depth: int):
    self._blocks = blocks
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
    item = next(self._blocks, _END) if self._thread is None else self._queue.get()
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


@dataclasses.dataclass
class _BlockMaker:
  """Makes blocks of batches from task streams; owned by the producer thread.

  Holds no reference to the BatchIterator, so a dropped iterator can be collected
  and its producer stopped.
  """
  streams: list
  rates: np.ndarray
  layout: convert.BatchLayout
  batch_size: int
  window: int
  dedup: bool
  limits: np.ndarray | None = None
  num_batches: int | None = None
  dedup_moved: int = 0
  dedup_unresolved: int = 0

  def blocks(self, step: int, positions: np.ndarray, cursors: list) -> Iterator[_Block]:
    """Blocks of `window` batches from (step, positions, cursors) on."""
    b = self.batch_size
    left, rights = self.layout.dedup_keys()
    while True:
      num = self.window
      if self.num_batches is not None:
        num = min(num, self.num_batches - step)
        if num <= 0:
          return
      ids = mixing.schedule(positions, self.rates, num * b, self.limits)
      n = len(ids) // b
      if n == 0:
        return
      rows = self.layout.zeros(len(ids))
      for t, stream in enumerate(self.streams):
        where = np.flatnonzero(ids == t)
        if not len(where):
          continue
        got = stream.take(len(where))
        got_n = len(next(iter(got.values())))
        if got_n < len(where):
          raise DataConfigError(f"Task {stream.task.name} ran out of examples ({got_n} of {len(where)}) "
                                "although its count said otherwise; did its files change during the run?")
        for k, v in got.items():
          rows[k][where] = v  # back into schedule order
      end = positions + np.bincount(ids, minlength=len(self.streams))
      end_cursors = [s.resume_cursor() for s in self.streams]
      if self.dedup and left is not None:
        index_lists, moved, unresolved = dedup_lib.dedup_assign(rows[left], [rows[k] for k in rights],
                                                                batch_size=b, num_batches=n)
        self.dedup_moved += moved
        self.dedup_unresolved += unresolved
      else:
        index_lists = [np.arange(j * b, (j + 1) * b) for j in range(n)]
      batches = [{k: np.ascontiguousarray(v[idx]) for k, v in rows.items()} for idx in index_lists]
      yield _Block(step, positions.copy(), end.copy(), list(cursors), list(end_cursors), batches)
      step += n
      positions, cursors = end, end_cursors


class BatchIterator:
  """Yields dicts of batch features: global jax.Arrays on a mesh, or NumPy arrays without one.

  `get_state()`/`set_state()` save and restore the position exactly; `stats` reports
  rows read and skipped per task.
  """

  def __init__(self, *, provider: seqio.DatasetProviderBase, split: str, feature_lengths: Mapping[str, int],
               global_batch_size: int, local_batch_size: int, reader_id: int, num_readers: int,
               mesh: jax.sharding.Mesh | None, data_axes: Sequence[str], seed: int, shuffle: bool, dedup: bool,
               repeat: bool, dedup_window: int, shuffle_buffer_size: int, prefetch: int = 2,
               model_feature_names: Mapping[str, str] | None = None, numpy_path: bool = True,
               cache_dir: str | None = None, prompts: Any = None):
    self.name = provider.name
    self.cache_dir = cache_dir
    self.tasks, self.rates = mixing.tasks_and_rates(provider)
    self.split = split
    self.layout = convert.batch_layout(self.tasks, feature_lengths, model_feature_names=model_feature_names)
    # DataConfig.prompts: each task with its prompts step (prompts.py), which every stream then runs.
    try:
      self.prompts = prompts_lib.resolve(prompts, [t.name for t in self.tasks],
                                         [f.task_key for f in self.layout.features if f.is_tokens])
      self.tasks = [prompts_lib.with_prompts(t, self.prompts[t.name]) for t in self.tasks]
    except ValueError as e:
      raise DataConfigError(str(e)) from e
    self.feature_lengths = self.layout.token_lengths
    self.model_feature_lengths = self.layout.model_feature_lengths
    self.global_batch_size = global_batch_size
    self.local_batch_size = local_batch_size
    self.reader_id, self.num_readers = reader_id, num_readers
    self.mesh, self.data_axes = mesh, tuple(data_axes)
    self.seed, self.shuffle, self.dedup, self.repeat = int(seed), bool(shuffle), bool(dedup), bool(repeat)
    self.window = max(1, int(dedup_window)) if dedup else 1
    self.shuffle_buffer_size = int(shuffle_buffer_size)
    self.prefetch = int(prefetch)
    self.numpy_path = bool(numpy_path)
    self._task_stats = {t.name: RowStats() for t in self.tasks}
    self._lock = threading.Lock()
    self._producer: _Producer | None = None
    self._maker: _BlockMaker | None = None
    self._streams: list[streams_lib.TaskStream] = []
    self._start(step=0, block_start_step=0, positions=np.zeros(len(self.tasks), np.int64),
                cursors=[(0, 0)] * len(self.tasks))

  # --- construction and restore -------------------------------------------------

  def close(self) -> None:
    """Stops the background producer (also done when the iterator is collected or at exit)."""
    if self._producer is not None:
      self._finalizer.detach()
      self._producer.close()
      self._producer = None
    for stream in self._streams:
      stream.close()

  def _stream_factory(self, task: seqio.Task) -> elastic.StreamFactory:
    """(num_readers, reader_id) -> task's stream as that reader sees it (not started).

    A closure over the settings only: the streams must hold no reference to the iterator,
    so a dropped iterator is collected and its producer stopped.
    """
    kw = dict(stats=self._task_stats[task.name], split=self.split, seed=self.seed, shuffle=self.shuffle,
              repeat=self.repeat, layout=self.layout, shuffle_buffer_size=self.shuffle_buffer_size)
    cache_dir, numpy_path = self.cache_dir, self.numpy_path

    def make(num_readers: int, reader_id: int) -> streams_lib.TaskStream:
      if cache_dir:  # every task from its token cache (st5_jax.data.cache)
        from st5_jax.data import cache_stream  # pylint: disable=g-import-not-at-top
        return cache_stream.CacheStream(task, cache_dir=cache_dir, reader_id=reader_id, num_readers=num_readers, **kw)
      return streams_lib.make_stream(task, numpy_path=numpy_path, reader_id=reader_id, num_readers=num_readers, **kw)
    return make

  def _start(self, *, step: int, block_start_step: int, positions: np.ndarray, cursors: list | None,
             carry: Mapping[str, Any] | None = None) -> None:
    self.close()
    self._carry = dict(carry or {})
    new = []
    for task in self.tasks:
      make = self._stream_factory(task)
      stream = make(self.num_readers, self.reader_id)
      record = self._carry.get(task.name)
      if record is not None:  # an elastic resume: the old readers' unread rest of their epoch first
        stream = elastic.CarryStream(stream, epoch=record["epoch"], units=elastic.reader_units(record, self.reader_id),
                                     make_stream=make)
      new.append(stream)
    if cursors is None:  # a state without this reader's cursors: count this shard's epochs
      cursors = [stream.locate(int(p)) for stream, p in zip(new, positions)]
    for stream, cursor in zip(new, cursors):
      stream.start(cursor)
    self._streams = new
    moved, unresolved = (self._maker.dedup_moved, self._maker.dedup_unresolved) if self._maker else (0, 0)
    self._maker = _BlockMaker(streams=new, rates=self.rates, layout=self.layout, batch_size=self.local_batch_size,
                              window=self.window, dedup=self.dedup, dedup_moved=moved, dedup_unresolved=unresolved)
    if not self.repeat:
      self._maker.limits = np.asarray([s.count() for s in new], np.int64)
      self._maker.num_batches = self._agree_num_batches(int(self._maker.limits.sum()) // self.local_batch_size)
    self._step = block_start_step
    self._block: _Block | None = None
    self._block_index = 0
    self._positions = positions.astype(np.int64).copy()
    self._cursors = [tuple(c) for c in cursors]
    self._producer = _Producer(self._maker.blocks(block_start_step, self._positions.copy(), list(self._cursors)),
                               self.prefetch)
    self._finalizer = weakref.finalize(self, _Producer.close, self._producer)
    while self._step < step:  # replay inside the current dedup window
      self._next_local()

  def _agree_num_batches(self, local: int) -> int:
    # Every process must stop at the same step or the collective of the last step hangs.
    if jax.process_count() == 1 or self.mesh is None:
      return local
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
    out = {}
    for k, v in batch.items():
      sharding = geometry.batch_sharding(self.mesh, self.data_axes, v.ndim)
      out[k] = jax.make_array_from_process_local_data(sharding, v, (self.global_batch_size, *v.shape[1:]))
    return out

  def _next_local(self) -> dict[str, np.ndarray]:
    if self._block is None or self._block_index == len(self._block.batches):
      self._block = self._producer.get()
      self._block_index = 0
      self._positions = self._block.start_positions.copy()
      self._cursors = list(self._block.start_cursors)
    batch = self._block.batches[self._block_index]
    self._block_index += 1
    self._step += 1
    if self._block_index == len(self._block.batches):
      self._positions = self._block.end_positions.copy()
      self._cursors = list(self._block.end_cursors)
    return batch

  # --- state ------------------------------------------------------------------

  def _config(self) -> dict[str, Any]:
    config = {
        "task": self.name, "split": self.split, "seed": self.seed, "shuffle": self.shuffle, "dedup": self.dedup,
        "dedup_window": self.window, "repeat": self.repeat, "global_batch_size": self.global_batch_size,
        "num_readers": self.num_readers, "feature_lengths": dict(self.feature_lengths),
        "tasks": [t.name for t in self.tasks], "shuffle_buffer_size": self.shuffle_buffer_size,
        "streams": {t.name: s.kind for t, s in zip(self.tasks, self._streams)},
    }
    if any(self.prompts.values()):  # only when set: states saved before prompts existed keep matching
      config["prompts"] = {name: p for name, p in self.prompts.items() if p}
    if self.cache_dir:  # a rewritten cache (other shards or contents) is another order
      config["caches"] = {t.name: s.cache.fingerprint for t, s in zip(self.tasks, self._streams)}
    return config

  def _gather_cursors(self, cursors: list) -> dict[str, dict[str, list[int]]]:
    """Every reader's cursors (a collective on several processes: all call get_state at the same step)."""
    flat = np.asarray([self.reader_id] + [x for c in cursors for x in c], np.int64)
    if self.mesh is not None and jax.process_count() > 1:
      rows = np.asarray(multihost_utils.process_allgather(flat)).reshape(-1, flat.size)
    else:
      rows = flat[None]
    names = [t.name for t in self.tasks]
    return {str(int(r[0])): {name: [int(r[1 + 2 * i]), int(r[2 + 2 * i])] for i, name in enumerate(names)}
            for r in rows}

  def get_state(self) -> dict[str, Any]:
    """JSON-serialisable position, the same on every process.

    On several processes this is a collective (every process's cursors are gathered),
    so all processes must call it at the same step, as the trainer's checkpoints do.
    """
    with self._lock:
      block = self._block
      if block is not None and self._block_index < len(block.batches):
        step0, positions, cursors = block.start_step, block.start_positions, block.start_cursors  # replay window
      else:
        step0, positions, cursors = self._step, self._positions, self._cursors
      state = {"version": STATE_VERSION, **self._config(), "step": self._step, "block_start_step": int(step0),
               "positions": {t.name: int(p) for t, p in zip(self.tasks, positions)}}
    state["cursors"] = self._gather_cursors(list(cursors))
    carry = {}
    for name, record in self._carry.items():  # kept while a reader may still be in its carry epoch
      epochs = [c[name][0] for c in state["cursors"].values()]
      if len(epochs) < self.num_readers or min(epochs) <= record["epoch"]:
        carry[name] = record
    if carry:
      state["elastic"] = carry
    json.dumps(state)  # fail here, not in the checkpointer
    return state

  def set_state(self, state: Mapping[str, Any]) -> None:
    """Continues exactly where the iterator that produced `state` was."""
    version = state.get("version")
    if version not in (1, STATE_VERSION):
      raise DataConfigError(f"Iterator state version {version} is not {STATE_VERSION} (or 1).")
    mine = self._config()
    if version == 1:  # saved before the seqio path existed: every task was on the NumPy path
      mine.pop("streams")
    # Another number of readers (hosts) is an elastic resume (elastic.py); a version-1 state has no cursors for it.
    resize = version == STATE_VERSION and state.get("num_readers") != self.num_readers
    if resize:
      mine.pop("num_readers")
    diffs = {k: (state.get(k), v) for k, v in mine.items() if state.get(k) != v}
    if diffs:
      detail = "; ".join(f"{k}: saved {a!r}, now {b!r}" for k, (a, b) in diffs.items())
      raise DataConfigError(f"Iterator state does not match this iterator ({detail}). Resume with the same "
                            "task, split, seed, global batch size, feature lengths and data path (the number of "
                            "data readers may change).")
    positions = np.asarray([int(state["positions"][t.name]) for t in self.tasks], np.int64)
    carry = dict(state.get("elastic", {}))
    cursors = None
    if resize:
      carry = {t.name: elastic.replan(state, t.name, self.num_readers, self._stream_factory(t)) for t in self.tasks}
      cursors = [(carry[t.name]["epoch"], 0) for t in self.tasks]
    elif version == STATE_VERSION and str(self.reader_id) in state.get("cursors", {}):
      mine_c = state["cursors"][str(self.reader_id)]
      cursors = [tuple(int(x) for x in mine_c[t.name]) for t in self.tasks]
    elif version == 1:
      hints = [state.get("epoch_sizes", {}).get(t.name, {}).get(str(self.reader_id)) for t in self.tasks]
      if all(hints):
        cursors = [divmod(int(p), int(h)) if self.repeat or p < h else (1, 0) for p, h in zip(positions, hints)]
    if carry and cursors is None:
      raise DataConfigError(f"This state has no cursor for reader {self.reader_id}, which an elastic resume's carry "
                            "epoch needs; resume from a state saved by every process.")
    with self._lock:
      self._start(step=int(state["step"]), block_start_step=int(state["block_start_step"]), positions=positions,
                  cursors=cursors, carry=carry)

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
      info = stream.describe()
      build = dict(info.get("build", {}))
      per_task[task.name] = {"path": stream.kind, "read": read.as_dict(), "build": build,
                             "epoch": int(self._cursors[t][0]), "epoch_offset": int(self._cursors[t][1]),
                             "examples_consumed": int(self._positions[t]), "epoch_size": stream.epoch_size}
      if "elastic" in info:  # an elastic resume's carry (elastic.py)
        per_task[task.name]["elastic"] = info["elastic"]
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
  def element_spec(self) -> dict[str, tuple[int, ...]]:
    return {f.model_key: self.layout.shape(f, self.global_batch_size) for f in self.layout.features}


def make_train_iterator(*, task: str, feature_lengths: Mapping[str, int], global_batch_size: int,
                        mesh: jax.sharding.Mesh, data_axes: Sequence[str] = ("data",), seed: int = 0,
                        shuffle: bool = True, dedup: bool = False, split: str = "train", repeat: bool = True,
                        dedup_window: int = DEFAULT_DEDUP_WINDOW, shuffle_buffer_size: int = DEFAULT_SHUFFLE_BUFFER,
                        prefetch: int = 2, model_feature_names: Mapping[str, str] | None = None,
                        numpy_path: bool = True, cache_dir: str | None = None, prompts: Any = None) -> BatchIterator:
  """Global batches of a registered task or mixture, sharded over `data_axes` of `mesh`.

  Args:
    task: seqio task or mixture name (st5_jax.data.tasks registers the st5 ones;
      users' modules register theirs).
    feature_lengths: token length per task feature, e.g. {"inputs": 64, "targets": 64};
      a missing `negative_targets` length defaults to the `targets` length; scalar
      features (an int label) need none. See convert.batch_layout.
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
    shuffle_buffer_size: rows held for shuffling on the NumPy path (a full shuffle for
      smaller shards); seqio tasks use their own `shuffle_buffer_size`.
    prefetch: dedup windows (batches when dedup is off) prepared ahead in a background
      thread; 0 prepares each one when it is asked for.
    model_feature_names: task feature -> batch feature name, over st5_jax.features'
      defaults (other features keep their names).
    numpy_path: run this project's own sources on the NumPy path (False: everything
      through seqio's pipeline; the orders differ, the tokens of a row do not).
    cache_dir: read every task from its token cache <cache_dir>/<task>/<split>
      (`st5 data cache`, st5_jax.data.cache) instead of its source; each process reads
      only its own shards.
    prompts: text prepended to task features before tokenisation (DataConfig.prompts; the forms are
      st5_jax.data.prompts'): the same token ids on the NumPy, seqio and cache paths.

  Returns:
    A BatchIterator of {model feature: [B, L] token ids or [B] scalars} jax.Arrays.
  """
  data_axes = tuple(data_axes)
  geometry.check_global_batch_size(global_batch_size, mesh=mesh, data_axes=data_axes)
  provider = get_provider(task)
  assignment = geometry.reader_assignment(mesh=mesh, data_axes=data_axes, global_batch_size=global_batch_size)
  return BatchIterator(provider=provider, split=split, feature_lengths=feature_lengths,
                       global_batch_size=global_batch_size, local_batch_size=assignment.local_batch_size,
                       reader_id=assignment.reader_id, num_readers=assignment.num_readers, mesh=mesh,
                       data_axes=data_axes, seed=seed, shuffle=shuffle, dedup=dedup, repeat=repeat,
                       dedup_window=dedup_window, shuffle_buffer_size=shuffle_buffer_size, prefetch=prefetch,
                       model_feature_names=model_feature_names, numpy_path=numpy_path, cache_dir=cache_dir,
                       prompts=prompts)


def make_local_iterator(*, task: str, feature_lengths: Mapping[str, int], batch_size: int, reader_id: int = 0,
                        num_readers: int = 1, seed: int = 0, shuffle: bool = True, dedup: bool = False,
                        split: str = "train", repeat: bool = True, dedup_window: int = DEFAULT_DEDUP_WINDOW,
                        shuffle_buffer_size: int = DEFAULT_SHUFFLE_BUFFER, prefetch: int = 2,
                        model_feature_names: Mapping[str, str] | None = None,
                        numpy_path: bool = True, cache_dir: str | None = None, prompts: Any = None) -> BatchIterator:
  """NumPy batches of one reader's shard: what one process contributes (benchmarks, tests, debugging)."""
  if batch_size <= 0:
    raise DataConfigError(f"batch_size must be positive, got {batch_size}.")
  if not 0 <= reader_id < num_readers:
    raise DataConfigError(f"reader_id {reader_id} is not in [0, {num_readers}).")
  provider = get_provider(task)
  return BatchIterator(provider=provider, split=split, feature_lengths=feature_lengths,
                       global_batch_size=batch_size * num_readers, local_batch_size=batch_size,
                       reader_id=reader_id, num_readers=num_readers, mesh=None, data_axes=(), seed=seed,
                       shuffle=shuffle, dedup=dedup, repeat=repeat, dedup_window=dedup_window,
                       shuffle_buffer_size=shuffle_buffer_size, prefetch=prefetch,
                       model_feature_names=model_feature_names, numpy_path=numpy_path, cache_dir=cache_dir,
                       prompts=prompts)
