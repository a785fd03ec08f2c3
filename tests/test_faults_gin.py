"""Faults: gin mistakes are one line naming the file and the binding, before any data or compile."""

import gin
import pytest

from st5_jax import gin_config

BASE = """
run.model = @st5_model()
st5_model.size = 't5_tiny'
run.train_config = @TrainConfig()
TrainConfig.num_train_steps = 10
TrainConfig.global_batch_size = 16
run.data = @DataConfig()
DataConfig.task = 'never_read'
DataConfig.feature_lengths = {'inputs': 4}
"""


@pytest.fixture
def gin_dir(tmp_path, monkeypatch):
  gin.clear_config()
  (tmp_path / "base.gin").write_text(BASE)
  monkeypatch.chdir(tmp_path)
  yield tmp_path
  gin.clear_config()


def _spec(gin_dir, text, *bindings):
  (gin_dir / "run.gin").write_text(text)
  gin_config.parse(["run.gin"], list(bindings))
  return gin_config.run_spec()


def _error(gin_dir, text, *bindings):
  with pytest.raises(gin_config.GinConfigError) as err:
    _spec(gin_dir, text, *bindings)
  msg = str(err.value)
  assert "\n" not in msg, msg
  return msg


def test_a_good_file_parses(gin_dir):
  spec = _spec(gin_dir, "include 'base.gin'\nTrainConfig.num_train_steps = 5\n")
  assert spec.train_config.num_train_steps == 5 and spec.data.task == "never_read"


def test_unknown_key(gin_dir):
  msg = _error(gin_dir, "include 'base.gin'\n\nTrainConfig.num_train_step = 5\n")
  assert msg.startswith("run.gin:3: TrainConfig.num_train_step = 5: ") and "num_train_step" in msg


def test_unknown_configurable(gin_dir):
  msg = _error(gin_dir, "include 'base.gin'\nTrainConfg.num_train_steps = 5\n")
  assert msg.startswith("run.gin:2: TrainConfg.num_train_steps = 5: No configurable matching 'TrainConfg'")


def test_unknown_key_in_an_included_file_names_that_file(gin_dir):
  (gin_dir / "inc.gin").write_text("include 'base.gin'\nOptimizerConfig.learnin_rate = 1.0\n")
  msg = _error(gin_dir, "include 'inc.gin'\n")
  assert msg.startswith("inc.gin:2: OptimizerConfig.learnin_rate = 1.0: ")


@pytest.mark.parametrize("binding,expected", [
    ("TrainConfig.num_train_steps = 'ten'", "TrainConfig.num_train_steps = 'ten': expected int, got str"),
    ("TrainConfig.log_every = '10'", "TrainConfig.log_every = '10': expected int, got str"),
    ("TrainConfig.grad_cache_chunks = 1.5", "TrainConfig.grad_cache_chunks = 1.5: expected int, got float"),
    ("MeshConfig.data = 2.0", "MeshConfig.data = 2.0: expected int, got float"),
    ("DataConfig.task = 3", "DataConfig.task = 3: expected str, got int"),
    ("Contrastive.temperature = '0.01'", "Contrastive.temperature = '0.01': expected float, got str"),
    ("Contrastive.bidirectional = 1", "Contrastive.bidirectional = 1: expected bool, got int"),
])
def test_wrong_type_names_file_line_and_binding(gin_dir, binding, expected):
  msg = _error(gin_dir, f"include 'base.gin'\nrun.mesh = @MeshConfig()\n{binding}\n")
  assert msg == f"run.gin:3: {expected}", msg


def test_wrong_type_in_a_nested_config(gin_dir):
  msg = _error(gin_dir, "include 'base.gin'\nTrainConfig.optimizer = @OptimizerConfig()\n"
                        "OptimizerConfig.learning_rate = 'fast'\n")
  assert msg == "run.gin:3: OptimizerConfig.learning_rate = 'fast': expected float, got str", msg


def test_wrong_type_from_the_command_line(gin_dir):
  msg = _error(gin_dir, "include 'base.gin'\n", "TrainConfig.global_batch_size = '16'")
  assert "TrainConfig.global_batch_size = '16': expected int, got str" in msg


def test_an_int_where_a_float_is_expected_is_fine(gin_dir):
  assert _spec(gin_dir, "include 'base.gin'\nContrastive.temperature = 1\n").train_config.objective.temperature == 1


def test_missing_include(gin_dir):
  msg = _error(gin_dir, "include 'base.gin'\ninclude 'nope.gin'\n")
  assert msg.startswith("run.gin:2: include 'nope.gin': Unable to open file: nope.gin.")


def test_required_left_unset(gin_dir):
  text = "\n".join(l for l in BASE.splitlines() if not l.startswith("run.data"))
  msg = _error(gin_dir, text)
  assert msg == "run.gin: run.data is REQUIRED but not bound (e.g. `run.data = ...`)", msg


def test_syntax_error(gin_dir):
  msg = _error(gin_dir, "include 'base.gin'\nTrainConfig.num_train_steps = = 5\n")
  assert msg.startswith("run.gin:2:"), msg


def test_mistakes_surface_before_data_or_compile(gin_dir, tmp_path, monkeypatch):
  """train_from_gin raises the mistake before the trainer (which reads data and compiles) starts."""
  from st5_jax import train
  called = []
  monkeypatch.setattr(train, "train", lambda **kw: called.append(kw))
  (gin_dir / "run.gin").write_text("include 'base.gin'\nTrainConfig.num_train_steps = '10'\n")
  gin_config.parse(["run.gin"], [])
  with pytest.raises(gin_config.GinConfigError, match="run.gin:2: TrainConfig.num_train_steps"):
    gin_config.train_from_gin(workdir=str(tmp_path / "wd"))
  assert called == [] and not (tmp_path / "wd").exists()
