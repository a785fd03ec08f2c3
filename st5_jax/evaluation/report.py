"""Results of one or several models as JSON, a markdown table and PNG plots.

A results file is {"models": {name: evaluate(...) output, plus "source"}}; a bare
`evaluate` output (one model) is accepted wherever a results file is read.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import tempfile
from typing import Mapping

import numpy as np

from st5_jax import paths
from st5_jax.evaluation.harness import TASKS

_SUITE_TITLES = {"sts": "STS", "transfer": "SentEval transfer", "sentglue": "SentGLUE", "dev": "Dev"}
_METRIC_NAMES = {
    "spearman_all": "Spearman x100, all pairs", "acc": "accuracy", "mcc": "Matthews corr. x100",
    "mean(acc,f1)": "mean of acc and F1", "mean(pearson,spearman)": "mean of Pearson and Spearman x100",
}


def _jsonable(x):
  if isinstance(x, Mapping):
    return {str(k): _jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_jsonable(v) for v in x]
  if isinstance(x, np.ndarray):
    return _jsonable(x.tolist())
  if isinstance(x, (np.bool_, bool)):
    return bool(x)
  if isinstance(x, np.integer):
    return int(x)
  if isinstance(x, (np.floating, float)):
    return None if not math.isfinite(float(x)) else float(x)
  return x


def write_json(path: str | os.PathLike, payload: dict) -> None:
  paths.write_text(path, json.dumps(_jsonable(payload), indent=1, sort_keys=False) + "\n")


def load_results(path: str | os.PathLike) -> dict[str, dict]:
  """{model name: results} from a results file (several models) or one `evaluate` output."""
  payload = json.loads(paths.read_text(path))
  if "models" in payload:
    return dict(payload["models"])
  if "tasks" in payload:
    return {pathlib.Path(path).stem: payload}
  raise ValueError(f"{path} is not a results file (no 'models' or 'tasks' key)")


def _fmt(v, digits: int = 2) -> str:
  return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.{digits}f}"


def _task_names(models: Mapping[str, dict]) -> list[str]:
  """Registered tasks in registry order, then any others (BEIR folders) in the order they ran."""
  present = list(dict.fromkeys(t for r in models.values() for t in r.get("tasks", {})))
  return [t for t in TASKS if t in present] + [t for t in present if t not in TASKS]


def _suite(models: Mapping[str, dict], task: str) -> str:
  if task in TASKS:
    return TASKS[task].suite
  return next((r["tasks"][task].get("suite") for r in models.values() if task in r.get("tasks", {})), "")


# The retrieval table's measures (fractions in [0, 1]; every measure is in results.json).
RETRIEVAL_COLUMNS = ("MRR@10", "nDCG@10", "Recall@100", "Accuracy@20")


def _retrieval_lines(models: Mapping[str, dict], tasks: list[str]) -> list[str]:
  rows = [t for t in tasks if "MRR@10" in next((r["tasks"][t] for r in models.values() if t in r.get("tasks", {})),
                                                {})]
  if not rows:
    return []
  lines = ["", "## Retrieval (exact search over each task's corpus; fractions in [0, 1])", "",
           "| Task | Model | queries | documents | " + " | ".join(RETRIEVAL_COLUMNS) + " |",
           "|---|---|---:|---:|" + "---:|" * len(RETRIEVAL_COLUMNS)]
  for t in rows:
    for name, r in models.items():
      res = r.get("tasks", {}).get(t)
      if res is None:
        continue
      lines.append(f"| {t} | {name} | {res.get('n_queries', '-')} | {res.get('n_documents', '-')} | "
                   + " | ".join(_fmt(res.get(c), 3) for c in RETRIEVAL_COLUMNS) + " |")
  return lines


def markdown(models: Mapping[str, dict], *, title: str = "Evaluation results") -> str:
  """Side-by-side tables: headline per task and suite means, then details and timings."""
  names = list(models)
  tasks = _task_names(models)
  head = "| Task | Metric | " + " | ".join(names) + " |\n|---|---|" + "---:|" * len(names) + "\n"
  lines = [f"# {title}\n", "Headline numbers (x100). Files and settings: docs/evaluation.md.\n", head.rstrip("\n")]
  for suite in ("sts", "transfer", "sentglue", "dev"):
    suite_tasks = [t for t in tasks if _suite(models, t) == suite and "MRR@10" not in
                   next((r["tasks"][t] for r in models.values() if t in r.get("tasks", {})), {})]
    for t in suite_tasks:
      metric = next((r["tasks"][t].get("metric") for r in models.values() if t in r.get("tasks", {})), None)
      vals = [_fmt(r.get("tasks", {}).get(t, {}).get("main")) for r in models.values()]
      lines.append(f"| {t} | {_METRIC_NAMES.get(metric, metric)} | " + " | ".join(vals) + " |")
    if suite_tasks and suite != "dev":
      vals = []
      for r in models.values():
        s = r.get("summary", {}).get(suite)
        vals.append("-" if not s else _fmt(s["mean"]) + ("" if s.get("complete") else f" ({s['n_tasks']} tasks)"))
      lines.append(f"| **{_SUITE_TITLES[suite]} mean** | | " + " | ".join(f"**{v}**" for v in vals) + " |")
  if "AlignUniform" in tasks:
    for key in ("alignment", "uniformity"):
      vals = [_fmt(r.get("tasks", {}).get("AlignUniform", {}).get(key), 3) for r in models.values()]
      lines.append(f"| {key} (STS-B {_split(models)}) | lower is better | " + " | ".join(vals) + " |")
  if len(lines) == 3:  # retrieval sets only: no headline rows, so no empty headline table
    lines = lines[:1]

  lines += _retrieval_lines(models, tasks)

  sts_tasks = [t for t in tasks if _suite(models, t) == "sts"]
  if sts_tasks:
    lines += ["", "## STS: all pairs vs SentEval's mean over subsets (Spearman x100)", "",
              "| Task | " + " | ".join(f"{n} all | {n} mean" for n in names) + " |",
              "|---|" + "---:|---:|" * len(names)]
    for t in sts_tasks:
      cells = []
      for r in models.values():
        res = r.get("tasks", {}).get(t, {})
        cells += [_fmt(res.get("spearman_all")), _fmt(res.get("spearman_mean"))]
      lines.append(f"| {t} | " + " | ".join(cells) + " |")

  details = []
  for t, key, label in (("MRPC", "f1", "MRPC F1"), ("SentGLUE-MRPC", "acc", "SentGLUE-MRPC acc"),
                        ("SentGLUE-MRPC", "f1", "SentGLUE-MRPC F1"),
                        ("SentGLUE-STSB", "pearson", "SentGLUE-STSB Pearson"),
                        ("SentGLUE-STSB", "spearman", "SentGLUE-STSB Spearman"),
                        ("SentGLUE-CoLA", "mcc_in_domain", "SentGLUE-CoLA MCC in-domain"),
                        ("SentGLUE-CoLA", "mcc_out_of_domain", "SentGLUE-CoLA MCC out-of-domain")):
    if t in tasks:
      vals = [_fmt(r.get("tasks", {}).get(t, {}).get(key)) for r in models.values()]
      details.append(f"| {label} | " + " | ".join(vals) + " |")
  if details:
    lines += ["", "## Other metrics", "", "| | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)] + details

  mteb_tasks = list(dict.fromkeys(t for r in models.values() for t in (r.get("mteb") or {})))
  if mteb_tasks:
    lines += ["", "## MTEB (main score x100)", "", "| Task | Split | Metric | " + " | ".join(names) + " |",
              "|---|---|---|" + "---:|" * len(names)]
    for t in mteb_tasks:
      first = next(r["mteb"][t] for r in models.values() if t in (r.get("mteb") or {}))
      vals = [_fmt((r.get("mteb") or {}).get(t, {}).get("main")) for r in models.values()]
      lines.append(f"| {t} | {first.get('split', '-')} | {first.get('metric', '-')} | " + " | ".join(vals) + " |")

  lines += ["", "## Runs", "", "| | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
  for key, label, digits in (("dim", "embedding dim", 0), ("n_texts", "distinct texts encoded", 0),
                             ("encode_seconds", "encode seconds", 1), ("total_seconds", "total seconds", 1),
                             ("kfold", "k (folds)", 0)):
    vals = [r.get("meta", {}).get(key) for r in models.values()]
    lines.append(f"| {label} | " + " | ".join("-" if v is None else (f"{v:.{digits}f}" if digits else str(v))
                                               for v in vals) + " |")
  sources = [r.get("source") for r in models.values()]
  if any(sources):
    lines.append("| source | " + " | ".join(f"`{s}`" if s else "-" for s in sources) + " |")
  return "\n".join(lines) + "\n"


def _split(models) -> str:
  splits = {r["tasks"]["AlignUniform"].get("split") for r in models.values() if "AlignUniform" in r.get("tasks", {})}
  return "/".join(sorted(s for s in splits if s)) or "test"


def plot_tasks(models: Mapping[str, dict], path: str | os.PathLike) -> bool:
  """Horizontal grouped bars of each task's headline number, one panel per suite."""
  # matplotlib only when a plot is drawn: importing pyplot at module level would choose the
  # importing program's backend; Agg is chosen here, just before.
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  tasks = [t for t in _task_names(models) if _suite(models, t) in ("sts", "transfer", "sentglue")]
  suites = [s for s in ("sts", "transfer", "sentglue") if any(TASKS[t].suite == s for t in tasks)]
  if not suites:
    return False
  names = list(models)
  heights = [sum(TASKS[t].suite == s for t in tasks) + 1 for s in suites]
  fig, axes = plt.subplots(len(suites), 1, figsize=(8, 0.45 * (sum(heights) + 2) * max(1, len(names) ** 0.5)),
                           gridspec_kw={"height_ratios": heights}, squeeze=False)
  colors = plt.get_cmap("tab10")
  bar = 0.8 / len(names)
  for ax, suite in zip(axes[:, 0], suites):
    rows = [t for t in tasks if TASKS[t].suite == suite] + ["mean"]
    for m, name in enumerate(names):
      res = models[name]
      vals = [res.get("tasks", {}).get(t, {}).get("main") for t in rows[:-1]]
      vals.append(res.get("summary", {}).get(suite, {}).get("mean"))
      y = np.arange(len(rows)) + (m - (len(names) - 1) / 2) * bar
      v = np.array([np.nan if x is None else x for x in vals], np.float64)
      ax.barh(y, v, height=bar, color=colors(m % 10), label=name)
      for yi, vi in zip(y, v):
        if np.isfinite(vi):
          ax.text(vi, yi, f" {vi:.1f}", va="center", fontsize=7)
    n_done = {r.get("summary", {}).get(suite, {}).get("n_tasks") for r in models.values()}
    total = sum(TASKS[t].suite == suite for t in TASKS)
    labels = rows[:-1] + ["mean" if n_done == {total} else f"mean (of {'/'.join(map(str, sorted(n_done - {None})))}"
                                                         f" of {total} tasks)"]
    ax.set_yticks(np.arange(len(rows)), labels)
    ax.invert_yaxis()
    ax.set_title(_SUITE_TITLES[suite], loc="left", fontsize=10)
    ax.set_xlim(min(0.0, _min_main(models, rows)) - 5, 105)
    ax.grid(axis="x", alpha=0.3)
  axes[0, 0].legend(loc="lower right", fontsize=8)
  axes[-1, 0].set_xlabel("score x100 (see table for each metric)")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return True


