"""XLA_FLAGS for the tests' subprocesses: conftest's cheap compiles, with a device count of their own.

A subprocess given only `--xla_force_host_platform_device_count=N` compiles at full
optimisation with the MLIR fusion emitters, slower than the test process itself compiles
(figures in docs/testing.md, "Time").
"""

import os

DEVICE_FLAG = "--xla_force_host_platform_device_count="


def xla_flags(devices: int) -> str:
  """The test process's XLA_FLAGS (set by conftest) with `devices` fake CPU devices."""
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(DEVICE_FLAG)]
  return " ".join([*flags, f"{DEVICE_FLAG}{devices}"])
