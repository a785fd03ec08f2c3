"""`st5 train` with fault hooks, for the kill -9 tests and benchmarks/fault_probe.py.

ST5_FAULT_HANG=<step>:<phase> makes the save of checkpoint <step> stop at <phase>, write
<workdir>/FAULT_HANG (the signal to the harness) and sleep until killed:
  create  the step's tmp dir exists (orbax-checkpoint-tmp), no data written yet;
  commit  every item's data is in the tmp dir; the atomic rename to <step>/ has not happened.
The hang only delays the process at that instruction; SIGKILL runs no handler and flushes
nothing, so what is on disk at the kill is what a crash at that instruction leaves.
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


def main() -> int:
  import gin

  import synthetic
  from st5_jax import cli
  gin.external_configurable(synthetic.factory, "synthetic_factory")
  if os.environ.get("ST5_FAULT_HANG"):
    _install_hooks(os.environ["ST5_FAULT_HANG"])
  return cli.main(sys.argv[1:])


if __name__ == "__main__":
  sys.exit(main())
