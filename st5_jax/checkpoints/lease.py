"""One trainer per work dir: a lease the trainer holds while it runs, renewed in the background.

The lease is `WORKDIR/lease.json`: who holds it (host, pid, start time), when it was last
renewed and when it expires. Taking, renewing and giving it back are compare-and-swap writes,
so two trainers can never both hold it:
  local  the file is read and written under an exclusive `flock` of the file itself;
  gs://  the object is created with `ifGenerationMatch=0` and rewritten with
         `ifGenerationMatch=<the generation this trainer wrote last>` (a 412 means someone else wrote it).
A second trainer is refused with one line that names the holder and how to take over
(`st5 train --takeover`, or wait until the lease expires). A lease is free without asking when
it has expired (the holder stopped renewing it: a preempted VM), when its holder was a process
of this host that no longer runs (kill -9, the OOM killer), or when it was copied with the
work dir from another path; taking it over then is logged. A holder whose lease was taken
over finds out at its next renewal or before its next checkpoint, and stops there
(`WorkdirLeaseLostError`) without writing. Multi-host: the lead process holds the lease for the
job (`hold`); every process stops together (the lead's answer is broadcast).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import json
import logging
import os
import socket
import threading
import time
import urllib.parse
import uuid
from typing import Any, Iterator

import jax
import numpy as np
from jax.experimental import multihost_utils

from st5_jax import multihost, paths

log = logging.getLogger(__name__)

LEASE_FILE = "lease.json"
TAKEOVER_HINT = "st5 train --takeover"


class WorkdirInUseError(RuntimeError):
  """Another trainer holds the work dir's lease; the message names it and how to take over."""


class WorkdirLeaseLostError(RuntimeError):
  """This trainer's lease was taken over (or expired unrenewed): it stops before writing more."""


@dataclasses.dataclass(frozen=True)
class LeaseOptions:
  """How a trainer holds its work dir: the expiry, the renewal interval, and whether to take a held lease over."""

  expiry_s: float = 600.0
  renew_s: float | None = None  # default: a quarter of expiry_s
  takeover: bool = False

  def __post_init__(self):
    if self.expiry_s <= 0 or (self.renew_s is not None and not 0 < self.renew_s < self.expiry_s):
      raise ValueError(f"lease: expiry_s must be > 0 and renew_s in (0, expiry_s); got expiry_s={self.expiry_s}, "
                       f"renew_s={self.renew_s}")

  @property
  def renew_every_s(self) -> float:
    return self.renew_s if self.renew_s is not None else self.expiry_s / 4


def _iso(t: float) -> str:
  return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _boot_id() -> str | None:
  """This boot of this host (Linux): a pid recorded before a reboot names no process of this one."""
  try:
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
      return f.read().strip()
  except OSError:
    return None


def _stat_fields(pid: int) -> list[str] | None:
  """/proc/PID/stat's fields after the command name (state first; the start time is [19]), or None."""
  try:
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
      fields = f.read().rsplit(")", 1)[1].split()
  except (OSError, IndexError):
    return None
  return fields if len(fields) > 19 else None


def _pid_start(pid: int) -> str | None:
  """When process `pid` started (clock ticks since boot, /proc/PID/stat field 22): a reused pid differs."""
  fields = _stat_fields(pid)
  return fields[19] if fields else None


