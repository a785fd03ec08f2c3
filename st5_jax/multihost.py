"""Multi-process (multi-host) start-up and synchronisation; the preemption / Ctrl-C stop flag."""

from __future__ import annotations

import itertools
import logging
import os
import signal
from typing import Any, Callable

import jax
from jax.experimental import multihost_utils
from orbax.checkpoint import multihost as ocp_multihost

log = logging.getLogger(__name__)

_BARRIER_IDS = itertools.count()


def is_lead() -> bool:
  """The process that writes what is written once (configs, metrics, summaries): process 0."""
  return jax.process_index() == 0


def maybe_initialize() -> None:
  """`jax.distributed.initialize()` when this process is one of several.

  On Cloud TPU VMs JAX discovers the coordinator itself (ST5_MULTIHOST=1, set by
  launch/tpu_run.sh on pod slices); elsewhere JAX_COORDINATOR_ADDRESS,
  JAX_NUM_PROCESSES and JAX_PROCESS_ID name it (`launch/tpu_run.sh --local-pod N` and
  the multi-process tests do this).
  """
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


def barrier(name: str, *, timeout_s: int = 3600) -> None:
  """Every process waits here (a coordination-service barrier: no device collective)."""
  if jax.process_count() == 1:
    return
  ocp_multihost.get_barrier_sync_fn()(key=f"st5:{name}:{next(_BARRIER_IDS)}", timeout_ms=timeout_s * 1000)


def compile_together(fn: Any, *args, name: str) -> Callable:
  """The executable of jitted `fn` for `args`, compiled on every process before any runs it.

  Multi-process CPU runs (gloo) create a device group's communicator the first time a
  program uses it, and a peer that arrives more than 30 s later fails the run; compile
  times differ that much between processes on a loaded host. Compiling first and
  meeting at a barrier makes the first execution start together. Harmless elsewhere.
  """
  compiled = fn.lower(*args).compile()
  barrier(f"compiled:{name}")
  return compiled


class StopFlag:
  """Turns SIGTERM/SIGINT (TPU preemption, Ctrl-C) into a checkpoint and a clean exit.

  One process: Python signal handlers. Several processes must stop at the same step or
  the next collective hangs: JAX's preemption service (started by
  jax.distributed.initialize) catches SIGTERM on any host and the hosts agree on the
  step (`multihost_utils.reached_preemption_sync_point`, called at every step). A Python
  SIGTERM handler would replace the service's, so none is installed then.
  """

  def __init__(self):
    self.signum: int | None = None
    self._old = {}
    self._multi = jax.process_count() > 1

  def should_stop(self, step: int) -> bool:
    """Call once per step, with the same step on every process."""
    if self._multi and self.signum is None and multihost_utils.reached_preemption_sync_point(step):
      self.signum = signal.SIGTERM
      log.warning("Preemption notice (SIGTERM on some host): saving a checkpoint at step %d and exiting.", step)
    return self.signum is not None

  def __enter__(self):
    if self._multi:
      return self
    for sig in (signal.SIGTERM, signal.SIGINT):
      try:
        self._old[sig] = signal.signal(sig, self._handle)
      except ValueError:  # not the main thread: leave signals alone
        pass
    return self

  def _handle(self, signum, frame):
    del frame
    if self.signum is not None:  # second signal: stop now
      raise KeyboardInterrupt
    self.signum = signum
    log.warning("Received %s: will save a checkpoint after the current step and exit.", signal.Signals(signum).name)

  def __exit__(self, *exc):
    for sig, old in self._old.items():
      signal.signal(sig, old)
