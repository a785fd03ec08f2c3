"""`st5 sweep` (st5_jax/sweep/): grids and arms, run keys, the aggregate, resume and skip, a tiny sweep end to end."""

import csv
import io
import json
import os
import shutil
import signal
import types

import gin
import numpy as np
import pytest

import synthetic
from st5_jax import cli, hooks, sweep

# The trainer's data for these runs: synthetic pairs (no tf.data), bound by gin.
gin.external_configurable(synthetic.factory, "sweep_test_pairs")

BASE_GIN = """
include 'runs/base.gin'
include 'models/t5_tiny.gin'
run.data = @sweep_test_pairs()
st5_model.embedding_dim = 16
st5_model.dropout_rate = 0.0
st5_model.dtype = 'float32'
st5_model.max_length = 32
TrainConfig.global_batch_size = 16
TrainConfig.num_train_steps = 3
TrainConfig.checkpoint_every = 100
TrainConfig.log_every = 1
TrainConfig.eval_every = -1
OptimizerConfig.learning_rate = 1e-2
"""

ARMS = """
# two poolings
[first]
st5_model.pooling = 'enc_first'

[mean]
st5_model.pooling = 'enc_mean'
TASK_FEATURE_LENGTHS = {'inputs': 16,
    'targets': 16}
"""


@pytest.fixture
def base_gin(tmp_path):
  path = tmp_path / "base.gin"
  path.write_text(BASE_GIN)
  return str(path)


# ------------------------------------------------------------------------------ definition


def test_grid_values_split_at_top_level_commas_and_expand_to_the_product():
  assert sweep.split_values("'a,b', {'x': 1, 'y': [2, 3]},4") == ["'a,b'", "{'x': 1, 'y': [2, 3]}", "4"]
  for bad in ("1,,2", "'open", "{1: 2"):
    with pytest.raises(sweep.SweepError):
      sweep.split_values(bad)
  assert sweep.parse_grid("st5_model.pooling='enc_first','enc_mean'") == (
      "st5_model.pooling", ["'enc_first'", "'enc_mean'"])
  with pytest.raises(sweep.SweepError, match="KEY=V1"):
    sweep.parse_grid("st5_model.pooling")

  arms = sweep.expand(None, [sweep.parse_grid("st5_model.pooling='enc_first','enc_mean'"),
                             sweep.parse_grid("OptimizerConfig.learning_rate=1e-2,1e-3")])
  assert [a.name for a in arms] == ["pooling=enc_first+learning_rate=1e-2", "pooling=enc_first+learning_rate=1e-3",
                                    "pooling=enc_mean+learning_rate=1e-2", "pooling=enc_mean+learning_rate=1e-3"]
  assert arms[1].bindings == ("st5_model.pooling='enc_first'", "OptimizerConfig.learning_rate=1e-3")
  assert sweep.expand(None) == [sweep.Arm("base", ())]
  # Arms x grid: the arm's bindings first, its name first; a name becomes a folder name.
  both = sweep.expand([sweep.Arm("a b", ("X.y = 1",)), sweep.Arm("c", ())], [("Z.w", ["1", "2"])])
  assert [a.name for a in both] == ["a_b+w=1", "a_b+w=2", "c+w=1", "c+w=2"]
  assert both[1].bindings == ("X.y = 1", "Z.w=2")
  with pytest.raises(sweep.SweepError, match="not unique"):
    sweep.expand([sweep.Arm("a", ()), sweep.Arm("a", ("X.y = 1",))])