def _pid_alive(pid: int, start: str | None = None) -> bool:
  """Whether the process `pid` (started at `start`, when known) still runs on this host (a zombie does not count)."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    pass
  fields = _stat_fields(pid)
  if fields is None:
    return True
  if fields[0] == "Z":
    return False
  return start is None or fields[19] == start  # another process that got the same pid (a restarted container)


def workdir_key(workdir: paths.PathLike) -> str:
  """The work dir as recorded in its lease (local: the real path, so two spellings are one dir)."""
  p = os.fspath(paths.path(workdir))
  return p if paths.is_remote(p) else os.path.realpath(p)


def describe(record: dict[str, Any], now: float | None = None) -> str:
  """'host H, pid P, started T, last renewed T (N s ago)' of a lease record."""
  now = time.time() if now is None else now
  renewed = float(record.get("renewed", 0))
  return (f"host {record.get('host')}, pid {record.get('pid')}, started {_iso(float(record.get('started', 0)))}, "
          f"last renewed {_iso(renewed)} ({now - renewed:.0f} s ago)")


def free_reason(record: dict[str, Any], workdir: str, now: float | None = None) -> str | None:
  """Why a lease someone else wrote no longer holds the work dir, or None while it does."""
  now = time.time() if now is None else now
  expires = float(record.get("renewed", 0)) + float(record.get("expiry_s", 0))
  if now > expires:
    return f"it expired at {_iso(expires)} without renewal"
  if record.get("host") == socket.gethostname():
    if record.get("boot_id") and record.get("boot_id") != _boot_id():
      return "this host has rebooted since its process took it"
    if not _pid_alive(int(record.get("pid", -1)), record.get("pid_start")):
      return "its process no longer runs on this host"
  if record.get("workdir") != workdir:
    return f"it was copied with the work dir from {record.get('workdir')}"
  return None


# ---------------------------------------------------------------- compare-and-swap storage


class _LocalStore:
  """The lease file, read and written under an exclusive flock of the file itself."""

  def __init__(self, path: str):
    self.path = path

  @contextlib.contextmanager
  def _locked(self, create: bool) -> Iterator[int | None]:
    """The locked file's descriptor; None when there is no file and `create` is False (a read, or a
    removal, never creates one: an empty file left after a release would be read as a lease)."""
    if create:
      os.makedirs(os.path.dirname(self.path), exist_ok=True)
    while True:
      try:
        fd = os.open(self.path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
      except FileNotFoundError:
        yield None
        return
      fcntl.flock(fd, fcntl.LOCK_EX)
      try:
        if os.fstat(fd).st_ino == os.stat(self.path).st_ino:
          break  # still the file at the path (not one a release unlinked while we waited)
      except FileNotFoundError:
        pass
      os.close(fd)
    try:
      yield fd
    finally:
      os.close(fd)  # releases the flock

  @staticmethod
  def _read(fd: int) -> dict[str, Any] | None:
    os.lseek(fd, 0, os.SEEK_SET)
    data = b""
    while chunk := os.read(fd, 1 << 16):
      data += chunk
    try:
      record = json.loads(data.decode("utf-8")) if data.strip() else None
    except ValueError:
      log.warning("Work dir lease file is unreadable (a write cut short); treating it as free.")
      return None
    return record if isinstance(record, dict) else None

  def read(self) -> dict[str, Any] | None:
    with self._locked(create=False) as fd:
      return None if fd is None else self._read(fd)

  def swap(self, expected_token: str | None, record: dict[str, Any] | None,
           ) -> tuple[bool, dict[str, Any] | None]:
    """Writes `record` (None: removes the file) if the current holder's token is `expected_token`.

    expected_token "*": whatever is there. Returns (written, the record found before).
    """
    with self._locked(create=record is not None) as fd:
      current = None if fd is None else self._read(fd)
      token = current.get("token") if current else None
      if expected_token != "*" and token != expected_token:
        return False, current
      if record is None:
        if fd is not None:
          os.unlink(self.path)
      else:
        data = json.dumps(record, indent=1).encode("utf-8")
        os.pwrite(fd, data, 0)  # before the truncate: a failed write (a full disk) leaves the old record, not none
        os.ftruncate(fd, len(data))
        os.fsync(fd)
      return True, current


class _GcsStore:
  """The lease object, written with generation preconditions (gcsfs' HTTP session, as the rest of paths uses)."""

  def __init__(self, url: str):
    import fsspec  # pylint: disable=g-import-not-at-top
    self.fs = fsspec.filesystem("gs")
    self.bucket, _, self.key = url[len("gs://"):].partition("/")
    self.generation = 0  # of the record this store read or wrote last

  def _get(self) -> tuple[dict[str, Any] | None, int]:
    try:
      headers, body = self.fs.call("GET", "b/{}/o/{}", self.bucket, self.key, alt="media")
    except FileNotFoundError:
      return None, 0
    try:
      record = json.loads(body.decode("utf-8"))
    except ValueError:
      record = None
    return (record if isinstance(record, dict) else None), int(headers["x-goog-generation"])

  def read(self) -> dict[str, Any] | None:
    record, self.generation = self._get()
    return record

  def _put(self, record: dict[str, Any], if_generation: int) -> int | None:
    """The new generation, or None when the object's generation is not `if_generation` (412)."""
    location = self.fs._location  # pylint: disable=protected-access  (gcsfs' endpoint: GCS or the emulator)
    url = f"{location}/upload/storage/v1/b/{urllib.parse.quote(self.bucket, safe='')}/o"
    data = json.dumps(record, indent=1).encode("utf-8")
    try:
      out = self.fs.call("POST", url, uploadType="media", name=self.key, ifGenerationMatch=str(if_generation),
                         data=data, headers={"Content-Type": "application/octet-stream"}, json_out=True)
    except FileExistsError:  # 412: another writer came first; or our own write whose reply was lost and retried
      current, generation = self._get()
      return generation if current == record else None
    return int(out["generation"])

  def swap(self, expected_token: str | None, record: dict[str, Any] | None,
           ) -> tuple[bool, dict[str, Any] | None]:
    current, generation = self._get()
    token = current.get("token") if current else None
    if expected_token != "*" and token != expected_token:
      return False, current
    if record is None:
      try:
        self.fs.call("DELETE", "b/{}/o/{}", self.bucket, self.key, ifGenerationMatch=str(generation))
      except (FileNotFoundError, FileExistsError):
        pass  # gone already, or rewritten by a new holder: not ours to remove
      return True, current
    new = self._put(record, generation)
    if new is None:
      return False, self.read()
    self.generation = new
    return True, current


def _store(path: str) -> _LocalStore | _GcsStore:
  if path.startswith("gs://"):
    return _GcsStore(path)
  if paths.is_remote(path):
    raise ValueError(f"{path}: a work dir lease needs a local path or gs://")
  return _LocalStore(path)


# --------------------------------------------------------------------------------- the lease


class WorkdirLease:
  """This process's lease on a work dir: `acquire`, renewed by a thread, `release` at the end."""

  def __init__(self, workdir: paths.PathLike, options: LeaseOptions = LeaseOptions()):
    self.workdir = workdir_key(workdir)
    self.path = paths.join(workdir, LEASE_FILE)
    self.options = options
    self.store = _store(self.path)
    now = time.time()
    self.record = {"host": socket.gethostname(), "pid": os.getpid(), "pid_start": _pid_start(os.getpid()),
                   "boot_id": _boot_id(), "started": now, "renewed": now,
                   "expiry_s": options.expiry_s, "workdir": self.workdir, "token": uuid.uuid4().hex}
    self.lost: str | None = None  # why, once this process knows it no longer holds the lease
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None

  @property
  def token(self) -> str:
    return self.record["token"]

  @classmethod
  def acquire(cls, workdir: paths.PathLike, options: LeaseOptions = LeaseOptions()) -> "WorkdirLease":
    """Takes the lease (a free, stale or, with options.takeover, held one) and starts renewing it.

    Raises WorkdirInUseError naming the holder when another trainer holds it.
    """
    lease = cls(workdir, options)
    for _ in range(5):  # another trainer may write between our read and our write: read again
      current = lease.store.read()
      lease.record["renewed"] = time.time()
      if current is not None and current.get("token") != lease.token:
        reason = free_reason(current, lease.workdir)
        if reason is None and not options.takeover:
          raise WorkdirInUseError(
              f"The work dir {lease.workdir} is in use by another trainer ({describe(current)}; the lease expires "
              f"after {float(current.get('expiry_s', 0)):.0f} s without renewal). Stop that trainer, wait until its "
              f"lease expires (e.g. a preempted VM that never released it), or take over with `{TAKEOVER_HINT}` "
              "(the other trainer then stops before its next checkpoint).")
        why = reason or f"`{TAKEOVER_HINT}`"
        log.warning("Taking over the work dir lease of %s from %s: %s.", lease.workdir, describe(current), why)
      written, _ = lease.store.swap(current.get("token") if current else None, lease.record)
      if written:
        lease._start()
        log.info("Holding the work dir lease %s (expires after %g s without renewal; renewed every %g s).",
                 lease.path, options.expiry_s, options.renew_every_s)
        return lease
    raise WorkdirInUseError(f"The work dir {lease.workdir}: its lease changed hands five times while this trainer "
                            "tried to take it; another trainer is starting there.")

  def _start(self) -> None:
    self._thread = threading.Thread(target=self._renew_loop, name=f"st5-lease-{self.token[:8]}", daemon=True)
    self._thread.start()

  def _renew_loop(self) -> None:
    last_ok = time.time()
    while not self._stop.wait(self.options.renew_every_s):
      try:
        self.renew()
        last_ok = time.time()
      except Exception as e:  # noqa: BLE001  (a storage hiccup: try again, until the lease would have expired)
        log.warning("Could not renew the work dir lease %s (%s: %s); retrying.", self.path, type(e).__name__, e)
        if time.time() - last_ok > self.options.expiry_s:
          self.lost = f"it could not be renewed for {self.options.expiry_s:.0f} s (the last error: {e})"
      if self.lost:
        log.error("Lost the work dir lease %s: %s. Training stops before its next write.", self.path, self.lost)
        return

  def renew(self) -> None:
    """Rewrites the lease with a new renewal time if this process still holds it; else sets `lost`."""
    if self.lost:
      return
    renewed = dict(self.record, renewed=time.time())
    written, current = self.store.swap(self.token, renewed)
    if written:
      self.record = renewed
    else:
      self.lost = self._taken_by(current)

  def verify(self) -> str | None:
    """Reads the lease now: None while this process holds it, else why not (also kept in `lost`)."""
    if self.lost:
      return self.lost
    current = self.store.read()
    if current is None or current.get("token") != self.token:
      self.lost = self._taken_by(current)
    elif time.time() > float(self.record["renewed"]) + self.options.expiry_s:
      self.lost = "it expired without renewal"
    return self.lost

  @staticmethod
  def _taken_by(current: dict[str, Any] | None) -> str:
    if current is None:
      return "the lease file was removed"
    return f"another trainer took it over ({describe(current)})"

  def release(self) -> None:
    """Stops renewing and gives the lease back (if still ours)."""
    self._stop.set()
    if self._thread is not None and self._thread is not threading.current_thread():
      self._thread.join(timeout=60)
    if self.lost:
      return
    try:
      self.store.swap(self.token, None)
    except Exception as e:  # noqa: BLE001  (never hide the error the run ends with; the lease then expires)
      log.warning("Could not release the work dir lease %s (%s: %s); it expires in %.0f s.", self.path,
                  type(e).__name__, e, self.options.expiry_s)


# ------------------------------------------------------------------------ the trainer's view


class Held:
  """What a trainer's processes check before they write: the job's lease (held by the lead; None elsewhere)."""

  def __init__(self, lease: WorkdirLease | None, workdir: str):
    self.lease, self.workdir = lease, workdir

  def _lost_everywhere(self, reason: str | None) -> str | None:
    if jax.process_count() == 1:
      return reason
    lost = int(multihost_utils.broadcast_one_to_all(np.asarray(reason is not None, np.int32)))
    return (reason or "the lead process lost it (its log says why)") if lost else None

  def check(self, before: str) -> None:
    """Verifies the lease now (the lead reads it; every process calls this at the same point, e.g. a
    checkpoint step) and raises WorkdirLeaseLostError on every process if it is lost."""
    reason = self._lost_everywhere(self.lease.verify() if self.lease is not None else None)
    if reason is not None:
      raise WorkdirLeaseLostError(
          f"This trainer no longer holds the work dir {self.workdir}: {reason}. It stopped before {before} and "
          "wrote nothing more there; rerun (with --takeover if needed) only once the other trainer is stopped.")

  def check_cached(self, before: str) -> None:
    """`check` from what the renewal thread last saw (no I/O); a no-op with several processes (see `check`)."""
    if self.lease is not None and self.lease.lost and jax.process_count() == 1:
      self.check(before)


@contextlib.contextmanager
def hold(workdir: paths.PathLike, options: LeaseOptions = LeaseOptions()) -> Iterator[Held]:
  """The job's lease on `workdir` for the block: the lead process takes it, every process learns whether it did.

  Raises WorkdirInUseError (on every process) when another trainer holds it; released at the end of the block.
  """
  lease, error = None, None
  if multihost.is_lead():
    try:
      lease = WorkdirLease.acquire(workdir, options)
    except Exception as e:  # noqa: BLE001  (any failure: the other processes must hear of it, not wait at the barrier)
      error = e
      from st5_jax.checkpoints import storage  # pylint: disable=g-import-not-at-top  (it imports orbax's half)
      written = storage.workdir_write_error(e, paths.path(workdir))  # a read-only or full disk: the one line
      if written is not None:
        written.__cause__ = e
        error = written
  if jax.process_count() > 1:
    try:
      multihost.barrier("workdir_lease")
      refused = int(multihost_utils.broadcast_one_to_all(np.asarray(error is not None, np.int32)))
    except BaseException:
      if lease is not None:
        lease.release()
      raise
    if refused and error is None:
      error = WorkdirInUseError(f"The work dir {workdir_key(workdir)}: the lead process (0) could not take its "
                                "lease; its output says why (another trainer holding it names the holder).")
  if error is not None:
    raise error
  try:
    yield Held(lease, workdir_key(workdir))
  finally:
    if lease is not None:
      lease.release()
