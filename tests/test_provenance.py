"""Provenance (st5_jax/provenance.py): a resume with other bindings is refused unless allowed, every change is
recorded in config_history.json, and the first run's config files are never written over."""

import functools
import json

import gin
import pytest

import synthetic
from st5_jax import cli, provenance, train
from st5_jax.checkpoints import native
from st5_jax.export import model_card

gin.external_configurable(synthetic.factory, "provenance_test_pairs")



def _train(tmp_path, wd, steps, *flags):
  gin_file = tmp_path / f"run_{steps}.gin"
  gin_file.write_text(synthetic.tiny_run_gin("provenance_test_pairs", steps=steps,
                                             extra="TrainConfig.optimizer = @OptimizerConfig()"))
  return cli.main(["train", "--gin_file", str(gin_file), "--workdir", str(wd), "--no_progress", *flags])


def test_operative_bindings_parse_with_scopes_and_multi_line_values():
  text = """from __gin__ import dynamic_registration
# Parameters for run:
# ======
run.rules = \\
    (('batch', ('data', 'fsdp')),
     ('kv', None))
run.target = {'chips': 4, 'slice': 'v4-8'}
train/TrainConfig.eval_every = 5
st5_jax.data.options.data_dir = 'gs://b/d'
"""
  assert provenance.parse_bindings(text) == {
      "run.rules": "(('batch', ('data', 'fsdp')), ('kv', None))", "run.target": "{'chips': 4, 'slice': 'v4-8'}",
      "train/TrainConfig.eval_every": "5", "st5_jax.data.options.data_dir": "'gs://b/d'"}
  ok = provenance.allowed
  assert ok("train/TrainConfig.eval_every", "5", "10") and ok("MeshConfig.fsdp", "1", "2")
  assert ok("st5_jax.data.options.data_dir", "'a'", "'b'") and ok("run.target", None, "{}")
  assert ok("DataConfig.cache_dir", "'gs://a'", "'gs://b'") and not ok("DataConfig.cache_dir", "None", "'gs://b'")
  assert not ok("OptimizerConfig.learning_rate", "0.001", "0.5")
  assert not ok("TrainConfig.global_batch_size", "16", "32")


def test_a_changed_learning_rate_is_refused_then_resumed_with_the_flag_and_recorded(tmp_path, capsys):
  wd = tmp_path / "wd"
  assert _train(tmp_path, wd, 2) == 0
  operative, config = (wd / "operative_config.gin").read_text(), (wd / "config.gin").read_text()
  changed = ["--gin.OptimizerConfig.learning_rate=0.5", "--gin.TrainConfig.log_every=2"]

  capsys.readouterr()
  assert _train(tmp_path, wd, 4, *changed) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "OptimizerConfig.learning_rate: 0.001 -> 0.5" in err[0], err
  assert "TrainConfig.num_train_steps: 2 -> 4" in err[0] and "log_every" not in err[0]  # allowed: not listed
  assert "--allow_config_change" in err[0]
  assert native.committed_steps(wd) == [2] and not (wd / provenance.HISTORY_FILE).exists()

  assert _train(tmp_path, wd, 4, *changed, "--allow_config_change") == 0
  assert native.committed_steps(wd) == [2, 4]
  rows = [json.loads(line) for line in (wd / "metrics.jsonl").read_text().splitlines()]
  rates = {r["step"]: r["train/learning_rate"] for r in rows}
  assert rates[2] <= 0.001 < 0.01 < rates[4]  # trained on with the new rate
  history = json.loads((wd / provenance.HISTORY_FILE).read_text())["changes"]
  assert len(history) == 1 and history[0]["step"] == 2 and history[0]["allowed_by"] == "--allow_config_change"
  assert {"binding": "OptimizerConfig.learning_rate", "before": "0.001", "after": "0.5"} in history[0]["bindings"]
  assert {c["binding"] for c in history[0]["bindings"]} == {
      "OptimizerConfig.learning_rate", "TrainConfig.log_every", "TrainConfig.num_train_steps"}
  # The first run's record stays; train_config.json reports the history beside it.
  assert (wd / "operative_config.gin").read_text() == operative and (wd / "config.gin").read_text() == config
  recorded = json.loads((wd / "train_config.json").read_text())
  assert recorded["optimizer"]["learning_rate"] == 0.001 and recorded["config_history"] == history

  # The same command again: the recorded config is the changed one now, so nothing to refuse or record.
  assert _train(tmp_path, wd, 4, *changed) == 0
  assert json.loads((wd / provenance.HISTORY_FILE).read_text())["changes"] == history

  info = model_card.collect(config=native.read_config(wd), source=str(wd), source_format="native")
  card = model_card.render(info, export_format="savedmodel")
  assert "Changed from step 2 (--allow_config_change" in card
  assert "`OptimizerConfig.learning_rate` 0.001 -> 0.5" in card and "Settings at the start" in card