def test_arms_file_names_arms_of_gin_statements():
  arms = sweep.parse_arms(ARMS + "\n[staged]\ninclude 'seed_encoder_tiny_cpu.gin'\n  # a comment\n"
                          "run.init_from = 'sweeps/qa/runs/qa/seed{seed}'\n")
  assert [a.name for a in arms] == ["first", "mean", "staged"]
  assert arms[0].bindings == ("st5_model.pooling = 'enc_first'",)
  # An indented line continues the statement above.
  assert arms[1].bindings[1] == "TASK_FEATURE_LENGTHS = {'inputs': 16, 'targets': 16}"
  assert arms[2].bindings == ("include 'seed_encoder_tiny_cpu.gin'", "run.init_from = 'sweeps/qa/runs/qa/seed{seed}'")
  with pytest.raises(sweep.SweepError, match="arms.txt:2: .*before the first"):
    sweep.parse_arms("# c\nX.y = 1\n[a]\n", "arms.txt")
  with pytest.raises(sweep.SweepError, match="no arms"):
    sweep.parse_arms("# nothing\n")


def test_bindings_apply_files_flags_arm_grid_then_seed(tmp_path, base_gin):
  arm = sweep.expand([sweep.Arm("a", ("TrainConfig.log_every = 3", "run.init_from = 'x/seed{seed}'"))],
                     [("TrainConfig.log_every", ["4"])])[0]
  bindings = sweep.run_bindings(["TrainConfig.log_every=2", "TrainConfig.keep_checkpoints=5"], arm, 7)
  assert bindings == ["TrainConfig.log_every=2", "TrainConfig.keep_checkpoints=5", "TrainConfig.log_every = 3",
                      "run.init_from = 'x/seed7'", "TrainConfig.log_every=4", "TrainConfig.seed = 7"]
  sweep.parse_config([base_gin], bindings)
  # The file says 1, the flag 2, the arm 3, the grid 4: the grid's wins; the flag's other binding stays.
  assert gin.query_parameter("TrainConfig.log_every") == 4
  assert gin.query_parameter("TrainConfig.keep_checkpoints") == 5
  assert gin.query_parameter("TrainConfig.seed") == 7
  sweep.parse_config([base_gin], sweep.run_bindings(["TrainConfig.log_every=2"], sweep.Arm("b", ()), 0))
  assert gin.query_parameter("TrainConfig.log_every") == 2
  for where in (["TrainConfig.seed=3"], []):
    arm_seed = sweep.Arm("s", () if where else (" TrainConfig.seed = 1",))
    with pytest.raises(sweep.SweepError, match="binds TrainConfig.seed itself"):
      sweep.run_bindings(where, arm_seed, 0)


def test_run_keys_are_stable_and_separate_bindings(tmp_path, base_gin):
  arms = [sweep.Arm("a", ("st5_model.pooling = 'enc_first'",)), sweep.Arm("b", ("st5_model.pooling='enc_first'",)),
          sweep.Arm("c", ("st5_model.pooling = 'enc_mean'",))]
  out = str(tmp_path / "out")
  runs = sweep.plan([base_gin], ["TrainConfig.num_train_steps=4"], arms, [0, 1], out)
  again = sweep.plan([base_gin], ["TrainConfig.num_train_steps = 4"], arms, [0, 1], out)
  assert [r.key for r in runs] == [r.key for r in again]  # the parsed config, not the spelling
  key = {(r.arm, r.seed): r.key for r in runs}
  assert key["a", 0] == key["b", 0] and key["a", 1] == key["b", 1]  # the same bindings
  assert len({key["a", 0], key["a", 1], key["c", 0], key["c", 1]}) == 4  # seeds and values separate
  assert runs[0].dir == os.path.join(out, "runs", "a", "seed0") and runs[0].bindings[-1] == "TrainConfig.seed = 0"
  # A change inside the gin file changes every key.
  changed = tmp_path / "changed.gin"
  changed.write_text(BASE_GIN.replace("learning_rate = 1e-2", "learning_rate = 2e-2"))
  assert sweep.plan([str(changed)], ["TrainConfig.num_train_steps=4"], arms[:1], [0], out)[0].key != key["a", 0]

  # A run dir recorded with another key is refused; one with a checkpoint but no record too.
  sweep.write_record(runs[0], sweep.new_record(runs[0], [base_gin]))
  assert sweep.read_record(runs[0])["key"] == runs[0].key
  other = sweep.plan([base_gin], [], arms[:1], [0], out)[0]  # 3 steps, not 4: the same dir
  assert other.dir == runs[0].dir and other.key != runs[0].key
  with pytest.raises(sweep.SweepError, match="other bindings"):
    sweep.read_record(other)
  os.makedirs(os.path.join(runs[1].dir, "checkpoints"))
  with pytest.raises(sweep.SweepError, match="no sweep recorded"):
    sweep.read_record(runs[1])


