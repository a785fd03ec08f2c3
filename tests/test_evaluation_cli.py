"""`st5 eval` with fake encoders patched in place of st5_jax.encoder.SentenceEncoder."""

import json
import sys
import types

import pytest

from st5_jax import cli
from st5_jax.evaluation import report
from st5_jax.evaluation.baselines import HashedBagOfWords

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture()
def fake_encoder_module(monkeypatch):
  """Replaces st5_jax.encoder with a module whose SentenceEncoder.load records its calls."""
  calls = []

  class FakeSentenceEncoder:
    def __init__(self, dim):
      self.bow = HashedBagOfWords(dim)
      self.batch_sizes = []

    @classmethod
    def load(cls, path, **kwargs):
      calls.append((path, kwargs))
      return cls(32 if path.endswith("big") else 16)

    def encode(self, texts, batch_size=None):
      self.batch_sizes.append(batch_size)
      return self.bow(texts)

  module = types.ModuleType("st5_jax.encoder")
  module.SentenceEncoder = FakeSentenceEncoder
  monkeypatch.setitem(sys.modules, "st5_jax.encoder", module)
  return calls


def test_eval_registered():
  parser = cli.build_parser()
  args = parser.parse_args(["eval", "--model", "m", "--output", "r.json"])
  assert args.tasks is None and callable(args.run)  # None: the default suites, or only --mteb's tasks
  from st5_jax.commands import eval as eval_command
  assert eval_command.DEFAULT_TASKS == "sts,transfer,sentglue,geometry"


def test_eval_two_models_then_compare(fake_encoder_module, data_dir, tmp_path):
  out = tmp_path / "results.json"
  rc = cli.main(["eval", "--model", f"{tmp_path}/small,{tmp_path}/big", "--tasks", "sts,geometry,CR",
                 "--data_dir", str(data_dir), "--output", str(out), "--kfold", "2", "--batch_size", "8",
                 "--pooling", "enc_mean"])
  assert rc == 0
  assert [c[0] for c in fake_encoder_module] == [f"{tmp_path}/small", f"{tmp_path}/big"]
  assert all(c[1] == {"pooling": "enc_mean"} for c in fake_encoder_module)  # unset options are not passed

  payload = json.loads(out.read_text())
  assert list(payload["models"]) == ["small", "big"]
  tasks = ["STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness", "AlignUniform", "CR"]
  for res in payload["models"].values():
    assert set(res["tasks"]) == set(tasks)
    assert res["source"].endswith(("small", "big"))
  assert payload["models"]["big"]["meta"]["dim"] == 32
  md = out.with_suffix(".md").read_text()
  assert "| Task | Metric | small | big |" in md
  assert all(f"| {t} |" in md for t in tasks if t != "AlignUniform") and "| uniformity" in md
  for png in ("results_tasks.png", "results_align_uniform.png"):
    assert (tmp_path / png).read_bytes()[:8] == PNG_MAGIC

  # A third model, shown beside the two earlier ones without re-running them.
  out2 = tmp_path / "more.json"
  assert cli.main(["eval", "--model", f"{tmp_path}/other", "--name", "third", "--tasks", "STSBenchmark,geometry",
                   "--data_dir", str(data_dir), "--output", str(out2), "--compare", str(out),
                   "--checkpoint", "best"]) == 0
  assert fake_encoder_module[-1] == (f"{tmp_path}/other", {"checkpoint": "best"})
  models = report.load_results(out2)
  assert list(models) == ["third", "small", "big"]
  assert models["small"] == payload["models"]["small"]
  assert "| Task | Metric | third | small | big |" in out2.with_suffix(".md").read_text()
  assert (tmp_path / "more_align_uniform.png").read_bytes()[:8] == PNG_MAGIC

  # Only earlier results: tables and plots, no model loaded.
  n_loads = len(fake_encoder_module)
  assert cli.main(["eval", "--compare", f"{out},{out2}", "--output", str(tmp_path / "merged.json")]) == 0
  assert len(fake_encoder_module) == n_loads
  assert len(report.load_results(tmp_path / "merged.json")) == 5


