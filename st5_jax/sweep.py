"""Sweeps: arms (sets of gin bindings) x seeds, each a `st5 train` work dir, evaluated and summarised.

  runs = plan(["st5_tiny_cpu.gin"], flag_bindings, expand(arms, grids), seeds=[0, 1, 2], out="sweeps/pool")
  run_sweep(runs, out, tasks=["STSBenchmarkDev", "STS12"], select="STSBenchmarkDev")

A run's bindings, in the order gin applies them (a later one wins): the gin files, the
`--gin.K=V` flags, the arm's bindings (arms file), the grid's bindings, then
`TrainConfig.seed = S`. Its key is a hash of the whole parsed config (gin.config_str():
every binding of the files, includes expanded, and of the flags); the run dir
OUT/runs/<arm>/seed<S> records it in sweep_run.json, and a run dir recorded with another
key is refused, never reused. The command: st5_jax/commands/sweep.py; docs/sweep.md.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import itertools
import json
import re
import sys
import time
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from st5_jax import paths

SEED_BINDING = "TrainConfig.seed"
RUN_FILE = "sweep_run.json"
STS_AVG = "STS-avg"  # the mean of the 7 STS tasks of one run, when all 7 are evaluated
CSV_COLUMNS = ("arm", "task", "n", "mean", "std", "min", "max", "selected", "role")
_NAME_OK = re.compile(r"[^A-Za-z0-9._=+-]")  # no commas: --only takes a comma-separated list


class SweepError(ValueError):
  """A sweep definition or output folder this command refuses (one line from the CLI)."""


@dataclasses.dataclass(frozen=True)
class Arm:
  """A named set of gin bindings (applied after the base files and flags)."""

  name: str
  bindings: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Run:
  """One arm at one seed: its work dir and the key of its parsed gin config."""

  arm: str
  seed: int
  bindings: tuple[str, ...]  # every binding after the gin files: flags, arm, grid, seed
  dir: str
  key: str
  config: str  # gin.config_str() of the parsed files and bindings

  @property
  def label(self) -> str:
    return f"{self.arm}/seed{self.seed}"


# ------------------------------------------------------------------------------ definition


def split_values(text: str) -> list[str]:
  """'a,b' -> ['a', 'b'], but commas inside quotes or brackets stay: "{'x': 1, 'y': 2},'p,q'" is 2 values."""
  out, depth, quote, start = [], 0, None, 0
  for i, ch in enumerate(text):
    if quote:
      if ch == quote:
        quote = None
    elif ch in "'\"":
      quote = ch
    elif ch in "([{":
      depth += 1
    elif ch in ")]}":
      depth -= 1
    elif ch == "," and depth == 0:
      out.append(text[start:i].strip())
      start = i + 1
  out.append(text[start:].strip())
  if quote or depth or any(not v for v in out):
    raise SweepError(f"cannot split {text!r} into values (an empty value, an open quote or bracket)")
  return out


def parse_grid(spec: str) -> tuple[str, list[str]]:
  """'KEY=V1,V2' -> ('KEY', ['V1', 'V2']) (values in gin syntax: strings quoted)."""
  key, eq, values = spec.partition("=")
  key = key.strip()
  if not eq or not key or not values.strip():
    raise SweepError(f"--grid {spec!r}: expected KEY=V1,V2,... (e.g. st5_model.pooling=\"'enc_first','enc_mean'\")")
  return key, split_values(values)


def parse_arms(text: str, source: str = "arms file") -> list[Arm]:
  """An arms file: `[name]` starts an arm, each further line is a gin statement of it.

  Lines starting with `#` are comments; an indented line continues the statement above
  (a dict over several lines). A statement may be a binding, `include 'f.gin'` or `import m`.
  """
  arms: list[Arm] = []
  name, lines = None, []

  def close():
    if name is not None:
      arms.append(Arm(name, tuple(lines)))

  for number, raw in enumerate(text.splitlines(), 1):
    line = raw.rstrip()
    if not line.strip() or line.lstrip().startswith("#"):
      continue
    m = re.fullmatch(r"\[(.+)\]", line.strip())
    if m:
      close()
      name, lines = m.group(1).strip(), []
    elif name is None:
      raise SweepError(f"{source}:{number}: {line.strip()!r} comes before the first [arm name]")
    elif raw[:1].isspace() and lines:
      lines[-1] += " " + line.strip()
    else:
      lines.append(line.strip())
  close()
  if not arms:
    raise SweepError(f"{source}: no arms (an arm starts with a line `[name]`)")
  return arms


def _short(key: str, value: str) -> str:
  """A name part for a grid value: 'st5_model.pooling', "'enc_first'" -> 'pooling=enc_first'."""
  return f"{key.rsplit('.', 1)[-1]}={value.strip(chr(39) + chr(34))}"


def safe_name(name: str) -> str:
  """An arm name usable as a folder name (other characters become _)."""
  return _NAME_OK.sub("_", name)


def expand(arms: Sequence[Arm] | None, grids: Sequence[tuple[str, list[str]]] = ()) -> list[Arm]:
  """Every arm x every point of the grids' product; an arm's bindings come before the grid's.

  Names: the arm's, then `key=value` per grid key (last part of the key), joined by '+'.
  Without arms there is one unnamed arm; without either, one arm 'base'.
  """
  arms = list(arms) if arms else [Arm("", ())]
  out = []
  for arm in arms:
    for point in itertools.product(*[[(k, v) for v in values] for k, values in grids]):
      parts = [arm.name] if arm.name else []
      parts += [_short(k, v) for k, v in point]
      name = safe_name("+".join(parts) or "base")
      out.append(Arm(name, arm.bindings + tuple(f"{k}={v}" for k, v in point)))
  names = [a.name for a in out]
  dupes = sorted({n for n in names if names.count(n) > 1})
  if dupes:
    raise SweepError(f"arm names are not unique: {dupes}")
  return out


def _binds_seed(binding: str) -> bool:
  return re.match(rf"\s*(?:[\w./]*/)?{re.escape(SEED_BINDING)}\s*=", binding) is not None


def run_bindings(flag_bindings: Sequence[str], arm: Arm, seed: int) -> list[str]:
  """The bindings of one run after the gin files: flags, arm (and grid), seed; `{seed}` is replaced."""
  for b in (*flag_bindings, *arm.bindings):
    if _binds_seed(b):
      raise SweepError(f"{b!r}: the sweep binds {SEED_BINDING} itself (--seeds); remove that binding")
  return [b.replace("{seed}", str(seed)) for b in (*flag_bindings, *arm.bindings)] + [f"{SEED_BINDING} = {seed}"]


def config_key(config: str) -> str:
  """The run key: 12 hex digits of the SHA-256 of the parsed gin config."""
  return hashlib.sha256(config.encode("utf-8")).hexdigest()[:12]


def parse_config(gin_files: Sequence[str], bindings: Sequence[str], search_paths: Sequence[str] = ()) -> str:
  """Parses as `st5 train` does; returns gin.config_str() (the config the key hashes)."""
  import gin  # pylint: disable=g-import-not-at-top  (JAX, via gin_config)

  from st5_jax.commands import train as train_cmd  # pylint: disable=g-import-not-at-top

  train_cmd.parse_gin(list(gin_files), list(bindings), list(search_paths))
  return gin.config_str()


def plan(gin_files: Sequence[str], flag_bindings: Sequence[str], arms: Sequence[Arm], seeds: Sequence[int],
         out: str, search_paths: Sequence[str] = ()) -> list[Run]:
  """Every arm x seed as a Run (arm-major); parses each run's gin config (a typo fails here, before any run)."""
  runs = []
  for arm in arms:
    for seed in seeds:
      bindings = run_bindings(flag_bindings, arm, seed)
      config = parse_config(gin_files, bindings, search_paths)
      runs.append(Run(arm=arm.name, seed=seed, bindings=tuple(bindings),
                      dir=paths.join(out, "runs", arm.name, f"seed{seed}"), key=config_key(config), config=config))
  return runs