# ------------------------------------------------------------------------------ aggregate


def test_aggregate_matches_numpy_and_marks_the_selected_arms_test_figures():
  rng = np.random.default_rng(0)
  per_run = [(arm, {"STSBenchmarkDev": float(rng.normal(60 + 5 * i, 2)), "STS12": float(rng.normal(50, 3))})
             for i, arm in enumerate(["a", "b", "c"]) for _ in range(4)]
  per_run[-1][1].pop("STS12")  # c has 3 values of STS12
  per_run.append(("d", {"STSBenchmarkDev": 10.0}))
  rows = sweep.aggregate(per_run, ["a", "b", "c", "d", "e"], ["STSBenchmarkDev", "STS12"])
  for r in rows:
    v = np.array([vals[r["task"]] for arm, vals in per_run if arm == r["arm"] and r["task"] in vals])
    assert r["n"] == v.size
    if v.size > 1:
      np.testing.assert_allclose([r["mean"], r["std"], r["min"], r["max"]],
                                 [v.mean(), v.std(ddof=1), v.min(), v.max()], rtol=1e-12)
  by = {(r["arm"], r["task"]): r for r in rows}
  assert by["c", "STS12"]["n"] == 3
  assert by["d", "STSBenchmarkDev"] == {"arm": "d", "task": "STSBenchmarkDev", "n": 1, "mean": 10.0, "std": None,
                                        "min": 10.0, "max": 10.0}
  assert by["e", "STS12"]["n"] == 0 and by["e", "STS12"]["mean"] is None

  assert sweep.select_arm(rows, "STSBenchmarkDev") == "c"
  assert sweep.select_arm(rows, "STS12") == max("abc", key=lambda a: by[a, "STS12"]["mean"])
  assert sweep.select_arm(rows, "STS13") is None
  tie = [{"arm": "x", "task": "T", "mean": 1.0}, {"arm": "y", "task": "T", "mean": 1.0}]
  assert sweep.select_arm(tie, "T") == "x"
  sweep.mark_selection(rows, "c", "STSBenchmarkDev")
  assert [(r["arm"], r["task"], r["role"]) for r in rows if r["selected"]] == [
      ("c", "STSBenchmarkDev", "select"), ("c", "STS12", "test")]

  table = list(csv.DictReader(io.StringIO(sweep.summary_csv(rows))))
  assert list(table[0]) == list(sweep.CSV_COLUMNS)
  assert float(table[0]["std"]) == pytest.approx(by["a", "STSBenchmarkDev"]["std"], abs=1e-4)
  assert table[6]["std"] == "" and table[6]["n"] == "1" and table[5]["role"] == "test"
  md = sweep.markdown(rows, ["a", "b", "c", "d", "e"], ["STSBenchmarkDev", "STS12"], seeds=4,
                      select="STSBenchmarkDev", selected="c", runs=[])
  c_line = next(line for line in md.splitlines() if line.startswith("| **c**"))
  assert c_line.count("†") == 1 and "(sel.)" in c_line and "| 4/4 |" in c_line and "[n=3]" in c_line
  assert sum(line.count("†") for line in md.splitlines() if line.startswith("| ")) == 1
  assert "| d | 1/4 | 10.00 ± - (10.00–10.00) | - |" in md
  assert sweep.plot(rows, per_run, ["a", "b", "c", "d", "e"], ["STSBenchmarkDev", "STS12"]).startswith(b"\x89PNG")


