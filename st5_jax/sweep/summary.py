"""A sweep's summary: per arm and task over seeds (n, mean, sample std, min, max), the arm selected on a dev task.

`report` reads every run's record and writes OUT/results.json, summary.csv, summary.md and
summary.png; only finished runs count.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any, Sequence

import numpy as np

from st5_jax import paths
from st5_jax.evaluation.sets import SUITES
from st5_jax.sweep.definition import Run
from st5_jax.sweep.records import is_finished, read_record

STS_AVG = "STS-avg"  # the mean of the 7 STS tasks of one run, when all 7 are evaluated
CSV_COLUMNS = ("arm", "task", "n", "mean", "std", "min", "max", "selected", "role")


def run_values(record: dict | None, tasks: Sequence[str]) -> dict[str, float]:
  """{task: headline number} of a finished run's evaluation (+ STS-avg when all 7 STS tasks are there)."""
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
