"""`st5 sweep --gin_file BASE.gin [--gin.K=V ...] [--grid K=V1,V2 ...] [--arms FILE] --seeds N --tasks T --out DIR`.

Arms x seeds, each a `st5 train` work dir DIR/runs/<arm>/seed<S>, trained one after the
other in this process, evaluated with `st5 eval`'s harness, summarised in DIR/results.json,
summary.csv, summary.md and summary.png. Rerun to resume. The logic: the st5_jax/sweep/ package
(definition, records, summary, run); docs/sweep.md.
"""

from __future__ import annotations

import argparse
import logging
import sys

from st5_jax.commands import train as train_cmd


def register(sub: argparse._SubParsersAction) -> None:
  p = sub.add_parser("sweep", help="Train and evaluate a grid or a list of arms of gin bindings x seeds, resumably.",
                     description="Extra --gin.KEY=VALUE arguments bind every run (as in `st5 train`). Bindings "
                                 "apply in this order: gin files, --gin flags, the arm (--arms), the grid, the seed.")
  p.add_argument("--gin_file", action="append", required=True,
                 help="Gin file of every run (repeatable); names are also looked up in gin/ and --gin_search_path.")
  p.add_argument("--gin_search_path", action="append", default=[])
  p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                 help="A gin key and its values (gin syntax, strings quoted: st5_model.pooling=\"'enc_first',"
                      "'enc_mean'\"); repeatable: the product of all grids.")
  p.add_argument("--arms", default=None, metavar="FILE",
                 help="Named arms: `[name]` lines, each followed by gin statements (docs/sweep.md); "
                      "crossed with --grid when both are given.")
  p.add_argument("--seeds", type=int, default=3, help="Seeds 0..N-1 per arm (TrainConfig.seed; default 3).")
  p.add_argument("--tasks", default="sts",
                 help="`st5 eval` tasks or suites for every run (default: sts, the 7 STS sets).")
  p.add_argument("--prompt", action="append", default=[], metavar="TASK=NAME",
                 help="As `st5 eval --prompt`: the model's prompt a task or suite encodes with (e.g. sts=query; "
                      "repeatable).")
  p.add_argument("--select", default=None, metavar="TASK",
                 help="Pick the arm with the highest mean on this task (a dev set: STSBenchmarkDev); the "
                      "table marks the selected arm's other numbers as its test figures. Evaluated too.")
  p.add_argument("--out", required=True, help="The sweep folder: runs/, results.json, summary.{csv,md,png}.")
  p.add_argument("--only", default="", help="Run only these arms (comma-separated names); for one launch per "
                                             "slice. The report still covers every finished run in --out.")
  p.add_argument("--seed_index", default="", help="Run only these seed indices (comma-separated, 0-based).")
  p.add_argument("--max_runs", type=int, default=None, help="Stop after this many runs (a time-boxed launch).")
  p.add_argument("--report_only", action="store_true", help="Train and evaluate nothing: report what --out holds.")
  p.add_argument("--data_dir", default=None, help="Evaluation data folder (default $ST5_DATA_DIR).")
  p.add_argument("--kfold", type=int, default=10, help="Folds of SentEval's cross-validations (SentEval: 10).")
  p.add_argument("--batch_size", type=int, default=64, help="Evaluation encoding batch size.")
  p.add_argument("--checkpoint", choices=["auto", "latest", "best"], default="auto",
                 help="Which parameters of each run are evaluated (as `st5 eval --checkpoint`).")
  p.add_argument("--no_progress", action="store_true", help="No training progress bars (the sweep's lines stay).")
  p.set_defaults(run=run, accepts_extra=True)


def _split(value: str) -> list[str]:
  return [v.strip() for v in value.split(",") if v.strip()]


