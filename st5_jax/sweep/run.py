"""A sweep's driver: trains and evaluates the runs not finished yet, one after the other, then reports.

Each run is a `st5 train` work dir trained in this process and evaluated with `st5 eval`'s
harness; its record (records.py) says what is done, so a rerun resumes where a launch
stopped (--max_runs, SIGTERM, a crash).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Callable, Iterable, Sequence

import numpy as np

from st5_jax.sweep.definition import Run, parse_config
from st5_jax.sweep.records import is_finished, missing_tasks, new_record, read_record, write_record
from st5_jax.sweep.summary import report, run_values


def duration(seconds: float) -> str:
  """'1h02m', '3m05s', '42s'."""
  s = int(round(seconds))
  if s >= 3600:
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
  return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def train_run(run: Run, gin_files: Sequence[str], search_paths: Sequence[str], *, progress: bool):
  """`st5 train` of one run in this process: parse its gin config, train (or resume) in its dir."""
  from st5_jax import gin_config  # pylint: disable=g-import-not-at-top  (JAX)

  parse_config(gin_files, run.bindings, search_paths)
  return gin_config.train_from_gin(workdir=run.dir, progress=progress)


def evaluate_run(run_dir: str, tasks: Sequence[str], *, data_dir: str | None = None, kfold: int = 10,
                 batch_size: int = 64, checkpoint: str = "auto", prompts: Sequence[str] = ()) -> dict:
  """`st5 eval` of one work dir: the harness' output for `tasks`, with the model's prompts as `st5 eval` uses
  them (retrieval: encode_query / encode_document) and `prompts` (`st5 eval --prompt` rules) per task."""
  from st5_jax.encoder import SentenceEncoder  # pylint: disable=g-import-not-at-top  (JAX)
  from st5_jax.evaluation import evaluate, prompts as eval_prompts  # pylint: disable=g-import-not-at-top

  enc = SentenceEncoder.load(run_dir, checkpoint=checkpoint)
  model_prompts = dict(getattr(enc, "prompts", None) or {})
  extra = {}
  asymmetric = getattr(getattr(enc, "config", None), "asymmetric", False)
  if model_prompts or asymmetric:  # as `st5 eval`: a retrieval set's sides with their prompts (and towers)
    extra = {"encode_query": lambda texts: enc.encode_query(texts, batch_size=batch_size),
             "encode_document": lambda texts: enc.encode_document(texts, batch_size=batch_size)}
  if prompts:
    extra.update(task_prompts=eval_prompts.plan(eval_prompts.parse(prompts), list(tasks), model_prompts),
                 prompted=lambda text, side: lambda texts: enc.encode(
                     texts, batch_size=batch_size, prompt=text,
                     **({"task": side} if asymmetric and side in ("query", "document") else {})))
  return evaluate(lambda texts: enc.encode(texts, batch_size=batch_size), list(tasks), data_dir, kfold=kfold,
                  **extra)


@dataclasses.dataclass
class Outcome:
  """What one launch did: runs worked on, and the signal that stopped it (if any)."""

  done: list[str]
  interrupted_by: str | None = None
  stopped_early: bool = False
  report: dict | None = None


def run_sweep(runs: Sequence[Run], out: str, *, gin_files: Sequence[str], tasks: Sequence[str], seeds: int,
              search_paths: Sequence[str] = (), select: str | None = None, todo: Iterable[Run] | None = None,
              max_runs: int | None = None, progress: bool = False, definition: dict | None = None,
              eval_kwargs: dict | None = None, train_fn: Callable | None = None, eval_fn: Callable | None = None,
              log: Callable[[str], None] | None = None) -> Outcome:
  """Trains and evaluates the runs of `todo` (default: all) that are not finished, in order, then reports.

  Every run of the sweep is checked first (a run dir of other bindings: SweepError). A run
  that was trained but not evaluated on every task is only evaluated (missing tasks only);
  an interrupted one resumes from its checkpoint. SIGTERM/SIGINT during training: the trainer
  saves a checkpoint, and this returns with `interrupted_by` set (nothing else runs).
  """
  from st5_jax import multihost  # pylint: disable=g-import-not-at-top  (JAX)

  log = log or (lambda line: print(line, file=sys.stderr, flush=True))
  train_fn = train_fn or (lambda run: train_run(run, gin_files, search_paths, progress=progress))
  eval_fn = eval_fn or (lambda run_dir, names: evaluate_run(run_dir, names, **(eval_kwargs or {})))
  records = {r.dir: read_record(r) for r in runs}  # refuses a mismatched run dir before any work
  todo = list(runs if todo is None else todo)
  pending = [r for r in todo if not is_finished(records[r.dir], tasks)]
  finished_all = sum(is_finished(records[r.dir], tasks) for r in runs)
  log(f"sweep {out}: {len(runs)} runs ({len(set(r.arm for r in runs))} arms x {seeds} seeds), {finished_all} "
      f"finished; this launch: {len(pending)} to run of {len(todo)}")
  outcome = Outcome(done=[])
  times: list[float] = []
  for i, run in enumerate(pending):
    if max_runs is not None and len(outcome.done) >= max_runs:
      outcome.stopped_early = True
      log(f"sweep: stopping after {max_runs} run(s) (--max_runs); rerun the same command to continue")
      break
    t0 = time.perf_counter()
    record = records[run.dir] or new_record(run, gin_files)
    train_s = 0.0
    if not record.get("trained"):
      if multihost.is_lead():
        write_record(run, record)
      log(f"sweep: [{finished_all + 1}/{len(runs)}] {run.label} (key {run.key}): "
          f"{'resuming' if records[run.dir] else 'training'}")
      result = train_fn(run)
      train_s = time.perf_counter() - t0
      if result.interrupted_by:
        outcome.interrupted_by = result.interrupted_by
        log(f"sweep: {run.label} interrupted by {result.interrupted_by} at step {result.step} (checkpoint saved); "
            f"rerun the same command to resume")
        return outcome
      record["trained"] = {"step": int(result.step), "seconds": round(train_s, 1)}
      if multihost.is_lead():
        write_record(run, record)
    names = missing_tasks(record, tasks)
    t1 = time.perf_counter()
    if names:
      res = eval_fn(run.dir, names)
      ev = record.get("eval") or {"tasks": {}, "seconds": 0.0}
      ev["tasks"].update(res["tasks"])
      ev["seconds"] = round(ev.get("seconds", 0.0) + time.perf_counter() - t1, 1)
      record["eval"] = ev
      if multihost.is_lead():
        write_record(run, record)
    records[run.dir] = record
    dt = time.perf_counter() - t0
    times.append(dt)
    finished_all += 1
    outcome.done.append(run.label)
    left = len(pending) - i - 1
    if max_runs is not None:
      left = min(left, max_runs - len(outcome.done))
    values = run_values(record, tasks)
    shown = ", ".join(f"{t} {v:.2f}" for t, v in values.items())
    log(f"sweep: [{finished_all}/{len(runs)}] {run.label} done in {duration(dt)} (train {duration(train_s)}, "
        f"eval {duration(time.perf_counter() - t1)}): {shown} | this launch: {len(outcome.done)} done, {left} left, "
        f"{duration(float(np.mean(times)))}/run, ETA {duration(float(np.mean(times)) * left)}")
    if multihost.is_lead():
      report(out, runs, tasks, seeds=seeds, select=select, definition=definition, records=records)
  if multihost.is_lead():
    outcome.report = report(out, runs, tasks, seeds=seeds, select=select, definition=definition, records=records)
  return outcome