# ------------------------------------------------------------------------------ run records


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


# ------------------------------------------------------------------------------ aggregate


def run_values(record: dict | None, tasks: Sequence[str]) -> dict[str, float]:
  """{task: headline number} of a finished run's evaluation (+ STS-avg when all 7 STS tasks are there)."""
  from st5_jax.evaluation.harness import SUITES  # pylint: disable=g-import-not-at-top  (scikit-learn)

  results = ((record or {}).get("eval") or {}).get("tasks", {})
  values = {t: float(results[t]["main"]) for t in tasks if t in results and results[t].get("main") is not None}
  sts = SUITES["sts"]
  if all(t in values for t in sts):
    values[STS_AVG] = float(np.mean([values[t] for t in sts]))
  return values


def stats(values: Sequence[float]) -> dict[str, Any]:
  """n, mean, std (sample, ddof=1; None for one value), min, max of one arm's per-seed values."""
  v = np.asarray(values, np.float64)  # [n]
  if v.size == 0:
    return {"n": 0, "mean": None, "std": None, "min": None, "max": None}
  return {"n": int(v.size), "mean": float(v.mean()), "std": float(v.std(ddof=1)) if v.size > 1 else None,
          "min": float(v.min()), "max": float(v.max())}


def aggregate(per_run: Sequence[tuple[str, dict[str, float]]], arms: Sequence[str],
              tasks: Sequence[str]) -> list[dict[str, Any]]:
  """Rows {arm, task, n, mean, std, min, max}, arm-major, from (arm, {task: value}) of finished runs."""
  rows = []
  for arm in arms:
    for task in tasks:
      vals = [v[task] for a, v in per_run if a == arm and task in v]
      rows.append({"arm": arm, "task": task, **stats(vals)})
  return rows


