"""ConSERT through the entry points: every gin/consert_*.gin file parses and builds the step it
describes (dry: traced, never run), the AOT batch of each objective, and a tiny end-to-end
`st5 train` from the gin files through the real consert_* seqio tasks."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from st5_jax import aot, configs, flops, gin_config, partitioning, train
from st5_jax.objectives import ConsertJoint, ConsertUnsup
from st5_jax.commands.train import parse_gin
from st5_jax.features import LABELS, LEFT, RIGHT

REPO = pathlib.Path(__file__).resolve().parents[1]
CONSERT_GIN = sorted(p.name for p in (REPO / "gin").glob("consert_*.gin"))
RECIPES = ("unsup", "joint", "sup_unsup", "joint_unsup")
# (view1, rate1, view2, rate2, model dropout) of the official scripts (yym6472/ConSERT scripts/):
# unsup-consert-base.sh, sup-consert-joint-base.sh, sup-consert-sup-unsup-*.sh, sup-consert-joint-unsup-*.sh.
VIEWS = {"unsup": ("feature_cutoff", 0.2, "shuffle", 0.0, 0.0),
         "joint": ("none", 0.0, "token_cutoff", 0.1, 0.1),
         "sup_unsup": ("none", 0.0, "feature_cutoff", 0.1, 0.1),
         "joint_unsup": ("none", 0.0, "shuffle", 0.0, 0.1)}


def _recipe(name):
  return name[len("consert_"):].rsplit("_", 1)[0].replace("_tiny", "")


def _spec(name, *bindings):
  parse_gin([name], list(bindings))
  spec = gin_config.run_spec()
  if spec.init_from is gin_config.gin.REQUIRED:  # two-step TPU recipes: the first step's work dir
    parse_gin([name], ["run.init_from = 'gs://bucket/first_step'", *bindings])
    spec = gin_config.run_spec()
  return spec


def test_the_four_recipes_exist_for_cpu_base_and_large():
  assert CONSERT_GIN == sorted(f"consert_{r}_{s}.gin" for r in RECIPES for s in ("base", "large", "tiny_cpu"))


@pytest.mark.parametrize("name", CONSERT_GIN)
def test_consert_gin_files_describe_the_official_recipes(name):
  recipe = _recipe(name)
  spec = _spec(name)
  tc, model = spec.train_config, spec.model
  joint = recipe == "joint"
  obj = tc.objective
  assert type(obj) is (ConsertJoint if joint else ConsertUnsup)
  if joint:
    assert obj.nli_classes == 3
  assert (obj.temperature, obj.weight) == (0.1, 0.15)
  view1, rate1, view2, rate2, dropout = VIEWS[recipe]
  assert (obj.view1, obj.view1_rate, obj.view2, obj.view2_rate) == (view1, rate1, view2, rate2)
  # Unlabelled single sentences for NT-Xent only; premise, hypothesis (and label) for joint.
  lengths = dict(spec.data.feature_lengths)
  assert set(lengths) == ({"inputs", "targets"} if joint else {"inputs"})
  assert spec.data.task == ("consert_sts_sentences" if not joint else
                            "consert_snli_devtest_pairs" if "tiny" in name else "consert_snli_mnli_pairs")
  assert model.pooling == "enc_mean"
  if name.endswith("tiny_cpu.gin"):
    assert model.t5.dtype == "float32" and model.t5.dropout_rate == 0.0  # CPU speed
    # The demo's model, so sup-unsup can start from workdirs/st5_tiny_cpu.
    demo = _spec("st5_tiny_cpu.gin").model
    assert model == demo
    assert spec.init_from == {"sup_unsup": "workdirs/st5_tiny_cpu",
                              "joint_unsup": "workdirs/consert_joint_tiny_cpu"}.get(recipe)
    return
  size = "t5_large" if name.endswith("_large.gin") else "t5_base"
  assert model.t5 == configs.t5_size(size, dtype="bfloat16", dropout_rate=dropout, scan_layers=True,
                                     remat_policy="full")
  assert tc.global_batch_size == 96
  assert lengths["inputs"] == (40 if name == "consert_joint_unsup_large.gin" else 64)
  # ConSERT has no projection head; sup-unsup keeps the ST5 NLI model's 768-d projection.
  assert model.embedding_dim == (768 if recipe == "sup_unsup" else None)
  if recipe in ("unsup", "joint"):
    assert spec.init_from.startswith(f"gs://t5-data/pretrained_models/t5x/{size}/")
  else:
    assert spec.init_from == "gs://bucket/first_step"
  assert aot.topology_for_slice(spec.target["slice"]) == spec.target["topology"]
  # ConSERT's epochs in steps of 96: 10 x 930 on the STS sentences (25 for sup-unsup), 1 of AllNLI.
  assert tc.num_train_steps == {"unsup": 9300, "joint": 9814, "sup_unsup": 23250, "joint_unsup": 9300}[recipe]


@pytest.mark.parametrize("name", CONSERT_GIN)
def test_consert_gin_files_build_and_trace_their_step(name):
  # The trainer's own build on 8 fake CPU devices, and the jitted step traced on the abstract
  # batch `st5 aot` uses: the objective finds every feature it reads (LABELS for joint).
  spec = _spec(name)
  tc = spec.train_config
  mesh = partitioning.make_mesh(spec.mesh)
  setup = train.build(spec.model, tc, mesh, spec.rules)
  batch = aot.abstract_batch(mesh, tc.global_batch_size, dict(spec.data.feature_lengths), objective=tc.objective)
  assert set(batch) == ({LEFT, RIGHT, LABELS} if tc.objective.name == "consert_joint" else {LEFT})
  state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                       setup.abstract_state, setup.state_shardings)
  with jax.set_mesh(mesh):
    _, metrics = jax.eval_shape(setup.step_fn, state, batch)
  assert {"loss", "accuracy", "grad_norm"} <= set(metrics)
  if tc.objective.name == "consert_joint":
    assert {"nli_loss", "nt_xent_premise", "nt_xent_hypothesis"} <= set(metrics)
    assert "nli_classifier" in setup.abstract_state.params


def test_abstract_batch_and_flops_follow_the_objective():
  mesh = partitioning.make_mesh(partitioning.MeshConfig())
  lengths = {"inputs": 8, "targets": 6}
  unsup = aot.abstract_batch(mesh, 16, {"inputs": 8}, objective="consert_unsup")
  assert {k: v.shape for k, v in unsup.items()} == {LEFT: (16, 8)}
  joint = aot.abstract_batch(mesh, 16, lengths, objective="consert_joint")
  assert {k: (v.shape, v.dtype) for k, v in joint.items()} == {
      LEFT: ((16, 8), np.int32), RIGHT: ((16, 6), np.int32), LABELS: ((16,), np.int32)}
  with pytest.raises(ValueError, match="needs a 'targets' length"):
    aot.abstract_batch(mesh, 16, {"inputs": 8}, objective="consert_joint")
  cfg = configs.ST5Config(t5=configs.t5_size("t5_tiny"), embedding_dim=16)
  enc = flops.encoder_forward_flops
  # Two views of each sentence set, forward + backward, plus the [2B, 2B] similarities.
  assert ConsertUnsup().step_flops(cfg, global_batch_size=16, lengths={"inputs": 8}) == (
      3 * (2 * 16 * enc(cfg, 8) + 2 * 32 ** 2 * 16))
  assert ConsertJoint().step_flops(cfg, global_batch_size=16, lengths=lengths) == (
      3 * (2 * 16 * (enc(cfg, 8) + enc(cfg, 6)) + 2 * 2 * 32 ** 2 * 16))


def test_gin_binds_the_nli_classes_of_the_joint_objective():
  parse_gin(["consert_joint_tiny_cpu.gin"], ["ConsertJoint.nli_classes = 4"])
  assert gin_config.run_spec().train_config.objective.nli_classes == 4


AOT_TINY = """
include 'consert_joint_tiny_cpu.gin'
include 'models/t5_tiny.gin'
st5_model.embedding_dim = 32
st5_model.dtype = 'bfloat16'
TASK_FEATURE_LENGTHS = {'inputs': 16, 'targets': 16}
TrainConfig.global_batch_size = 32
run.target = {'slice': 'v4-8', 'topology': 'v4:2x2x1'}
"""


def test_aot_compiles_the_consert_joint_step_for_a_tpu_topology(tmp_path):
  gin_file = tmp_path / "consert_aot.gin"
  gin_file.write_text(AOT_TINY)
  env = dict(os.environ)
  env.pop("JAX_PLATFORMS", None)  # compile-only TPU devices need the TPU plugin
  out = subprocess.run([sys.executable, "-m", "st5_jax.cli", "aot", "--gin", str(gin_file), "--json",
                        str(tmp_path / "aot.json")],
                       capture_output=True, text=True, env=env, timeout=900)
  assert out.returncode == 0, out.stderr[-3000:]
  report = json.loads((tmp_path / "aot.json").read_text())
  assert report["fits"] and report["devices"] == 4 and report["lengths"] == {"inputs": 16, "targets": 16}
  assert report["step_flops"] > 0


# ------------------------------------------------------------------------- end to end

TINY_MODEL = ["--gin.st5_model.size='t5_tiny'", "--gin.st5_model.embedding_dim=16",
              "--gin.TrainConfig.global_batch_size=16", "--gin.TrainConfig.num_train_steps=3",
              "--gin.TrainConfig.checkpoint_every=3", "--gin.TrainConfig.log_every=1",
              "--gin.TrainConfig.eval_every=-1"]


def _st5_train(gin_file, workdir, *overrides):
  env = dict(os.environ)
  # A fresh compile per process (see tests/test_consert.py: cached two-view executables can
  # deadlock on CPU meshes).
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  out = subprocess.run([sys.executable, "-m", "st5_jax.cli", "train", "--gin_file", gin_file, "--workdir",
                        str(workdir), "--no_progress", *TINY_MODEL, *overrides],
                       capture_output=True, text=True, env=env, timeout=900, cwd=REPO)
  assert out.returncode == 0, out.stderr[-4000:]
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  return [r for r in rows if "train/loss" in r]


def test_consert_recipes_train_end_to_end_from_the_gin_files(tmp_path):
  # consert_joint on the labelled SNLI pairs (LEFT, RIGHT, LABELS), then consert_unsup on the
  # 89,192 STS sentences (LEFT only) from its work dir: the joint-unsup recipe, through the
  # real seqio tasks, `st5 train`, checkpoints and run.init_from.
  joint_dir, unsup_dir = tmp_path / "joint", tmp_path / "joint_unsup"
  rows = _st5_train("consert_joint_tiny_cpu.gin", joint_dir, "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 12}")
  assert [r["step"] for r in rows] == [1, 2, 3]
  assert all(np.isfinite(r["train/loss"]) and r["train/nli_loss"] > 0 and r["train/nt_xent_premise"] > 0
             for r in rows)
  assert json.loads((joint_dir / "train_config.json").read_text())["objective"]["name"] == "consert_joint"
  assert "nli_classes" not in json.loads((joint_dir / "st5_config.json").read_text())  # the head is the objective's

  rows = _st5_train("consert_joint_unsup_tiny_cpu.gin", unsup_dir, f"--gin.run.init_from='{joint_dir}'",
                    "--gin.TASK_FEATURE_LENGTHS={'inputs': 16}")
  assert [r["step"] for r in rows] == [1, 2, 3]
  assert all(np.isfinite(r["train/loss"]) and r["train/nt_xent"] > 0 for r in rows)
  assert "train/nli_loss" not in rows[0]
  operative = (unsup_dir / "operative_config.gin").read_text()
  assert "DataConfig.task = 'consert_sts_sentences'" in operative
  summary = json.loads((unsup_dir / "results.json").read_text())
  assert summary["init_from"] == str(joint_dir) and summary["last_step"] == 3
  # The continuation has no NLI head (the loader dropped the joint model's) and saved step 3.
  assert "nli_classes" not in json.loads((unsup_dir / "st5_config.json").read_text())
  assert (unsup_dir / "checkpoints" / "3").is_dir()