def test_an_allow_listed_change_resumes_without_the_flag_and_is_recorded(tmp_path, monkeypatch, caplog):
  wd = tmp_path / "wd"
  monkeypatch.setattr(train, "train", functools.partial(train.train, stop_after_steps=2))  # time-boxed: 2 of 4
  assert _train(tmp_path, wd, 4) == 0
  monkeypatch.undo()
  assert native.committed_steps(wd) == [2]

  # Another slice: the mesh and the target change at the same global batch size, and the logging cadence.
  moved = ["--gin.MeshConfig.data=4", "--gin.MeshConfig.fsdp=2", "--gin.TrainConfig.log_every=2",
           "--gin.run.target={'slice': 'v4-16'}"]
  with caplog.at_level("INFO"):
    assert _train(tmp_path, wd, 4, *moved) == 0
  assert "Resumed from" in caplog.text and native.committed_steps(wd) == [2, 4]
  history = json.loads((wd / provenance.HISTORY_FILE).read_text())["changes"]
  assert len(history) == 1 and (history[0]["step"], history[0]["allowed_by"]) == (2, "allow-list")
  assert {(c["binding"], c["before"], c["after"]) for c in history[0]["bindings"]} == {
      ("MeshConfig.data", "-1", "4"), ("MeshConfig.fsdp", "1", "2"), ("TrainConfig.log_every", "1", "2"),
      ("run.target", "None", "{'slice': 'v4-16'}")}
  assert history[0]["host"] and history[0]["time"]
  assert "MeshConfig.data = -1" in (wd / "operative_config.gin").read_text()
  assert json.loads((wd / "train_config.json").read_text())["log_every"] == 1


def test_a_run_that_starts_over_records_its_own_config(tmp_path):
  """No committed checkpoint: not a resume; the config files are the new run's and an old history goes."""
  wd = tmp_path / "wd"
  wd.mkdir()
  (wd / provenance.OPERATIVE_FILE).write_text("OptimizerConfig.learning_rate = 0.5\n")
  (wd / provenance.HISTORY_FILE).write_text(json.dumps({"changes": [{"step": 1, "bindings": []}]}))
  assert provenance.check_and_record(wd, config_text="a = 1\n", operative_text="a = 1\n") == []
  assert (wd / provenance.OPERATIVE_FILE).read_text() == "a = 1\n" and not (wd / provenance.HISTORY_FILE).exists()


def test_a_parameter_the_record_predates_is_no_change_at_its_default(tmp_path, monkeypatch):
  """An upgrade that adds a setting (Contrastive.matryoshka_dims) resumes an older work dir while the setting keeps
  its default (in the operative config, not bound in config.gin); binding it is a change like any other."""
  wd = tmp_path / "wd"
  wd.mkdir()
  (wd / provenance.OPERATIVE_FILE).write_text("Contrastive.temperature = 0.01\n")
  monkeypatch.setattr(native, "committed_steps", lambda _: [2])
  now = "Contrastive.matryoshka_dims = ()\nContrastive.temperature = 0.01\n"
  assert provenance.check_and_record(wd, config_text="Contrastive.temperature = 0.01\n", operative_text=now) == []
  bound = "Contrastive.matryoshka_dims = (64, 32)\n"
  with pytest.raises(provenance.ConfigChangeError, match=r"Contrastive.matryoshka_dims: \(unset\) -> \(64, 32\)"):
    provenance.check_and_record(wd, config_text=bound, operative_text=bound + "Contrastive.temperature = 0.01\n")


@pytest.fixture(autouse=True)
def _fresh_gin():
  yield
  gin.clear_config()