def test_sts_average_needs_all_seven_sts_tasks():
  from st5_jax.evaluation.harness import SUITES
  sts = SUITES["sts"]
  rec = {"eval": {"tasks": {t: {"main": float(i)} for i, t in enumerate(sts)}}}
  assert sweep.run_values(rec, sts)[sweep.STS_AVG] == pytest.approx(np.mean(np.arange(7)))
  assert sweep.STS_AVG not in sweep.run_values(rec, sts[:6])


# ------------------------------------------------------------------------------ resume and skip


def _fake_runs(out, arms=("a", "b"), seeds=(0, 1)):
  return [sweep.Run(arm=a, seed=s, bindings=(f"TrainConfig.seed = {s}",), dir=os.path.join(out, "runs", a, f"seed{s}"),
                    key=f"key-{a}-{s}", config="") for a in arms for s in seeds]


class FakeWork:
  """train_fn / eval_fn for run_sweep: records calls; `interrupt` names a run to stop with SIGTERM once."""

  def __init__(self):
    self.trained, self.evaluated, self.interrupt = [], [], None

  def train(self, run):
    self.trained.append(run.label)
    os.makedirs(os.path.join(run.dir, "checkpoints"), exist_ok=True)
    if self.interrupt == run.label:
      self.interrupt = None
      return types.SimpleNamespace(step=2, interrupted_by="SIGTERM")
    return types.SimpleNamespace(step=4, interrupted_by=None)

  def eval(self, run_dir, names):
    self.evaluated.append((os.path.relpath(run_dir), tuple(names)))
    seed = int(run_dir[-1])
    return {"tasks": {t: {"main": 10.0 * (1 + seed) + len(t)} for t in names}}