def select_arm(rows: Sequence[dict], metric: str) -> str | None:
  """The arm with the highest mean of `metric` (the first of equals); None when no arm has one."""
  best = None
  for r in rows:
    if r["task"] == metric and r["mean"] is not None and (best is None or r["mean"] > best["mean"]):
      best = r
  return best["arm"] if best else None


def mark_selection(rows: Sequence[dict], selected: str | None, metric: str | None) -> None:
  """Adds `selected` (the arm chosen on `metric`) and `role` (select / test, on that arm's rows)."""
  for r in rows:
    r["selected"] = selected is not None and r["arm"] == selected
    r["role"] = ("select" if r["task"] == metric else "test") if r["selected"] else ""


# ------------------------------------------------------------------------------ report


def _num(v, digits: int = 4) -> str:
  return "" if v is None else f"{v:.{digits}f}"


def summary_csv(rows: Sequence[dict]) -> str:
  buf = io.StringIO()
  w = csv.writer(buf, lineterminator="\n")
  w.writerow(CSV_COLUMNS)
  for r in rows:
    w.writerow([r["arm"], r["task"], r["n"], _num(r["mean"]), _num(r["std"]), _num(r["min"]), _num(r["max"]),
                int(r["selected"]), r["role"]])
  return buf.getvalue()


def _cell(r: dict, n_arm: int) -> str:
  """'mean ± std (min–max)', with [n=k] when fewer runs than the arm's have this number."""
  if not r["n"]:
    return "-"
  std = "-" if r["std"] is None else f"{r['std']:.2f}"
  cell = f"{r['mean']:.2f} ± {std} ({r['min']:.2f}–{r['max']:.2f})" + (f" [n={r['n']}]" if r["n"] < n_arm else "")
  if r["role"] == "test":
    return f"**{cell}** †"
  if r["role"] == "select":
    return f"{cell} (sel.)"
  return cell


