"""The training state on orbax: save, restore onto any mesh, and fall back past corrupt checkpoints.

The trainer's `TrainState` (step, params, optimizer state) is saved as three items of
one orbax step (`params`, `opt_state`, `meta`: step, data-iterator position, seed, time).
Restoring takes the abstract state and shardings of the run that restores, so a
checkpoint written on one mesh restores onto another.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from st5_jax import multihost, paths

log = logging.getLogger(__name__)


def _is_lead() -> bool:
  return jax.process_index() == 0


def _abstract_with_shardings(abstract: Any, shardings: Any) -> Any:
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)


def restore_state(mngr, step: int, setup) -> tuple[Any, dict[str, Any]]:
  """Restores a checkpoint onto this run's mesh (which may differ from the one that saved it).

  `setup`: the trainer's Setup (abstract_state, state_shardings).
  """
  target_params = _abstract_with_shardings(setup.abstract_state.params, setup.state_shardings.params)
  target_opt = _abstract_with_shardings(setup.abstract_state.opt_state, setup.state_shardings.opt_state)
  restored = mngr.restore(step, args=ocp.args.Composite(params=ocp.args.StandardRestore(target_params),
                                                        opt_state=ocp.args.StandardRestore(target_opt),
                                                        meta=ocp.args.JsonRestore()))
  meta = restored["meta"]
  step_arr = jax.device_put(jnp.asarray(meta["step"], jnp.int32), setup.state_shardings.step)
  return setup.abstract_state.replace(step=step_arr, params=restored["params"], opt_state=restored["opt_state"]), meta


def restore_latest_good(mngr, setup) -> tuple[Any, dict[str, Any]] | None:
  """Restores the newest checkpoint that reads back; skips (and reports) corrupt ones.

  Corrupt steps newer than the one restored are moved aside (`corrupt-<step>-<time>`,
  which orbax does not list): left in place, orbax would refuse to save any step at or
  below them, and every later load would pick them first.
  """
  bad: list[int] = []
  for step in sorted(mngr.all_steps(), reverse=True):
    try:
      restored = restore_state(mngr, step, setup)
    except Exception as e:  # noqa: BLE001  (any unreadable checkpoint: fall back to an older one)
      log.error("Checkpoint at step %d in %s cannot be restored (%s: %s); trying the previous one.",
                step, mngr.directory, type(e).__name__, str(e)[:300])
      bad.append(step)
      continue
    if bad:
      _move_aside(mngr, bad)
    return restored
  if mngr.all_steps():
    raise RuntimeError(f"No checkpoint in {mngr.directory} can be restored (steps {mngr.all_steps()}); "
                       "move the directory away to start over.")
  return None


def _move_aside(mngr, steps: list[int]) -> None:
  """Renames unreadable step dirs out of orbax's listing (lead process), then re-lists on all."""
  if _is_lead():
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for step in steps:
      src = paths.path(mngr.directory) / str(step)
      dst = paths.path(mngr.directory) / f"corrupt-{step}-{stamp}"
      src.rename(dst)
      log.error("Moved the unreadable checkpoint %s aside to %s.", src, dst)
  multihost.barrier("st5_move_corrupt_checkpoints")
  mngr.reload()


def save_state(mngr, state, meta: dict[str, Any], *, force: bool = False) -> None:
  mngr.save(int(meta["step"]), args=ocp.args.Composite(params=ocp.args.StandardSave(state.params),
                                                       opt_state=ocp.args.StandardSave(state.opt_state),
                                                       meta=ocp.args.JsonSave(meta)), force=force)
