"""Work dirs that stop taking writes (disk full, quota, permissions, read-only): one clear error.

tensorstore and orbax wrap the OS error in their own ValueErrors; `workdir_write_error`
finds the errno behind any of them and turns it into a `WorkdirWriteError` that names
the path, the reason, the free space and the checkpoints a rerun resumes from.
"""

from __future__ import annotations

import errno
import logging
import os
import pathlib
import shutil
import sys

from etils import epath

from st5_jax import paths
from st5_jax.checkpoints import native


class WorkdirWriteError(OSError):
  """The work dir stopped taking writes (disk full, quota, permissions, read-only)."""


# errno values and the texts tensorstore / orbax wrap them in (their errors are ValueErrors).
_STORAGE_ERRNOS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
                   errno.EACCES: "permission denied", errno.EPERM: "operation not permitted",
                   errno.EROFS: "read-only file system"}
_STORAGE_TEXTS = {"no space left on device": errno.ENOSPC, "os_error_code='28'": errno.ENOSPC,
                  "disk quota exceeded": errno.EDQUOT, "permission denied": errno.EACCES,
                  "read-only file system": errno.EROFS}


def _storage_errno(e: BaseException) -> int | None:
  """The storage errno behind `e` (or its causes), if a failed write is what it is."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, OSError) and e.errno in _STORAGE_ERRNOS:
      return e.errno
    text = str(e).lower()
    for needle, code in _STORAGE_TEXTS.items():
      if needle in text:
        return code
    e = e.__cause__ or e.__context__
  return None


class QuietBackgroundStorageErrors(logging.Filter):
  """Drops library log records whose exception is a failed storage write.

  When the disk fills during an orbax save, each background write task fails and asyncio
  ("exception was never retrieved") and orbax (through absl: the commit, metadata and
  finalize threads) log every one at ERROR with its traceback: 585 lines for the test's
  2.4 MiB work dir. The trainer reports the storage error once itself
  (`workdir_write_error`, the CLI's one line). Records with any other exception pass.
  """

  def filter(self, record: logging.LogRecord) -> bool:
    global _storage_failure_seen
    exc = record.exc_info[1] if record.exc_info else None
    if exc is None:
      return True
    if _storage_errno(exc) is not None:
      _storage_failure_seen = True
      return False
    # After a failed save, orbax's asyncio.run shuts its loop's executor down while a metadata
    # write task is still pending; the task then fails to schedule its thread, and asyncio logs
    # it ("Task exception was never retrieved") when the task is collected: a race, seen once in
    # a fresh-clone CI run of the full-disk test. Only after a storage failure: before one, this
    # error is a real problem.
    return not (_storage_failure_seen and is_submit_after_shutdown(exc))


_QUIET_LOGGERS = ("asyncio", "absl")
_storage_failure_seen = False  # set once a write to the work dir failed with a storage errno


def is_submit_after_shutdown(exc: BaseException) -> bool:
  """Whether `exc` is a thread pool refusing work because it was shut down (raised by concurrent.futures)."""
  if not isinstance(exc, RuntimeError) or str(exc) != "cannot schedule new futures after shutdown":
    return False
  return _raised_in(exc.__traceback__, "concurrent/futures/thread.py")


def _raised_in(tb, file_pattern: str) -> bool:
  """Whether the innermost frame of traceback `tb` is in a file matching `file_pattern`."""
  while tb is not None and tb.tb_next is not None:
    tb = tb.tb_next
  return tb is not None and pathlib.PurePath(tb.tb_frame.f_code.co_filename).match(file_pattern)


def is_callback_into_closed_loop(unraisable) -> bool:
  """Whether a `sys.unraisablehook` call is native code calling back into a closed asyncio loop.

  When a save fails, orbax's `asyncio.run` cancels its tasks and closes its loop while
  tensorstore's writes are still in flight; as each one finishes, tensorstore's C++ calls
  `loop.call_soon_threadsafe` on the closed loop and reports the RuntimeError as
  unraisable, with no object: a bare traceback on stderr for every abandoned write
  (26 to 53 in the full-disk test, in about one run of three; a race).
  """
  exc, tb = unraisable.exc_value, unraisable.exc_traceback
  if unraisable.object is not None or not isinstance(exc, RuntimeError) or str(exc) != "Event loop is closed":
    return False
  # asyncio raises this message only from BaseEventLoop._check_closed.
  return _raised_in(tb, "asyncio/base_events.py")


class _QuietClosedLoopCallbacks:
  """A `sys.unraisablehook` that drops (and counts) callbacks into closed loops; passes the rest on."""

  def __init__(self, previous):
    self.previous = previous
    self.dropped = 0

  def __call__(self, unraisable) -> None:
    if is_callback_into_closed_loop(unraisable):
      self.dropped += 1
      return
    self.previous(unraisable)


def quiet_background_storage_errors() -> None:
  """Quiets what a failed background save leaves behind (once per process).

  QuietBackgroundStorageErrors on the asyncio and absl loggers, and an unraisable hook
  that drops tensorstore's callbacks into orbax's closed event loop.
  """
  for name in _QUIET_LOGGERS:
    logger = logging.getLogger(name)
    if not any(isinstance(f, QuietBackgroundStorageErrors) for f in logger.filters):
      logger.addFilter(QuietBackgroundStorageErrors())
  if not isinstance(sys.unraisablehook, _QuietClosedLoopCallbacks):
    sys.unraisablehook = _QuietClosedLoopCallbacks(sys.unraisablehook)


def _committed_steps(workdir: epath.Path) -> list[int]:
  try:
    return sorted(int(p.name) for p in (workdir / native.CHECKPOINT_DIR).iterdir() if p.name.isdigit())
  except OSError:
    return []


def workdir_write_error(e: BaseException, workdir: epath.Path) -> WorkdirWriteError | None:
  """A one-line error naming the path, the reason and the free space, or None if `e` is no write failure."""
  global _storage_failure_seen
  code = _storage_errno(e)
  if code is None:
    return None
  _storage_failure_seen = True
  space = ""
  if not paths.is_remote(workdir):
    existing = pathlib.Path(os.fspath(workdir))
    while not existing.exists() and existing != existing.parent:
      existing = existing.parent
    usage = shutil.disk_usage(existing)
    space = f" ({_bytes(usage.free)} free of {_bytes(usage.total)} on its file system)"
  steps = _committed_steps(workdir)
  kept = (f"Committed checkpoints are intact (steps {steps}); free space or fix the permissions and rerun "
          f"the same command to resume from step {steps[-1]}." if steps else
          "No checkpoint was committed yet; free space or fix the permissions and rerun the same command.")
  err = WorkdirWriteError(f"Cannot write to the work dir {workdir}: {_STORAGE_ERRNOS[code]}{space}. {kept}")
  err.errno = code  # set after: OSError(code, msg) would print as "[Errno 28] ..." on the CLI's one line
  return err


def _bytes(n: int) -> str:
  for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
    if n < 1024 or unit == "TiB":
      return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
    n /= 1024
