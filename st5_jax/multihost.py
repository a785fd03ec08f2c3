"""Multi-process (multi-host) start-up."""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)


def maybe_initialize() -> None:
  """`jax.distributed.initialize()` when this process is one of several.

  On Cloud TPU VMs JAX discovers the coordinator itself (ST5_MULTIHOST=1, set by
  launch/tpu_run.sh on pod slices); elsewhere JAX_COORDINATOR_ADDRESS,
  JAX_NUM_PROCESSES and JAX_PROCESS_ID name it (the 2-process CPU test does this).
  """
  import jax

  if os.environ.get("JAX_COORDINATOR_ADDRESS") or os.environ.get("ST5_MULTIHOST") == "1":
    if os.environ.get("JAX_PLATFORMS", "").startswith("cpu"):
      # CPU processes reach each other's devices through gloo (tests, CPU clusters).
      jax.config.update("jax_cpu_collectives_implementation", "gloo")
  if os.environ.get("JAX_COORDINATOR_ADDRESS"):
    jax.distributed.initialize(coordinator_address=os.environ["JAX_COORDINATOR_ADDRESS"],
                               num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
                               process_id=int(os.environ["JAX_PROCESS_ID"]))
  elif os.environ.get("ST5_MULTIHOST") == "1":
    jax.distributed.initialize()
  else:
    return
  log.info("process %d of %d, %d local / %d global devices", jax.process_index(), jax.process_count(),
           jax.local_device_count(), jax.device_count())