def build(args: argparse.Namespace):
  """(runs, todo, tasks, definition) from the command line; every mistake before any training."""
  from st5_jax import paths, sweep  # pylint: disable=g-import-not-at-top
  from st5_jax.evaluation import resolve_tasks  # pylint: disable=g-import-not-at-top  (scikit-learn)

  if args.seeds < 1:
    raise SystemExit(f"--seeds must be at least 1, got {args.seeds}")
  tasks = resolve_tasks(args.tasks)
  select = None
  if args.select:
    chosen = resolve_tasks(args.select)
    if len(chosen) != 1:
      raise SystemExit(f"--select names one task, got {chosen}")
    select = chosen[0]
    if select not in tasks:
      tasks.append(select)
  from st5_jax.evaluation import prompts as eval_prompts  # pylint: disable=g-import-not-at-top
  try:
    for r in eval_prompts.parse(args.prompt):  # keys and sides checked before any training (names: per model)
      eval_prompts.plan([eval_prompts.Rule(r.key, r.side, eval_prompts.NONE)], tasks, {})
  except ValueError as e:
    raise SystemExit(str(e)) from e
  arms = sweep.parse_arms(paths.read_text(args.arms), args.arms) if args.arms else None
  grids = [sweep.parse_grid(g) for g in args.grid]
  arm_list = sweep.expand(arms, grids)
  flags = train_cmd.gin_overrides(args.extra)
  seeds = list(range(args.seeds))
  runs = sweep.plan(args.gin_file, flags, arm_list, seeds, args.out, args.gin_search_path)
  only = _split(args.only)
  unknown = [a for a in only if a not in {arm.name for arm in arm_list}]
  if unknown:
    raise SystemExit(f"--only {unknown}: no such arm; arms: {[a.name for a in arm_list]}")
  try:
    indices = [int(i) for i in _split(args.seed_index)]
  except ValueError:
    raise SystemExit(f"--seed_index takes comma-separated integers, got {args.seed_index!r}") from None
  bad = [i for i in indices if not 0 <= i < args.seeds]
  if bad:
    raise SystemExit(f"--seed_index {bad}: out of range for --seeds {args.seeds}")
  todo = [r for r in runs if (not only or r.arm in only) and (not indices or r.seed in [seeds[i] for i in indices])]
  definition = {"gin_files": list(args.gin_file), "gin": flags, "grid": args.grid, "arms_file": args.arms,
                "arms": {a.name: list(a.bindings) for a in arm_list}, "seeds": seeds, "tasks": tasks,
                "select": select, "command": " ".join(["st5", *sys.argv[1:]])}
  if args.prompt:
    definition["prompts"] = list(args.prompt)
  return runs, todo, tasks, select, definition


def run(args: argparse.Namespace) -> int:
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
  for noisy in ("absl", "jax._src.xla_bridge", "orbax", "tensorflow"):
    logging.getLogger(noisy).setLevel(logging.WARNING)

  from st5_jax import multihost, paths, sweep  # pylint: disable=g-import-not-at-top  (JAX)

  multihost.maybe_initialize()
  runs, todo, tasks, select, definition = build(args)
  if args.report_only:
    result = sweep.report(args.out, runs, tasks, seeds=args.seeds, select=select, definition=definition)
    print(result["markdown"])
    return 0
  eval_kwargs = {"data_dir": args.data_dir, "kfold": args.kfold, "batch_size": args.batch_size,
                 "checkpoint": args.checkpoint}
  if args.prompt:
    eval_kwargs["prompts"] = list(args.prompt)
  outcome = sweep.run_sweep(runs, args.out, gin_files=args.gin_file, tasks=tasks, seeds=args.seeds,
                            search_paths=args.gin_search_path, select=select, todo=todo, max_runs=args.max_runs,
                            progress=not args.no_progress, definition=definition, eval_kwargs=eval_kwargs)
  if outcome.interrupted_by:
    return 143 if outcome.interrupted_by == "SIGTERM" else 130
  print(outcome.report["markdown"])
  for name in ("results.json", "summary.csv", "summary.md", "summary.png"):
    if paths.exists(paths.join(args.out, name)):
      print(f"wrote {paths.join(args.out, name)}", file=sys.stderr)
  return 0
