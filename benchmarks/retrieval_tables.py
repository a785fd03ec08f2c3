"""docs/results.md's retrieval tables from `st5 sweep` runs: every measure, mean ± std over seeds, with reference rows.

`st5 sweep` summarises each task's headline (MRR@10 for retrieval sets); this reads every finished run's
record (OUT/runs/<arm>/seed<S>/sweep_run.json) for the other measures, and an `st5 eval` results file of
reference rows (benchmarks/retrieval_reference.py: BM25, all-MiniLM-L6-v2) that enter each table as they are.

  python benchmarks/retrieval_tables.py --sweep sweeps/r1_pooling --sweep sweeps/r2_qa \\
      --reference results/reference.json [--measures MRR@10,Recall@100] [--tasks WikiQA,TREC-QA] \\
      [--reeval SemEval2016-B]

--reeval TASKS scores those sets again on every run's work dir (latest checkpoint) with today's readers, for
sets whose construction changed after the sweep ran; the scores are kept beside each run
(reeval-<digest of the sets' texts>.json), so a rerun of the table does not encode again. Later --reference
files override earlier ones task by task (a reference row re-measured on a changed set).

Per arm and task: mean ± sample std (ddof 1) over the seeds, and the seeds' per-seed differences against a
`--baseline_arm` when given (arm A's seed s minus the baseline's seed s, as docs/results.md quotes them).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import numpy as np

DEFAULT_MEASURES = ("MRR@10", "Recall@100")
DEFAULT_TASKS = ("ReQA-SQuAD", "SQuAD-paragraphs", "SemEval2016-B", "WikiQA", "TREC-QA")


def runs_of(sweep: str, reeval: list[str] = ()) -> dict[str, dict[int, dict]]:
  """{arm: {seed: the run's eval tasks}} of the finished runs of a sweep folder (`reeval` sets scored again)."""
  out: dict[str, dict[int, dict]] = {}
  for record_path in sorted(pathlib.Path(sweep, "runs").glob("*/seed*/sweep_run.json")):
    record = json.loads(record_path.read_text())
    tasks = (record.get("eval") or {}).get("tasks")
    if record.get("trained") and tasks:
      out.setdefault(record["arm"], {})[int(record["seed"])] = {**tasks, **rescore(record_path.parent, reeval)}
  return out


def rescore(run_dir: pathlib.Path, names: list[str]) -> dict[str, dict]:
  """The sets `names` scored on the run's latest parameters by today's harness (cached beside the run)."""
  if not names:
    return {}
  import hashlib  # pylint: disable=g-import-not-at-top  (only with --reeval: JAX and the model)

  from st5_jax import paths  # pylint: disable=g-import-not-at-top
  from st5_jax.encoder import SentenceEncoder  # pylint: disable=g-import-not-at-top
  from st5_jax.evaluation import harness, sets  # pylint: disable=g-import-not-at-top

  root = paths.data_dir(None)
  digest = hashlib.sha256("\n\n".join(n + "\n" + "\n".join(sets.texts(n, root)) for n in names).encode()).hexdigest()
  cached = run_dir / f"reeval-{digest[:16]}.json"
  if cached.exists():
    return json.loads(cached.read_text())
  encoder = SentenceEncoder.load(str(run_dir), checkpoint="latest")
  tasks = harness.evaluate(lambda texts: encoder.encode(texts), names, root)["tasks"]
  cached.write_text(json.dumps(tasks, sort_keys=True))
  return tasks


def cell(values: list[float]) -> str:
  if not values:
    return "-"
  if len(values) == 1:
    return f"{values[0]:.3f}"
  return f"{np.mean(values):.3f} ± {np.std(values, ddof=1):.3f}"


def table(rows: dict[str, dict[int, dict]], tasks, measures, reference: dict[str, dict]) -> str:
  head = [f"{t} {m}" for t in tasks for m in measures]
  lines = ["| arm | n | " + " | ".join(head) + " |", "|---|---:|" + "---:|" * len(head)]
  for name, result in reference.items():
    vals = [result["tasks"].get(t, {}).get(m) for t in tasks for m in measures]
    lines.append(f"| {name} (reference) | - | " + " | ".join("-" if v is None else f"{v:.3f}" for v in vals) + " |")
  for arm, seeds in rows.items():
    cells = [cell([s[t][m] for s in seeds.values() if t in s and m in s[t]]) for t in tasks for m in measures]
    lines.append(f"| {arm} | {len(seeds)} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def differences(rows, baseline: str, tasks, measures) -> str:
  out = []
  for arm, seeds in rows.items():
    if arm == baseline:
      continue
    for t in tasks:
      for m in measures:
        base = rows[baseline]
        diffs = [seeds[s][t][m] - base[s][t][m] for s in sorted(seeds)
                 if s in base and m in seeds[s].get(t, {}) and m in base[s].get(t, {})]  # sweeps of other tasks
        if diffs:
          out.append(f"- {arm} - {baseline}, {t} {m}: " + " / ".join(f"{d:+.3f}" for d in diffs)
                     + (f" ({np.mean(diffs):+.3f} ± {np.std(diffs, ddof=1):.3f})" if len(diffs) > 1 else ""))
  return "\n".join(out)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sweep", action="append", required=True, help="A sweep's --out folder (repeatable).")
  parser.add_argument("--reference", action="append", default=[],
                      help="An `st5 eval` results file of reference rows (repeatable; later files win task by task).")
  parser.add_argument("--reeval", default="", help="Sets to score again on every run (comma-separated).")
  parser.add_argument("--tasks", default=",".join(DEFAULT_TASKS))
  parser.add_argument("--measures", default=",".join(DEFAULT_MEASURES))
  parser.add_argument("--baseline_arm", default=None,
                      help="Print per-seed differences against this arm (SWEEP_FOLDER_NAME/ARM).")
  args = parser.parse_args(argv)
  tasks, measures = args.tasks.split(","), args.measures.split(",")
  reference: dict[str, dict] = {}
  for path in args.reference:
    for name, result in json.loads(pathlib.Path(path).read_text())["models"].items():
      reference.setdefault(name, {"tasks": {}})["tasks"].update(result["tasks"])
  reeval = [t for t in args.reeval.split(",") if t]
  rows: dict[str, dict[int, dict]] = {}
  for sweep in args.sweep:
    for arm, seeds in runs_of(sweep, reeval).items():
      rows[f"{pathlib.Path(sweep).name}/{arm}"] = seeds
  if not rows:
    raise SystemExit(f"no finished runs under {args.sweep}")
  if args.baseline_arm and args.baseline_arm not in rows:
    raise SystemExit(f"--baseline_arm {args.baseline_arm!r} is not an arm here; arms: {', '.join(rows)}")
  print(table(rows, tasks, measures, reference))
  if args.baseline_arm:
    print()
    print(differences(rows, args.baseline_arm, tasks, measures))
  return 0


if __name__ == "__main__":
  sys.exit(main())