def markdown(rows: Sequence[dict], arms: Sequence[str], tasks: Sequence[str], *, seeds: int,
             select: str | None, selected: str | None, runs: Sequence[dict], title: str = "Sweep") -> str:
  """Mean ± std (min–max) over seeds per arm and task, then every run's numbers."""
  by = {(r["arm"], r["task"]): r for r in rows}
  lines = [f"# {title}", "",
           f"Mean ± sample std (ddof=1) (min–max) over seeds; headline numbers x100 (Spearman x100 for STS). "
           f"{seeds} seed(s) per arm; n = finished runs.", ""]
  if select:
    lines += [f"Selection: the arm with the highest mean {select} is **{selected or 'none yet'}**; "
              f"**bold †** marks its test figures, (sel.) the selection metric.", ""]
  lines += ["| arm | n | " + " | ".join(tasks) + " |", "|---|---:|" + "---:|" * len(tasks)]
  for arm in arms:
    n = max(by[(arm, t)]["n"] for t in tasks) if tasks else 0
    name = f"**{arm}**" if arm == selected else arm
    lines.append(f"| {name} | {n}/{seeds} | " + " | ".join(_cell(by[(arm, t)], n) for t in tasks) + " |")
  lines += ["", "## Runs", "", "| arm | seed | key | " + " | ".join(tasks) + " |",
            "|---|---:|---|" + "---:|" * len(tasks)]
  for r in runs:
    vals = r.get("values") or {}
    lines.append(f"| {r['arm']} | {r['seed']} | `{r['key']}` | " + " | ".join(
        _num(vals.get(t), 2) or r["status"] for t in tasks) + " |")
  return "\n".join(lines) + "\n"


def plot(rows: Sequence[dict], per_run: Sequence[tuple[str, dict[str, float]]], arms: Sequence[str],
         tasks: Sequence[str], *, selected: str | None = None, title: str = "") -> bytes | None:
  """PNG bytes: per-task horizontal bars (mean over seeds), error bars ± std, each seed a dot."""
  import matplotlib  # pylint: disable=g-import-not-at-top  (as st5_jax/evaluation/report.py: Agg, here)
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  if not arms or not tasks or not any(r["n"] for r in rows):
    return None
  by = {(r["arm"], r["task"]): r for r in rows}
  fig, ax = plt.subplots(figsize=(8, 0.45 * (len(tasks) * max(1, len(arms) ** 0.5) + 3)))
  colors = plt.get_cmap("tab10")
  bar = 0.8 / len(arms)
  for m, arm in enumerate(arms):
    y = np.arange(len(tasks)) + (m - (len(arms) - 1) / 2) * bar  # [T]
    mean = np.array([np.nan if by[(arm, t)]["mean"] is None else by[(arm, t)]["mean"] for t in tasks])  # [T]
    std = np.array([by[(arm, t)]["std"] or 0.0 for t in tasks])  # [T]
    label = arm + (" (selected)" if arm == selected else "")
    ax.barh(y, mean, height=bar, xerr=std, color=colors(m % 10), label=label, capsize=2,
            error_kw={"elinewidth": 0.8})
    for ti, t in enumerate(tasks):
      seeds = [v[t] for a, v in per_run if a == arm and t in v]
      ax.plot(seeds, [y[ti]] * len(seeds), "o", color="black", markersize=2.5)
      if np.isfinite(mean[ti]):
        ax.text(mean[ti] + std[ti], y[ti], f" {mean[ti]:.1f}", va="center", fontsize=7)
  ax.set_yticks(np.arange(len(tasks)), list(tasks))
  ax.invert_yaxis()
  lo = min([0.0] + [r["min"] for r in rows if r["min"] is not None])
  ax.set_xlim(lo - 5, 105)
  ax.grid(axis="x", alpha=0.3)
  ax.set_xlabel("score x100: mean over seeds, bar ± sample std, dots = seeds")
  if title:
    ax.set_title(title, loc="left", fontsize=10)
  ax.legend(loc="lower right", fontsize=8)
  fig.tight_layout()
  buf = io.BytesIO()
  fig.savefig(buf, format="png", dpi=120)
  plt.close(fig)
  return buf.getvalue()


