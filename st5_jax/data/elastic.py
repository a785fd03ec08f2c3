"""Elastic resume: a data state saved by N readers (hosts) continues on N' readers.

A reader's stream is a sequence of epochs, each a pure function of (task, split, seed,
number of readers N, reader r, epoch e) (streams.py, cache_stream.py). So the unread
rest of reader r's epoch is named by a *unit* [N, r, e, skip]: "reader r of N's epoch e
from its example `skip` to its end". A resume on N' != N readers:

1. turns every old reader's cursor (epoch, offset) into its unread units: one unit for a
   reader in a regular epoch; the unread rest of its own units for a reader still in an
   earlier resume's carry epoch;
2. deals the units round-robin to the new readers (unit i to reader i mod N');
3. makes the *carry epoch* E0 = the latest epoch any old reader was in: new reader r'
   reads its units in order, then its regular epochs E0+1, E0+2, ... of the new sharding.

Every example of an interrupted epoch is therefore read once (a test counts each example
id), and nothing is lost. The plan is a pure function of the saved state, so every
process computes the same one with no communication; the state keeps it under
`"elastic"` while a reader may still be in its carry epoch. Units are whole old
readers' remainders, so with N' > N only N of the new readers have a carry and the
others start epoch E0+1 at once (load evens out within an epoch: each reader reads
its rows per step regardless).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from st5_jax.batch_geometry import DataConfigError

# (num_readers, reader_id) -> a fresh stream of that reader (repeat on, not started).
StreamFactory = Callable[[int, int], Any]


def reader_units(record: Mapping[str, Any], reader_id: int) -> list[list[int]]:
  """The units a carry record deals to `reader_id` (round-robin over its readers)."""
  return [list(u) for u in record["units"][reader_id::int(record["num_readers"])]]


class _Sizes:
  """Epoch sizes of old readers, counted once each (a cache's from its manifest)."""

  def __init__(self, make_stream: StreamFactory):
    self.make_stream = make_stream
    self._sizes: dict[tuple[int, int], int] = {}

  def __call__(self, n: int, r: int) -> int:
    if (n, r) not in self._sizes:
      stream = self.make_stream(n, r)
      try:
        self._sizes[(n, r)] = stream.count()
      finally:
        stream.close()
    return self._sizes[(n, r)]


def units_from(units: list[list[int]], offset: int, size: Callable[[int, int], int]) -> list[list[int]]:
  """The units left after reading `offset` examples of `units` in order."""
  out = []
  for n, r, e, skip in units:
    left = max(0, size(n, r) - skip)
    if offset >= left:
      offset -= left
      continue
    out.append([n, r, e, skip + offset])
    offset = 0
  return out


def replan(state: Mapping[str, Any], task: str, num_readers: int, make_stream: StreamFactory) -> dict[str, Any]:
  """The carry record of `task` for a resume of `state` on `num_readers` readers."""
  old_n = int(state["num_readers"])
  record = state.get("elastic", {}).get(task)
  cursors = state.get("cursors", {})
  sizes = _Sizes(make_stream)
  units, epochs = [], []
  for r in range(old_n):
    saved = cursors.get(str(r), {}).get(task)
    if saved is None:  # a state saved without this reader's cursor: place it from its position
      stream = make_stream(old_n, r)
      try:
        saved = stream.locate(int(state["positions"][task]))
      finally:
        stream.close()
    epoch, offset = int(saved[0]), int(saved[1])
    if record is not None and epoch == int(record["epoch"]):  # still in an earlier resume's carry
      units += units_from(reader_units(record, r), offset, sizes)
    else:
      units.append([old_n, r, epoch, offset])
    epochs.append(epoch)
  return {"epoch": max(epochs), "num_readers": int(num_readers), "from_readers": old_n, "units": units}


class CarryStream:
  """A reader's stream after an elastic resume: its carry units, then its own epochs from E0+1.

  The cursor keeps the stream contract: (E0, examples read of the carry) inside the carry
  epoch, the regular stream's cursor after it.
  """

  def __init__(self, base, *, epoch: int, units: list[list[int]], make_stream: StreamFactory):
    if not base.repeat:
      raise DataConfigError("An elastic resume (another number of data readers) needs a repeating iterator.")
    self.base = base
    self.carry_epoch = int(epoch)
    self.units = [list(map(int, u)) for u in units]
    self.make_stream = make_stream
    self._sizes = _Sizes(make_stream)
    self._unit = len(self.units)  # index of the unit being read; len(units): carry done
    self._reader = None
    self._read = 0  # examples of the carry read

  def __getattr__(self, name):  # kind, task, cache, epoch_size, ...: the regular stream's
    return getattr(self.base, name)

  @property
  def in_carry(self) -> bool:
    return self._unit < len(self.units)

  @property
  def cursor(self) -> tuple[int, int]:
    return (self.carry_epoch, self._read) if self.in_carry else self.base.cursor

  def _open(self, i: int, skip_more: int) -> None:
    self._close_reader()
    self._unit = i
    if i == len(self.units):
      self.base.start((self.carry_epoch + 1, 0))
      return
    n, r, e, skip = self.units[i]
    self._reader = self.make_stream(n, r)
    self._reader.last_epoch = e  # read epoch e only
    self._reader.start((e, skip + skip_more))

  def start(self, cursor) -> None:
    epoch, offset = int(cursor[0]), int(cursor[1])
    if epoch < self.carry_epoch:
      raise DataConfigError(f"Cursor {cursor} is before the carry epoch {self.carry_epoch} of an elastic resume.")
    if epoch > self.carry_epoch:
      self._close_reader()
      self._unit = len(self.units)
      self.base.start((epoch, offset))
      return
    self._read = offset
    i = 0
    while i < len(self.units) and offset > 0:  # whole units before the cursor: skipped by their sizes
      n, r, _, skip = self.units[i]
      left = max(0, self._sizes(n, r) - skip)
      if offset < left:
        break
      offset -= left
      i += 1
    self._open(i, offset)

  def take(self, n: int):
    parts = []
    while n > 0 and self.in_carry:
      got = self._reader.take(n)
      k = len(next(iter(got.values()))) if got else 0
      if k:
        parts.append(got)
        n -= k
        self._read += k
      if n > 0:  # this unit is exhausted
        self._open(self._unit + 1, 0)
    if n > 0:
      parts.append(self.base.take(n))
    if not parts:
      return self.base.take(0)
    if len(parts) == 1:
      return parts[0]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

  def resume_cursor(self) -> tuple[int, int]:
    return self.cursor if self.in_carry else self.base.resume_cursor()

  def locate(self, position: int):
    raise DataConfigError("An elastic resume needs the saved cursors, not positions.")

  def count(self) -> int:
    return self.base.count()

  def _close_reader(self) -> None:
    if self._reader is not None:
      self._reader.close()
      self._reader = None

  def close(self) -> None:
    self._close_reader()
    self.base.close()

  def describe(self) -> dict[str, Any]:
    info = dict(self.base.describe())
    info["elastic"] = {"carry_epoch": self.carry_epoch, "units": self.units, "in_carry": self.in_carry,
                       "carry_read": self._read}
    return info