def plot_retrieval(models: Mapping[str, dict], path: str | os.PathLike) -> bool:
  """Grouped bars per retrieval task: MRR@10, nDCG@10 and Recall@100 of each model (BM25 included)."""
  import matplotlib  # pylint: disable=g-import-not-at-top  (see plot_tasks)
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  tasks = [t for t in _task_names(models)
           if "MRR@10" in next((r["tasks"][t] for r in models.values() if t in r.get("tasks", {})), {})]
  if not tasks:
    return False
  measures = ("MRR@10", "nDCG@10", "Recall@100")
  names = list(models)
  fig, axes = plt.subplots(1, len(measures), figsize=(4 * len(measures), 0.5 * len(tasks) * len(names) + 1.5),
                           sharey=True, squeeze=False)
  bar = 0.8 / len(names)
  for ax, measure in zip(axes[0], measures):
    for m, name in enumerate(names):
      vals = [models[name].get("tasks", {}).get(t, {}).get(measure) for t in tasks]
      y = np.arange(len(tasks)) + (m - (len(names) - 1) / 2) * bar
      ax.barh(y, [np.nan if v is None else v for v in vals], height=bar, color=plt.get_cmap("tab10")(m % 10),
              label=name)
    ax.set_yticks(np.arange(len(tasks)), [t if len(t) < 30 else "..." + t[-27:] for t in tasks], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_title(measure, fontsize=10)
    ax.grid(axis="x", alpha=0.3)
  axes[0, 0].legend(loc="lower right", fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return True


def _min_main(models, rows) -> float:
  vals = [r.get("tasks", {}).get(t, {}).get("main") for r in models.values() for t in rows]
  vals = [v for v in vals if v is not None]
  return min(vals) if vals else 0.0


# Half-width of the colour scale when every model has the same STS mean (e.g. one model):
# a range of 1e-6 made matplotlib draw ticks 0..8 under an offset like 1e-7+5.26e1.
SINGLE_VALUE_HALF_RANGE = 1.0


def align_uniform_figure(models: Mapping[str, dict]):
  """The alignment/uniformity figure (matplotlib Agg), or None when no model has AlignUniform."""
  import matplotlib  # pylint: disable=g-import-not-at-top  (see plot_tasks)
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  from matplotlib.ticker import ScalarFormatter  # pylint: disable=g-import-not-at-top

  points = [(name, r["tasks"]["AlignUniform"], r.get("summary", {}).get("sts", {}))
            for name, r in models.items() if "AlignUniform" in r.get("tasks", {})]
  if not points:
    return None
  fig, ax = plt.subplots(figsize=(5.5, 4.5))
  # Colour by STS mean only when every point has all 7 STS sets: partial means do not compare.
  complete = all(s.get("complete") for _, _, s in points)
  points = [(name, p, s.get("mean") if complete else None) for name, p, s in points]
  sts_vals = [s for _, _, s in points if s is not None]
  kw = {}
  if sts_vals:
    lo, hi = min(sts_vals), max(sts_vals)
    if hi - lo < 1e-3:  # one model (or equal means): centre a readable range on the value
      lo, hi = lo - SINGLE_VALUE_HALF_RANGE, hi + SINGLE_VALUE_HALF_RANGE
    kw = dict(c=[np.nan if s is None else s for _, _, s in points], cmap="viridis", vmin=lo, vmax=hi)
  sc = ax.scatter([p["uniformity"] for _, p, _ in points], [p["alignment"] for _, p, _ in points], s=60,
                  edgecolors="black", **kw)
  for name, p, _ in points:
    ax.annotate(name, (p["uniformity"], p["alignment"]), textcoords="offset points", xytext=(5, 5), fontsize=8)
  if sts_vals:
    cbar = fig.colorbar(sc, ax=ax, label="STS mean (Spearman x100)")
    formatter = ScalarFormatter(useOffset=False)  # never an offset text over the title
    cbar.ax.yaxis.set_major_formatter(formatter)
  for axis in (ax.xaxis, ax.yaxis):
    axis.set_major_formatter(ScalarFormatter(useOffset=False))
  ax.set_xlabel(r"$\ell_{uniform}$ (lower is better)")
  ax.set_ylabel(r"$\ell_{align}$ (lower is better)")
  ax.set_title(f"Alignment vs uniformity, STS-B {_split(models)}", fontsize=10)
  ax.grid(alpha=0.3)
  ax.margins(x=0.35, y=0.2)  # room for the labels
  fig.tight_layout()
  return fig


def plot_align_uniform(models: Mapping[str, dict], path: str | os.PathLike) -> bool:
  """Alignment vs uniformity, one point per model (the paper's figure); colour = STS mean."""
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top  (see plot_tasks)

  fig = align_uniform_figure(models)
  if fig is None:
    return False
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return True


def write_all(models: Mapping[str, dict], output: str | os.PathLike, *, extra: dict | None = None) -> dict[str, str]:
  """Writes OUTPUT (.json), OUTPUT .md and the two PNGs beside it (local or gs://); returns {kind: path}."""
  if paths.is_remote(output):  # written locally, then uploaded beside OUTPUT
    remote = paths.path(output)
    with tempfile.TemporaryDirectory(prefix="st5_eval_") as tmp:
      local = write_all(models, os.path.join(tmp, remote.name), extra=extra)
      written = {}
      for kind, f in local.items():
        dst = os.fspath(remote.parent / os.path.basename(f))
        paths.write_bytes(dst, pathlib.Path(f).read_bytes())
        written[kind] = dst
      return written
  out = pathlib.Path(output)
  if out.suffix != ".json":
    out = out.with_suffix(".json")
  written = {"json": str(out)}
  write_json(out, {"models": dict(models), **(extra or {})})
  md = out.with_suffix(".md")
  md.write_text(markdown(models), encoding="utf-8")
  written["markdown"] = str(md)
  tasks_png = out.with_name(out.stem + "_tasks.png")
  if plot_tasks(models, tasks_png):
    written["tasks_png"] = str(tasks_png)
  au_png = out.with_name(out.stem + "_align_uniform.png")
  if plot_align_uniform(models, au_png):
    written["align_uniform_png"] = str(au_png)
  retrieval_png = out.with_name(out.stem + "_retrieval.png")
  if plot_retrieval(models, retrieval_png):
    written["retrieval_png"] = str(retrieval_png)
  return written

