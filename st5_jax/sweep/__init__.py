"""Sweeps: arms (sets of gin bindings) x seeds, each a `st5 train` work dir, evaluated and summarised.

  runs = plan(["st5_tiny_cpu.gin"], flag_bindings, expand(arms, grids), seeds=[0, 1, 2], out="sweeps/pool")
  run_sweep(runs, out, tasks=["STSBenchmarkDev", "STS12"], select="STSBenchmarkDev")

Along the data flow, each module importing only those before it:
  definition.py  arms, grids, each run's bindings, its config key (hash of the parsed gin config) and dir
  records.py     a run dir's sweep_run.json: its key (a dir of another key is refused), what is done
  summary.py     statistics over seeds, the selected arm, results.json / summary.{csv,md,png}
  run.py         the driver: trains and evaluates what is not finished, then reports
No module shares a name with a function exported here (sweep.report is the function). Importing the
package loads neither JAX nor gin: the functions that need them import them (`st5 sweep --help` stays light).
The command: st5_jax/commands/sweep.py; docs/sweep.md.
"""

from st5_jax.sweep.definition import (SEED_BINDING, Arm, Run, SweepError, config_key, expand, parse_arms,
                                      parse_config, parse_grid, plan, run_bindings, safe_name, split_values)
from st5_jax.sweep.records import RUN_FILE, is_finished, missing_tasks, new_record, read_record, write_record
from st5_jax.sweep.summary import (CSV_COLUMNS, STS_AVG, aggregate, mark_selection, markdown, plot, report,
                                   run_values, select_arm, stats, summary_csv)
from st5_jax.sweep.run import Outcome, duration, evaluate_run, run_sweep, train_run

__all__ = [
    "SEED_BINDING", "Arm", "Run", "SweepError", "config_key", "expand", "parse_arms", "parse_config", "parse_grid",
    "plan", "run_bindings", "safe_name", "split_values",
    "RUN_FILE", "is_finished", "missing_tasks", "new_record", "read_record", "write_record",
    "CSV_COLUMNS", "STS_AVG", "aggregate", "mark_selection", "markdown", "plot", "report", "run_values", "select_arm",
    "stats", "summary_csv",
    "Outcome", "duration", "evaluate_run", "run_sweep", "train_run",
]
