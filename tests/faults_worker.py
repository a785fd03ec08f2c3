"""`st5 train` with fault hooks, for the kill -9 tests and benchmarks/fault_probe.py.

ST5_FAULT_HANG=<step>:<phase> makes the save of checkpoint <step> stop at <phase>, write
<workdir>/FAULT_HANG (the signal to the harness) and sleep until killed:
  create  the step's tmp dir exists (orbax-checkpoint-tmp), no data written yet;
  commit  every item's data is in the tmp dir; the atomic rename to <step>/ has not happened.
The hang only delays the process at that instruction; SIGKILL runs no handler and flushes
nothing, so what is on disk at the kill is what a crash at that instruction leaves.

ST5_FAULT_PEER_HANG=<step> (multi-process runs): see `_install_peer_hooks`.
"""

import os
import pathlib
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _install_hooks(spec: str) -> None:
  from orbax.checkpoint._src.path import atomicity

  step, phase = spec.split(":")
  cls = atomicity.AtomicRenameTemporaryPath

  def is_target(tmp) -> bool:
    final = pathlib.Path(os.fspath(tmp.get_final()))
    return final.name == step and final.parent.name == "checkpoints"

  def hang(tmp) -> None:
    final = pathlib.Path(os.fspath(tmp.get_final()))
    (final.parent.parent / "FAULT_HANG").write_text(f"{phase} {os.fspath(tmp.get())}\n")
    while True:
      time.sleep(60)

  orig = getattr(cls, "create" if phase == "create" else "finalize")

  async def hooked(self, *a, **kw):
    if phase == "create":
      out = await orig(self, *a, **kw)
      if is_target(self):
        hang(self)
      return out
    if is_target(self):
      hang(self)
    return await orig(self, *a, **kw)

  setattr(cls, "create" if phase == "create" else "finalize", hooked)


def _install_peer_hooks(step: str) -> None:
  """Multi-process: at checkpoint <step>, process 1 stops before reporting its part written.

  Orbax's async save: each process waits for its own writes (commit futures), then all meet
  at the `async_write_complete` barrier, then process 0 finalizes (metadata, rename). Here
  process 1's background save thread writes <workdir>/FAULT_P1_HANG and sleeps before it
  waits for its writes or reaches the barrier; process 0 writes <workdir>/FAULT_P0_WRITTEN
  when its own writes are done and it enters the barrier (where it then waits for process 1).
  """
  import jax
  from orbax.checkpoint._src.checkpointers import async_checkpointer

  orig = async_checkpointer._background_wait_for_commit_futures  # pylint: disable=protected-access

  def hooked(directory, commit_futures, on_commit_callback, *, sync_fn, **kw):
    final = pathlib.Path(os.fspath(directory))
    if final.name != step or final.parent.name != "checkpoints":
      return orig(directory, commit_futures, on_commit_callback, sync_fn=sync_fn, **kw)
    workdir = final.parent.parent
    if jax.process_index() == 1:
      (workdir / "FAULT_P1_HANG").write_text(f"{final}\n")
      while True:
        time.sleep(60)

    def marked_sync(key, timeout_ms):
      if "async_write_complete" in key:
        (workdir / "FAULT_P0_WRITTEN").write_text(f"{key}\n")
      return sync_fn(key, timeout_ms)

    return orig(directory, commit_futures, on_commit_callback, sync_fn=marked_sync, **kw)

  async_checkpointer._background_wait_for_commit_futures = hooked  # pylint: disable=protected-access


def main() -> int:
  import gin

  import synthetic
  from st5_jax import cli
  gin.external_configurable(synthetic.factory, "synthetic_factory")
  if os.environ.get("ST5_FAULT_HANG"):
    _install_hooks(os.environ["ST5_FAULT_HANG"])
  if os.environ.get("ST5_FAULT_PEER_HANG"):
    _install_peer_hooks(os.environ["ST5_FAULT_PEER_HANG"])
  return cli.main(sys.argv[1:])


if __name__ == "__main__":
  sys.exit(main())