def test_rerun_skips_finished_runs_resumes_interrupted_ones_and_evaluates_only_missing_tasks(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  out = "out"
  runs, work, lines = _fake_runs(out), FakeWork(), []
  kw = dict(gin_files=["base.gin"], seeds=2, train_fn=work.train, eval_fn=work.eval, log=lines.append)
  tasks = ["STS12", "STSBenchmarkDev"]

  # A launch that stops after one run (--max_runs 1).
  o = sweep.run_sweep(runs, out, tasks=tasks, max_runs=1, **kw)
  assert o.stopped_early and o.done == ["a/seed0"] and work.trained == ["a/seed0"]
  assert o.report["finished"] == 1
  assert [r["n"] for r in o.report["rows"]] == [1, 1, 0, 0]
  assert sum("done in" in line for line in lines) == 1
  assert "0 finished; this launch: 4 to run of 4" in lines[0]

  # A launch interrupted by SIGTERM in the second run: nothing after it runs or is evaluated.
  work.interrupt = "a/seed1"
  o = sweep.run_sweep(runs, out, tasks=tasks, **kw)
  assert o.interrupted_by == "SIGTERM" and o.done == [] and o.report is None
  assert work.trained == ["a/seed0", "a/seed1"] and len(work.evaluated) == 1
  assert sweep.read_record(runs[1])["trained"] is None

  # The rerun resumes a/seed1 (trains it again: the trainer resumes from its checkpoint), skips a/seed0.
  lines.clear()
  o = sweep.run_sweep(runs, out, tasks=tasks, **kw)
  assert o.done == ["a/seed1", "b/seed0", "b/seed1"] and o.report["finished"] == 4
  assert work.trained == ["a/seed0", "a/seed1", "a/seed1", "b/seed0", "b/seed1"]
  assert "1 finished; this launch: 3 to run of 4" in lines[0] and "resuming" in lines[1]
  done_lines = [line for line in lines if "done in" in line]
  assert len(done_lines) == 3 and "[2/4] a/seed1" in done_lines[0] and "2 left" in done_lines[0]
  assert all("ETA" in line and "/run" in line for line in done_lines) and "0 left" in done_lines[-1]

  # A task added later: evaluated alone, nothing trained; then a rerun does nothing at all.
  n_train, n_eval = len(work.trained), len(work.evaluated)
  o = sweep.run_sweep(runs, out, tasks=tasks + ["STS13"], **kw)
  assert len(work.trained) == n_train and work.evaluated[n_eval:] == [
      (os.path.join(out, "runs", a, f"seed{s}"), ("STS13",)) for a in "ab" for s in (0, 1)]
  o = sweep.run_sweep(runs, out, tasks=tasks + ["STS13"], **kw)
  assert o.done == [] and len(work.trained) == n_train and len(work.evaluated) == n_eval + 4
  rows = {(r["arm"], r["task"]): r for r in o.report["rows"]}
  assert rows["a", "STS13"]["mean"] == pytest.approx(np.mean([15.0, 25.0]))

  # Only some runs (one launch per slice): the others are untouched, the report covers all.
  runs3 = _fake_runs(out, seeds=(0, 1, 2))
  o = sweep.run_sweep(runs3, out, tasks=tasks, todo=[r for r in runs3 if r.arm == "b" and r.seed == 2], **kw)
  assert o.done == ["b/seed2"] and o.report["finished"] == 5
  summary = json.loads((tmp_path / out / "results.json").read_text())
  assert [r["status"] for r in summary["runs"]] == ["finished"] * 2 + ["missing"] + ["finished"] * 3


def test_evaluate_run_passes_the_evaluation_options(monkeypatch):
  seen = {}

  class Enc:
    def encode(self, texts, batch_size):
      seen["batch_size"] = batch_size
      return np.zeros((len(texts), 2))

  def load(path, checkpoint):
    seen.update(path=path, checkpoint=checkpoint)
    return Enc()

  def evaluate(encode, tasks, data_dir, kfold):
    encode(["x"])
    seen.update(tasks=tasks, data_dir=data_dir, kfold=kfold)
    return {"tasks": {}}

  import st5_jax.encoder
  import st5_jax.evaluation
  monkeypatch.setattr(st5_jax.encoder.SentenceEncoder, "load", staticmethod(load))
  monkeypatch.setattr(st5_jax.evaluation, "evaluate", evaluate)
  sweep.evaluate_run("wd", ["MR"], data_dir="dd", kfold=3, batch_size=7, checkpoint="best")
  assert seen == {"path": "wd", "checkpoint": "best", "batch_size": 7, "tasks": ["MR"], "data_dir": "dd", "kfold": 3}


def test_command_line_builds_the_plan_and_passes_its_options(tmp_path, base_gin, monkeypatch, capsys):
  arms = tmp_path / "arms.txt"
  arms.write_text(ARMS)
  seen = {}

  def fake_run_sweep(runs, out, **kw):
    seen.update(runs=runs, out=out, **kw)
    return sweep.Outcome(done=[], report={"markdown": "table"})

  monkeypatch.setattr(sweep, "run_sweep", fake_run_sweep)
  argv = ["sweep", "--gin_file", base_gin, "--arms", str(arms), "--grid", "OptimizerConfig.learning_rate=1e-2,1e-3",
          "--seeds", "3", "--tasks", "STS12,sts13", "--select", "stsbenchmarkdev", "--out", str(tmp_path / "o"),
          "--only", "mean+learning_rate=1e-3,first+learning_rate=1e-2", "--seed_index", "2", "--max_runs", "5",
          "--data_dir", "dd",
          "--kfold", "4", "--batch_size", "32", "--checkpoint", "latest", "--no_progress",
          "--gin.TrainConfig.num_train_steps=4"]
  assert cli.main(argv) == 0
  runs = seen["runs"]
  assert len(runs) == 12 and [r.arm for r in runs[::3]] == [
      "first+learning_rate=1e-2", "first+learning_rate=1e-3", "mean+learning_rate=1e-2", "mean+learning_rate=1e-3"]
  assert [r.label for r in seen["todo"]] == ["first+learning_rate=1e-2/seed2", "mean+learning_rate=1e-3/seed2"]
  assert seen["tasks"] == ["STS12", "STS13", "STSBenchmarkDev"] and seen["select"] == "STSBenchmarkDev"
  assert seen["max_runs"] == 5 and seen["progress"] is False and seen["seeds"] == 3
  assert seen["eval_kwargs"] == {"data_dir": "dd", "kfold": 4, "batch_size": 32, "checkpoint": "latest"}
  assert runs[-1].bindings == ("TrainConfig.num_train_steps=4", "st5_model.pooling = 'enc_mean'",
                               "TASK_FEATURE_LENGTHS = {'inputs': 16, 'targets': 16}",
                               "OptimizerConfig.learning_rate=1e-3", "TrainConfig.seed = 2")
  assert seen["definition"]["arms"]["first+learning_rate=1e-2"] == [
      "st5_model.pooling = 'enc_first'", "OptimizerConfig.learning_rate=1e-2"]
  assert capsys.readouterr().out.strip() == "table"

  out = str(tmp_path / "o")
  for bad, message in ((["--only", "nope"], "no such arm"), (["--seed_index", "3"], "out of range"),
                       (["--seed_index", "x"], "integers"), (["--select", "sts"], "names one task"),
                       (["--select", "dev"], "names one task"),  # the dev suite holds three sets
                       (["--seeds", "0"], "at least 1"), (["--grid", "X.y"], "KEY=V1"), (["--bogus"], "unrecognized"),
                       (["--gin.TrainConfig.seed=1"], "binds TrainConfig.seed")):
    assert cli.main(["sweep", "--gin_file", base_gin, "--out", out, *bad]) == 2, bad
    assert message in capsys.readouterr().err
  # --report_only trains nothing: an empty report of the 2 arms x 2 seeds.
  assert cli.main(["sweep", "--gin_file", base_gin, "--arms", str(arms), "--seeds", "2", "--tasks", "STS12",
                   "--out", out, "--report_only"]) == 0
  assert "| first | 0/2 | - |" in capsys.readouterr().out
  assert not os.path.exists(os.path.join(out, "runs"))
  # --gin_search_path: where an arm's `include` is found.
  (tmp_path / "inc").mkdir()
  (tmp_path / "inc" / "extra.gin").write_text("TrainConfig.log_every = 9\n")
  arms.write_text("[x]\ninclude 'extra.gin'\n")
  argv = ["sweep", "--gin_file", base_gin, "--arms", str(arms), "--seeds", "1", "--tasks", "STS12", "--out", out,
          "--report_only"]
  assert cli.main(argv) == 2 and "extra.gin" in capsys.readouterr().err
  assert cli.main(argv + ["--gin_search_path", str(tmp_path / "inc")]) == 0
  assert gin.query_parameter("TrainConfig.log_every") == 9


# ------------------------------------------------------------------------------ end to end


def _sweep_argv(base_gin, arms, out):
  return ["sweep", "--gin_file", base_gin, "--arms", arms, "--seeds", "2", "--tasks", "STS16",
          "--select", "STSBenchmarkDev", "--out", str(out), "--no_progress", "--batch_size", "128",
          "--gin.TrainConfig.num_train_steps=4"]


def test_tiny_sweep_end_to_end_then_killed_and_rerun_gives_the_same_summary(tmp_path, base_gin, monkeypatch, capsys):
  arms = tmp_path / "arms.txt"
  arms.write_text(ARMS)
  straight = tmp_path / "straight"
  assert cli.main(_sweep_argv(base_gin, str(arms), straight)) == 0
  err = capsys.readouterr().err
  assert err.count("done in") == 4 and "[4/4] mean/seed1 done in" in err and "0 left" in err

  results = json.loads((straight / "results.json").read_text())
  assert results["finished"] == 4 and [r["status"] for r in results["runs"]] == ["finished"] * 4
  for r in results["runs"]:  # each run a normal `st5 train` work dir, of its arm's bindings and seed
    wd = straight / "runs" / r["arm"] / f"seed{r['seed']}"
    assert (wd / "checkpoints" / "4").is_dir() and json.loads((wd / "results.json").read_text())["last_step"] == 4
    operative = (wd / "operative_config.gin").read_text()
    assert f"TrainConfig.seed = {r['seed']}" in operative and f"'enc_{r['arm']}'" in operative
    record = json.loads((wd / "sweep_run.json").read_text())
    assert record["key"] == r["key"] and record["trained"]["step"] == 4 and record["bindings"][-1].endswith(
        str(r["seed"]))
  table = list(csv.DictReader((straight / "summary.csv").open()))
  assert [(t["arm"], t["task"]) for t in table] == [
      (a, t) for a in ("first", "mean") for t in ("STS16", "STSBenchmarkDev")]
  for t in table:
    v = np.array([r["values"][t["task"]] for r in results["runs"] if r["arm"] == t["arm"]])
    assert t["n"] == "2" and float(t["mean"]) == pytest.approx(v.mean(), abs=1e-4)
    assert float(t["std"]) == pytest.approx(v.std(ddof=1), abs=1e-4)
    assert (float(t["min"]), float(t["max"])) == pytest.approx((v.min(), v.max()), abs=1e-4)
  dev = {t["arm"]: float(t["mean"]) for t in table if t["task"] == "STSBenchmarkDev"}
  best = max(dev, key=dev.get)
  assert results["selected"] == best
  assert [(t["task"], t["role"]) for t in table if t["selected"] == "1"] == [("STS16", "test"),
                                                                            ("STSBenchmarkDev", "select")]
  md = (straight / "summary.md").read_text()
  assert next(line for line in md.splitlines() if line.startswith(f"| **{best}**")).count("†") == 1
  assert (straight / "summary.png").read_bytes().startswith(b"\x89PNG")

  # A rerun trains and evaluates nothing and writes the same summary.
  assert cli.main(_sweep_argv(base_gin, str(arms), straight)) == 0
  assert "0 to run of 4" in capsys.readouterr().err
  # The same sweep elsewhere, its first three runs finished by earlier launches (copied here), killed by
  # SIGTERM during the last run's training, then rerun: the same summary as the uninterrupted sweep.
  killed = tmp_path / "killed"
  for run in ("first/seed0", "first/seed1", "mean/seed0"):
    shutil.copytree(straight / "runs" / run, killed / "runs" / run)
  log_metrics = hooks.LogMetrics.__call__

  def kill_at_step_2(self, info):
    log_metrics(self, info)
    if info.step == 2:
      os.kill(os.getpid(), signal.SIGTERM)

  monkeypatch.setattr(hooks.LogMetrics, "__call__", kill_at_step_2)
  assert cli.main(_sweep_argv(base_gin, str(arms), killed)) == 143
  assert "mean/seed1 interrupted by SIGTERM at step 3" in capsys.readouterr().err
  wd = killed / "runs" / "mean" / "seed1"
  assert json.loads((wd / "sweep_run.json").read_text())["trained"] is None and (wd / "checkpoints" / "3").is_dir()
  monkeypatch.setattr(hooks.LogMetrics, "__call__", log_metrics)
  assert cli.main(_sweep_argv(base_gin, str(arms), killed)) == 0
  err = capsys.readouterr().err
  assert "3 finished; this launch: 1 to run of 4" in err and "mean/seed1 (key" in err and "resuming" in err
  # Resumed from step 3, not retrained: steps 1-3 logged before the kill, step 4 after.
  rows = [json.loads(line) for line in (wd / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if "train/loss" in r] == [1, 2, 3, 4]
  assert (killed / "summary.csv").read_text() == (straight / "summary.csv").read_text()
  assert (killed / "summary.md").read_text() == md
