"""A run's record: OUT/runs/<arm>/seed<S>/sweep_run.json, its key, what was trained and evaluated.

A run dir recorded with another key than the run's is refused, never reused; a record is
what both the driver (what is left to do) and the summary (what is finished) read.
"""

from __future__ import annotations

import json
from typing import Sequence

from st5_jax import paths
from st5_jax.sweep.definition import Run, SweepError

RUN_FILE = "sweep_run.json"


def read_record(run: Run) -> dict | None:
  """The run dir's sweep_run.json, or None for a new run; SweepError if it holds other bindings."""
  record_path = paths.join(run.dir, RUN_FILE)
  if not paths.exists(record_path):
    if paths.exists(paths.join(run.dir, "checkpoints")):
      raise SweepError(f"{run.dir} holds a training run that no sweep recorded ({RUN_FILE} is missing): "
                       "move it away or choose another --out")
    return None
  record = json.loads(paths.read_text(record_path))
  if record.get("key") != run.key:
    raise SweepError(f"{run.dir} holds a run of other bindings (key {record.get('key')}, "
                     f"{record.get('bindings')}) than {run.label} now (key {run.key}, {list(run.bindings)}); its "
                     f"results are not mixed with these: use another --out, rename the arm, or delete that folder")
  return record


def new_record(run: Run, gin_files: Sequence[str]) -> dict:
  return {"arm": run.arm, "seed": run.seed, "key": run.key, "gin_files": list(gin_files),
          "bindings": list(run.bindings), "config": run.config, "trained": None, "eval": None}


def write_record(run: Run, record: dict) -> None:
  paths.write_text(paths.join(run.dir, RUN_FILE), json.dumps(record, indent=1) + "\n")


def missing_tasks(record: dict | None, tasks: Sequence[str]) -> list[str]:
  done = ((record or {}).get("eval") or {}).get("tasks", {})
  return [t for t in tasks if t not in done]


def is_finished(record: dict | None, tasks: Sequence[str]) -> bool:
  """Trained to the end (or early-stopped) and evaluated on every task."""
  return bool(record and record.get("trained")) and not missing_tasks(record, tasks)