def report(out: str, runs: Sequence[Run], tasks: Sequence[str], *, seeds: int, select: str | None = None,
           definition: dict | None = None, records: dict[str, dict | None] | None = None) -> dict:
  """Reads every run dir of the sweep and writes OUT/results.json, summary.csv, summary.md, summary.png.

  Only finished runs count; each file is written whole (temp file + rename), so launches
  that share OUT (arms on separate slices) never leave a torn or partial-of-one-launch file.
  """
  if records is None:
    records = {r.dir: read_record(r) for r in runs}
  arms = list(dict.fromkeys(r.arm for r in runs))
  per_run, run_rows = [], []
  for r in runs:
    rec = records.get(r.dir)
    finished = is_finished(rec, tasks)
    values = run_values(rec, tasks) if finished else {}
    if finished:
      per_run.append((r.arm, values))
    status = "finished" if finished else ("trained" if rec and rec.get("trained") else
                                          ("started" if rec else "missing"))
    run_rows.append({"arm": r.arm, "seed": r.seed, "key": r.key, "dir": r.dir, "status": status, "values": values,
                     "train_seconds": ((rec or {}).get("trained") or {}).get("seconds"),
                     "eval_seconds": ((rec or {}).get("eval") or {}).get("seconds")})
  columns = list(tasks) + ([STS_AVG] if any(STS_AVG in v for _, v in per_run) else [])
  rows = aggregate(per_run, arms, columns)
  selected = select_arm(rows, select) if select else None
  mark_selection(rows, selected, select)
  finished = sum(r["status"] == "finished" for r in run_rows)
  paths.write_text(paths.join(out, "summary.csv"), summary_csv(rows))
  md = markdown(rows, arms, columns, seeds=seeds, select=select, selected=selected, runs=run_rows)
  paths.write_text(paths.join(out, "summary.md"), md)
  png = plot(rows, per_run, arms, columns, selected=selected,
             title=f"{finished}/{len(runs)} runs" + (f"; selected on {select}: {selected}" if select else ""))
  if png is not None:
    paths.write_bytes(paths.join(out, "summary.png"), png)
  payload = {"sweep": definition or {}, "tasks": list(tasks), "select": select, "selected": selected,
             "finished": finished, "total": len(runs), "summary": rows, "runs": run_rows}
  paths.write_text(paths.join(out, "results.json"), json.dumps(payload, indent=1) + "\n")
  return {"rows": rows, "selected": selected, "markdown": md, "finished": finished}


# ------------------------------------------------------------------------------ running


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
                 batch_size: int = 64, checkpoint: str = "auto") -> dict:
  """`st5 eval` of one work dir: the harness' output for `tasks`."""
  from st5_jax.encoder import SentenceEncoder  # pylint: disable=g-import-not-at-top  (JAX)
  from st5_jax.evaluation import evaluate  # pylint: disable=g-import-not-at-top

  enc = SentenceEncoder.load(run_dir, checkpoint=checkpoint)
  return evaluate(lambda texts: enc.encode(texts, batch_size=batch_size), list(tasks), data_dir, kfold=kfold)


def _lead() -> bool:
  import jax  # pylint: disable=g-import-not-at-top
  return jax.process_index() == 0


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
      if _lead():
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
      if _lead():
        write_record(run, record)
    names = missing_tasks(record, tasks)
    t1 = time.perf_counter()
    if names:
      res = eval_fn(run.dir, names)
      ev = record.get("eval") or {"tasks": {}, "seconds": 0.0}
      ev["tasks"].update(res["tasks"])
      ev["seconds"] = round(ev.get("seconds", 0.0) + time.perf_counter() - t1, 1)
      record["eval"] = ev
      if _lead():
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
    if _lead():
      report(out, runs, tasks, seeds=seeds, select=select, definition=definition, records=records)
  if _lead():
    outcome.report = report(out, runs, tasks, seeds=seeds, select=select, definition=definition, records=records)
  return outcome
