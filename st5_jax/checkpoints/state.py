"""The training state on orbax: save, restore onto any mesh, fall back past corrupt checkpoints; the best one.

The trainer's `TrainState` (step, params, optimizer state) is saved as three items of
one orbax step (`params`, `opt_state`, `meta`: step, data-iterator position, seed, time,
and what the hooks keep). Restoring takes the abstract state and shardings of the run
that restores, so a checkpoint written on one mesh restores onto another. `BestSaver`
keeps the best evaluated parameters in WORKDIR/best, a model folder of its own.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from st5_jax import multihost, paths
from st5_jax.checkpoints import native
from st5_jax.configs import ST5Config

log = logging.getLogger(__name__)


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
  if multihost.is_lead():
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


class BestSaver:
  """Saves parameters to WORKDIR/best, a model folder of its own (config, vocabulary, one orbax step).

  Every process calls it (orbax saves together); the lead writes the config and vocabulary.
  Called as `saver(state, step, score)` by early stopping's BestKeeper.
  """

  def __init__(self, workdir: paths.PathLike, model_config: ST5Config, vocab_file: str):
    self.directory = paths.join(workdir, native.BEST_DIR)
    self.model_config, self.vocab_file = model_config, vocab_file
    self._mngr = None

  def __call__(self, state, step: int, score: float) -> None:
    if self._mngr is None:
      if multihost.is_lead():
        native.write_config(self.directory, self.model_config)
        native.copy_vocab(self.directory, self.vocab_file)
      self._mngr = native.checkpoint_manager(self.directory, max_to_keep=1)
    if step in self._mngr.all_steps():  # a resumed run re-evaluating a step it had kept: the same parameters
      return
    self._mngr.save(step, args=ocp.args.Composite(params=ocp.args.StandardSave(state.params),
                                                  meta=ocp.args.JsonSave({"step": step, "score": score})),
                    force=True)
    self._mngr.wait_until_finished()
