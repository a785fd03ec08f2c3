"""metrics.jsonl + TensorBoard events of a training run, written to the work dir itself.

The work dir may be local or on gs://; every byte goes through the path layer
(st5_jax/paths.py: gcsfs for gs://, the same client against the rehearsal's emulator).
GCS objects cannot be appended to, so a remote file is kept whole in memory and the
object rewritten at each `flush()` (the trainer flushes at every checkpoint and at the
end; a metrics file is a few hundred bytes per logged step). Local files are appended.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import threading
import time
from typing import Mapping

from st5_jax import paths


def _import_tensorboardx():
  """tensorboardX's writer, imported without torch.

  tensorboardX imports torch whenever it is installed (~1.2 s of CPU at every `st5 train` start
  on the development machine) only so that `add_*` accept torch tensors; this writer passes floats. A `None`
  in sys.modules makes its guarded `import torch` fail; torch stays importable afterwards.
  """
  hide = "torch" not in sys.modules
  if hide:
    sys.modules["torch"] = None
  try:
    from tensorboardX import SummaryWriter, record_writer  # pylint: disable=g-import-not-at-top
  finally:
    if hide:
      del sys.modules["torch"]
  return SummaryWriter, record_writer


SummaryWriter, record_writer = _import_tensorboardx()

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
_WRITER_IDS = itertools.count()


class AppendFile:
  """An append-only file on any path: local appends, or a remote object rewritten on flush."""

  def __init__(self, path: paths.PathLike):
    self.path = paths.path(path)
    self._lock = threading.Lock()  # tensorboardX writes and flushes from its own thread too
    if paths.is_remote(self.path):
      self._local = None
      self._buffer = bytearray(paths.read_bytes(self.path) if paths.exists(self.path) else b"")
    else:
      self.path.parent.mkdir(parents=True, exist_ok=True)
      self._local = open(os.fspath(self.path), "ab")

  def write(self, data: bytes) -> None:
    with self._lock:
      if self._local is not None:
        self._local.write(data)
      else:
        self._buffer += data

  def flush(self) -> None:
    with self._lock:
      if self._local is not None:
        self._local.flush()
      else:
        paths.write_bytes(self.path, bytes(self._buffer))

  def close(self) -> None:
    if self._local is not None and self._local.closed:
      return  # closed already (abandon() after a close that failed later on)
    self.flush()
    if self._local is not None:
      self._local.close()


class _PathLayerRecordWriters:
  """tensorboardX's writer factory for gs:// event files: the path layer, not google-cloud-storage."""

  def open(self, path: str) -> AppendFile:
    return AppendFile(path)

  def directory_check(self, path: str) -> None:
    del path  # object stores need no directories


record_writer.register_writer_factory("gs", _PathLayerRecordWriters())


class MetricWriter:
  """Scalars per step to `<workdir>/metrics.jsonl` and `<workdir>/tensorboard/`; a no-op when disabled.

  metrics.jsonl rows: {"step": int, "time": unix seconds, "<prefix>/<name>": float, ...}.
  Only one process of a multi-process run should write (`enabled=jax.process_index() == 0`).
  """

  def __init__(self, workdir: paths.PathLike, *, enabled: bool = True):
    self.enabled = enabled
    if not enabled:
      return
    workdir = paths.path(workdir)
    self.remote = paths.is_remote(workdir)
    self.jsonl = AppendFile(workdir / METRICS_FILE)
    # tensorboardX names event files by the second and the host only: a run resumed within the
    # same second would append to the previous run's file. pid + a counter keep one file per
    # writer, as TensorFlow's own writer does (`.<pid>.<uid>.v2`).
    self.tb = SummaryWriter(os.fspath(workdir / TENSORBOARD_DIR),
                            filename_suffix=f".{os.getpid()}.{next(_WRITER_IDS)}")

  def write(self, step: int, scalars: Mapping[str, float], prefix: str = "train") -> None:
    if not self.enabled:
      return
    row = {"step": step, "time": time.time(), **{f"{prefix}/{k}": float(v) for k, v in scalars.items()}}
    self.jsonl.write((json.dumps(row) + "\n").encode("utf-8"))
    if not self.remote:  # a local row is on disk at once (a killed run keeps it); remote ones on flush()
      self.jsonl.flush()
    for k, v in scalars.items():
      self.tb.add_scalar(f"{prefix}/{k}", float(v), step)

  def flush(self) -> None:
    if self.enabled:
      self.jsonl.flush()
      self.tb.flush()

  def close(self) -> None:
    if self.enabled:
      self.jsonl.close()
      self.tb.close()

  def abandon(self) -> None:
    """Closes after a failed run, never raising a write error again (the run reports its own).

    On a full disk the final flush fails too; tensorboardX then leaves its event file open,
    and its atexit cleanup would retry the flush and print the error as a traceback after the
    run's one-line error. So the event writers are stopped and marked closed either way.
    """
    if not self.enabled:
      return
    for close in (self.jsonl.close, self.tb.close):
      try:
        close()
      except OSError:
        pass
    for file_writer in (self.tb.all_writers or {}).values():
      events = file_writer.event_writer
      if not events._closed:  # pylint: disable=protected-access  (tensorboardX 2.6: what its cleanup checks)
        events._worker.stop()  # pylint: disable=protected-access
        events._closed = True  # pylint: disable=protected-access