def test_bad_task_fails_before_loading(fake_encoder_module, data_dir, tmp_path, capsys):
  assert cli.main(["eval", "--model", "m", "--tasks", "sts,bogus", "--data_dir", str(data_dir),
                   "--output", str(tmp_path / "r.json")]) == 2
  assert "unknown task" in capsys.readouterr().err
  assert fake_encoder_module == []


def test_plots_without_optional_parts(tmp_path):
  # One STS task and no geometry: the task plot is drawn, the alignment plot is skipped.
  res = {"tasks": {"STS12": {"main": 50.0, "metric": "spearman_all", "spearman_all": 50.0, "spearman_mean": 49.0}},
         "summary": {"sts": {"mean": 50.0, "n_tasks": 1, "complete": False}}, "meta": {}}
  written = report.write_all({"m": res}, tmp_path / "r.json")
  assert "tasks_png" in written and "align_uniform_png" not in written
  assert "50.00 (1 tasks)" in (tmp_path / "r.md").read_text()


def test_benchmark_script_writes_table(data_dir, tmp_path, capsys):
  import importlib.util
  import pathlib

  path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "eval_suite.py"
  spec = importlib.util.spec_from_file_location("eval_suite", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  md = tmp_path / "results.md"
  assert module.main(["--fake", "--dim", "16", "--tasks", "STSBenchmarkDev,STS12", "--data_dir", str(data_dir),
                      "--markdown", str(md), "--json", str(tmp_path / "r.json")]) == 0
  text = md.read_text()
  assert "| STS12 |" in text and "| STSBenchmarkDev |" in text and "Wall time" in text
  assert "wall" in capsys.readouterr().out
  assert list(report.load_results(tmp_path / "r.json")) == ["hashed-bow-16"]


def _geometry_result(sts_mean: float, align: float, uniform: float) -> dict:
  return {"tasks": {"AlignUniform": {"alignment": align, "uniformity": uniform, "split": "test"}},
          "summary": {"sts": {"mean": sts_mean, "n_tasks": 7, "complete": True}}, "meta": {}}


def _colour_bar(fig):
  (cbar_ax,) = [a for a in fig.axes if a.get_label() == "<colorbar>"]
  fig.canvas.draw()
  ticks = [t for t in cbar_ax.get_yticks() if cbar_ax.get_ylim()[0] - 1e-9 <= t <= cbar_ax.get_ylim()[1] + 1e-9]
  return cbar_ax, ticks


def test_align_uniform_colour_bar_of_one_model_is_readable(tmp_path):
  import matplotlib.pyplot as plt

  fig = report.align_uniform_figure({"only": _geometry_result(52.6, 0.31, -2.4)})
  cbar_ax, ticks = _colour_bar(fig)
  lo, hi = cbar_ax.get_ylim()
  assert lo < 52.6 < hi and 0.5 <= hi - lo <= 5  # a range around the value, not 1e-6 wide
  assert cbar_ax.yaxis.get_offset_text().get_text() == ""  # no '1e-7+5.26e1' over the title
  labels = [float(t.get_text().replace("\u2212", "-")) for t in cbar_ax.get_yticklabels() if t.get_text()]
  assert len(ticks) >= 2 and labels and all(abs(v - 52.6) < 3 for v in labels)  # not 0..8
  assert fig.axes[0].xaxis.get_offset_text().get_text() == ""
  plt.close(fig)
  # Two models keep their own range.
  fig = report.align_uniform_figure({"a": _geometry_result(70.0, 0.2, -3.0), "b": _geometry_result(80.0, 0.3, -3.5)})
  cbar_ax, _ = _colour_bar(fig)
  assert cbar_ax.get_ylim() == (70.0, 80.0)
  plt.close(fig)
  assert report.plot_align_uniform({"only": _geometry_result(52.6, 0.31, -2.4)}, tmp_path / "au.png")
  assert (tmp_path / "au.png").read_bytes()[:8] == PNG_MAGIC
