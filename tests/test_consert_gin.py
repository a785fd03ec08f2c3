"""ConSERT through the entry points: every gin/consert_*.gin file parses and builds the step it
describes (dry: traced, never run), the AOT batch of each objective, and a tiny end-to-end
`st5 train` from the gin files through the real consert_* seqio tasks."""

import itertools
import json
import math
import os
import pathlib
import subprocess
import sys
from typing import NamedTuple

import jax
import numpy as np
import pytest

from st5_jax import aot, configs, flops, gin_config, hooks, optim, partitioning, train
from st5_jax.objectives import ConsertJoint, ConsertUnsup
from st5_jax.gin_config import parse_gin
from st5_jax.features import LABELS, LEFT, RIGHT

REPO = pathlib.Path(__file__).resolve().parents[1]
CONSERT_GIN = sorted(p.name for p in (REPO / "gin").glob("consert_*.gin"))
RECIPES = ("unsup", "joint", "sup_unsup", "joint_unsup")

# ------------------------------------------------------------- the official runs, as tabled

# Rows of OUR training data for the scripts' --train_data (the epoch sizes the gin headers use):
# consert_sts_sentences 'train', the official `stssick` texts (main.py:219-222, --no_pair);
STS_SENTENCES = 89_192
# consert_snli_mnli_pairs, SNLI + MultiNLI train gold-labelled pairs, the official `nli` default
# (main.py:48, 204-218: AllNLI train split); ceil(942,069 / 96) = 9814, the official run's count
# too (sentence_transformers/losses/AdvCLSoftmaxLoss.py:13 "global_step=9814").
ALLNLI_PAIRS = 549_367 + 392_702
BERT_DROPOUT = 0.1  # BERT's hidden/attention dropout, kept unless --no_dropout (main.py:181, 187)


class Official(NamedTuple):
  script: str
  views: tuple  # (view1, rate1, view2, rate2) of the two NT-Xent views
  dropout: float
  batch: int
  max_len: int
  epochs: int
  rows: int  # training rows (our data) of the script's --train_data
  lr: float
  temperature: float
  cl_rate: float  # the loss weight (ConsertUnsup/ConsertJoint.weight)
  eval_steps: int  # STS-B dev every N steps (TrainConfig.eval_every)
  patience: int | None  # early stopping after N evaluations without improvement; None: none


# yym6472/ConSERT at 03c9e8f. Every script is one command line, so each value is on line 1.
# How the flags become views: --data_augmentation_strategy shuffle / cutoff makes view 1 the plain
# forward pass ('none') and view 2 the augmented one (AdvCLSoftmaxLoss.py:772-777); cutoff
# --cutoff_direction row is token cutoff, column is feature cutoff (AdvCLSoftmaxLoss.py:436-446);
# --da_final_1/2 name the two views directly (AdvCLSoftmaxLoss.py:714-715). Shuffle has no rate.
OFFICIAL = {
    ("unsup", "base"): Official(
        script="scripts/unsup-consert-base.sh",
        views=("feature_cutoff", 0.2, "shuffle", 0.0),  # scripts/unsup-consert-base.sh:1 --da_final_1 feature_cutoff --cutoff_rate_final_1 0.2 --da_final_2 shuffle
        dropout=0.0,  # scripts/unsup-consert-base.sh:1 --no_dropout (main.py:184-185)
        batch=96,  # scripts/unsup-consert-base.sh:1 --batch_size 96
        max_len=64,  # scripts/unsup-consert-base.sh:1 --max_seq_length 64
        epochs=10,  # scripts/unsup-consert-base.sh:1 --num_epochs 10
        rows=STS_SENTENCES,  # scripts/unsup-consert-base.sh:1 --train_data stssick --no_pair
        lr=5e-7,  # scripts/unsup-consert-base.sh:1 --learning_rate 0.0000005
        temperature=0.1,  # scripts/unsup-consert-base.sh:1 --temperature 0.1
        cl_rate=0.15,  # scripts/unsup-consert-base.sh:1 --cl_rate 0.15
        eval_steps=200,  # scripts/unsup-consert-base.sh:1 --evaluation_steps 200
        patience=10),  # scripts/unsup-consert-base.sh:1 --patience 10
    ("unsup", "large"): Official(
        script="scripts/unsup-consert-large.sh",
        views=("none", 0.0, "shuffle", 0.0),  # scripts/unsup-consert-large.sh:1 --data_augmentation_strategy shuffle
        dropout=BERT_DROPOUT,  # scripts/unsup-consert-large.sh:1 no --no_dropout (main.py:187)
        batch=96,  # scripts/unsup-consert-large.sh:1 --batch_size 96
        max_len=64,  # scripts/unsup-consert-large.sh:1 --max_seq_length 64
        epochs=25,  # scripts/unsup-consert-large.sh:1 --num_epochs 25
        rows=STS_SENTENCES,  # scripts/unsup-consert-large.sh:1 --train_data stssick --no_pair
        lr=5e-7,  # scripts/unsup-consert-large.sh:1 --learning_rate 0.0000005
        temperature=0.1,  # scripts/unsup-consert-large.sh:1 --temperature 0.1
        cl_rate=0.15,  # scripts/unsup-consert-large.sh:1 --cl_rate 0.15
        eval_steps=100,  # scripts/unsup-consert-large.sh:1 --evaluation_steps 100
        patience=10),  # scripts/unsup-consert-large.sh:1 --patience 10
    ("joint", "base"): Official(
        script="scripts/sup-consert-joint-base.sh",
        views=("none", 0.0, "token_cutoff", 0.1),  # scripts/sup-consert-joint-base.sh:1 --data_augmentation_strategy cutoff --cutoff_direction row --cutoff_rate 0.1
        dropout=BERT_DROPOUT,  # scripts/sup-consert-joint-base.sh:1 no --no_dropout (main.py:187)
        batch=96,  # scripts/sup-consert-joint-base.sh:1 --batch_size 96
        max_len=64,  # scripts/sup-consert-joint-base.sh:1 --max_seq_length 64
        epochs=1,  # main.py:64 default (the script gives no --num_epochs)
        rows=ALLNLI_PAIRS,  # main.py:48 default --train_data nli (the script gives none)
        lr=2e-5,  # main.py:65 default (the script gives no --learning_rate)
        temperature=0.1,  # scripts/sup-consert-joint-base.sh:1 --temperature 0.1
        cl_rate=0.15,  # scripts/sup-consert-joint-base.sh:1 --cl_rate 0.15
        eval_steps=200,  # scripts/sup-consert-joint-base.sh:1 --evaluation_steps 200
        patience=None),  # main.py:105 default (the script gives no --patience)
    ("joint", "large"): Official(
        script="scripts/sup-consert-joint-large.sh",
        views=("none", 0.0, "token_cutoff", 0.1),  # scripts/sup-consert-joint-large.sh:1 --data_augmentation_strategy cutoff --cutoff_direction row --cutoff_rate 0.1
        dropout=BERT_DROPOUT,  # scripts/sup-consert-joint-large.sh:1 no --no_dropout (main.py:187)
        batch=96,  # scripts/sup-consert-joint-large.sh:1 --batch_size 96
        max_len=40,  # scripts/sup-consert-joint-large.sh:1 --max_seq_length 40
        epochs=1,  # main.py:64 default (the script gives no --num_epochs)
        rows=ALLNLI_PAIRS,  # main.py:48 default --train_data nli (the script gives none)
        lr=2e-5,  # main.py:65 default (the script gives no --learning_rate)
        temperature=0.1,  # scripts/sup-consert-joint-large.sh:1 --temperature 0.1
        cl_rate=0.15,  # scripts/sup-consert-joint-large.sh:1 --cl_rate 0.15
        eval_steps=200,  # scripts/sup-consert-joint-large.sh:1 --evaluation_steps 200
        patience=None),  # main.py:105 default (the script gives no --patience)
    ("sup_unsup", "base"): Official(
        script="scripts/sup-consert-sup-unsup-base.sh",
        views=("none", 0.0, "feature_cutoff", 0.1),  # scripts/sup-consert-sup-unsup-base.sh:1 --data_augmentation_strategy cutoff --cutoff_direction column --cutoff_rate 0.1
        dropout=BERT_DROPOUT,  # scripts/sup-consert-sup-unsup-base.sh:1 no --no_dropout (main.py:181)
        batch=96,  # scripts/sup-consert-sup-unsup-base.sh:1 --batch_size 96
        max_len=64,  # scripts/sup-consert-sup-unsup-base.sh:1 --max_seq_length 64
        epochs=25,  # scripts/sup-consert-sup-unsup-base.sh:1 --num_epochs 25
        rows=STS_SENTENCES,  # scripts/sup-consert-sup-unsup-base.sh:1 --train_data stssick --no_pair
        lr=5e-7,  # scripts/sup-consert-sup-unsup-base.sh:1 --learning_rate 0.0000005
        temperature=0.1,  # scripts/sup-consert-sup-unsup-base.sh:1 --temperature 0.1
        cl_rate=0.15,  # scripts/sup-consert-sup-unsup-base.sh:1 --cl_rate 0.15
        eval_steps=200,  # scripts/sup-consert-sup-unsup-base.sh:1 --evaluation_steps 200
        patience=10),  # scripts/sup-consert-sup-unsup-base.sh:1 --patience 10
    ("sup_unsup", "large"): Official(
        script="scripts/sup-consert-sup-unsup-large.sh",
        views=("none", 0.0, "feature_cutoff", 0.1),  # scripts/sup-consert-sup-unsup-large.sh:1 --data_augmentation_strategy cutoff --cutoff_direction column --cutoff_rate 0.1
        dropout=BERT_DROPOUT,  # scripts/sup-consert-sup-unsup-large.sh:1 no --no_dropout (main.py:181)
        batch=96,  # scripts/sup-consert-sup-unsup-large.sh:1 --batch_size 96
        max_len=64,  # scripts/sup-consert-sup-unsup-large.sh:1 --max_seq_length 64
        epochs=10,  # scripts/sup-consert-sup-unsup-large.sh:1 --num_epochs 10
        rows=STS_SENTENCES,  # scripts/sup-consert-sup-unsup-large.sh:1 --train_data stssick --no_pair
        lr=5e-7,  # scripts/sup-consert-sup-unsup-large.sh:1 --learning_rate 0.0000005
        temperature=0.1,  # scripts/sup-consert-sup-unsup-large.sh:1 --temperature 0.1
        cl_rate=0.15,  # scripts/sup-consert-sup-unsup-large.sh:1 --cl_rate 0.15
        eval_steps=200,  # scripts/sup-consert-sup-unsup-large.sh:1 --evaluation_steps 200
        patience=10),  # scripts/sup-consert-sup-unsup-large.sh:1 --patience 10
    ("joint_unsup", "base"): Official(
        script="scripts/sup-consert-joint-unsup-base.sh",
        views=("none", 0.0, "shuffle", 0.0),  # scripts/sup-consert-joint-unsup-base.sh:1 --data_augmentation_strategy shuffle
        dropout=BERT_DROPOUT,  # scripts/sup-consert-joint-unsup-base.sh:1 no --no_dropout (main.py:181)
        batch=96,  # scripts/sup-consert-joint-unsup-base.sh:1 --batch_size 96
        max_len=64,  # scripts/sup-consert-joint-unsup-base.sh:1 --max_seq_length 64
        epochs=25,  # scripts/sup-consert-joint-unsup-base.sh:1 --num_epochs 25
        rows=STS_SENTENCES,  # scripts/sup-consert-joint-unsup-base.sh:1 --train_data stssick --no_pair
        lr=5e-7,  # scripts/sup-consert-joint-unsup-base.sh:1 --learning_rate 0.0000005
        temperature=0.1,  # scripts/sup-consert-joint-unsup-base.sh:1 --temperature 0.1
        cl_rate=0.15,  # scripts/sup-consert-joint-unsup-base.sh:1 --cl_rate 0.15
        eval_steps=200,  # scripts/sup-consert-joint-unsup-base.sh:1 --evaluation_steps 200
        patience=10),  # scripts/sup-consert-joint-unsup-base.sh:1 --patience 10
    ("joint_unsup", "large"): Official(
        script="scripts/sup-consert-joint-unsup-large.sh",
        views=("none", 0.0, "shuffle", 0.0),  # scripts/sup-consert-joint-unsup-large.sh:1 --data_augmentation_strategy shuffle
        dropout=BERT_DROPOUT,  # scripts/sup-consert-joint-unsup-large.sh:1 no --no_dropout (main.py:181)
        batch=96,  # scripts/sup-consert-joint-unsup-large.sh:1 --batch_size 96
        max_len=40,  # scripts/sup-consert-joint-unsup-large.sh:1 --max_seq_length 40
        epochs=10,  # scripts/sup-consert-joint-unsup-large.sh:1 --num_epochs 10
        rows=STS_SENTENCES,  # scripts/sup-consert-joint-unsup-large.sh:1 --train_data stssick --no_pair
        lr=5e-7,  # scripts/sup-consert-joint-unsup-large.sh:1 --learning_rate 0.0000005
        temperature=0.1,  # scripts/sup-consert-joint-unsup-large.sh:1 --temperature 0.1
        cl_rate=0.15,  # scripts/sup-consert-joint-unsup-large.sh:1 --cl_rate 0.15
        eval_steps=200,  # scripts/sup-consert-joint-unsup-large.sh:1 --evaluation_steps 200
        patience=10),  # scripts/sup-consert-joint-unsup-large.sh:1 --patience 10
}
# What every run shares: sentence-transformers' fit with AdamW and WarmupLinear (main.py:288-297).
FIT = dict(
    warmup_fraction=0.1,  # main.py:284 warmup_steps = ceil(rows * epochs / batch * 0.1)
    eps=1e-6,  # main.py:291 optimizer_params eps
    weight_decay=0.01,  # sentence_transformers/SentenceTransformer.py:461 fit default
    max_grad_norm=1.0,  # sentence_transformers/SentenceTransformer.py:465 fit default
    b1=0.9, b2=0.999,  # transformers.AdamW's default betas (main.py:291 passes none)
    correct_bias=False,  # main.py:291 optimizer_params {'correct_bias': False}
)


def _steps(off: Official) -> int:
  # steps_per_epoch = len(dataloader) = ceil(rows / batch); x epochs (SentenceTransformer.py:523-525)
  return off.epochs * math.ceil(off.rows / off.batch)


def _size(name):
  return "large" if name.endswith("_large.gin") else "base" if name.endswith("_base.gin") else "tiny_cpu"


def _header(name):
  """The text of the file's own leading comment block (not its includes'), lines joined by spaces."""
  lines = (REPO / "gin" / name).read_text().splitlines()
  return " ".join(line[1:].strip() for line in itertools.takewhile(lambda line: line.startswith("#"), lines))


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
  # Base and Large: every value of OFFICIAL (the official script of that recipe and size). Tiny CPU:
  # the Base script's objective and views on the demo's model, optimizer and steps.
  recipe, size = _recipe(name), _size(name)
  off = OFFICIAL[recipe, "base" if size == "tiny_cpu" else size]
  spec = _spec(name)
  tc, model = spec.train_config, spec.model
  joint = recipe == "joint"
  obj = tc.objective
  assert type(obj) is (ConsertJoint if joint else ConsertUnsup)
  if joint:
    assert obj.nli_classes == 3
  assert (obj.temperature, obj.weight) == (off.temperature, off.cl_rate)
  assert (obj.view1, obj.view1_rate, obj.view2, obj.view2_rate) == off.views
  header = _header(name)
  assert pathlib.Path(off.script).name in header  # the file names the script it follows
  # Unlabelled single sentences for NT-Xent only; premise, hypothesis (and label) for joint.
  lengths = dict(spec.data.feature_lengths)
  assert set(lengths) == ({"inputs", "targets"} if joint else {"inputs"})
  assert spec.data.task == ("consert_sts_sentences" if not joint else
                            "consert_snli_devtest_pairs" if size == "tiny_cpu" else "consert_snli_mnli_pairs")
  assert model.pooling == "enc_mean"
  if size == "tiny_cpu":
    assert model.t5.dtype == "float32" and model.t5.dropout_rate == 0.0  # CPU speed
    # The demo's model, so sup-unsup can start from workdirs/st5_tiny_cpu.
    demo = _spec("st5_tiny_cpu.gin").model
    assert model == demo
    assert spec.init_from == {"sup_unsup": "workdirs/st5_tiny_cpu",
                              "joint_unsup": "workdirs/consert_joint_tiny_cpu"}.get(recipe)
    # From random initialisation on CPU: the stack's Adafactor, and the header says why.
    assert type(tc.optimizer) is optim.OptimizerConfig
    assert "NOT ConSERT's AdamW" in header
    return
  t5_size = f"t5_{size}"
  assert model.t5 == configs.t5_size(t5_size, dtype="bfloat16", dropout_rate=off.dropout, scan_layers=True,
                                     remat_policy="full")
  assert tc.global_batch_size == off.batch
  assert set(lengths.values()) == {off.max_len} and model.max_length == off.max_len
  assert tc.num_train_steps == _steps(off)
  assert tc.eval_every == off.eval_steps
  # ConSERT's optimiser: AdamW, the script's rate, 10% linear warm-up then linear decay.
  assert type(tc.optimizer) is optim.AdamWConfig
  assert tc.optimizer.learning_rate == off.lr
  assert {k: getattr(tc.optimizer, k) for k in FIT} == FIT
  # Early stopping on STS-B dev at the script's interval: the best kept, stopping after --patience
  # evaluations without improvement (joint: no --patience, the best is still kept, as fit's save_best_model).
  assert tc.early_stopping == hooks.EarlyStopping(patience=off.patience)
  if off.patience is None:
    assert "no --patience" in header
  # ConSERT has no projection head; sup-unsup keeps the ST5 NLI model's 768-d projection.
  assert model.embedding_dim == (768 if recipe == "sup_unsup" else None)
  if recipe in ("unsup", "joint"):
    assert spec.init_from.startswith(f"gs://t5-data/pretrained_models/t5x/{t5_size}/")
  else:
    assert spec.init_from == "gs://bucket/first_step"
  assert aot.topology_for_slice(spec.target["slice"]) == spec.target["topology"]


def test_the_official_table_in_steps():
  # Steps of 96 for our data: 930 per epoch of the STS sentences, 9814 per epoch of AllNLI.
  assert {key: _steps(off) for key, off in OFFICIAL.items()} == {
      ("unsup", "base"): 9300, ("unsup", "large"): 23250, ("joint", "base"): 9814, ("joint", "large"): 9814,
      ("sup_unsup", "base"): 23250, ("sup_unsup", "large"): 9300,
      ("joint_unsup", "base"): 23250, ("joint_unsup", "large"): 9300}
  assert set(OFFICIAL) == {(r, s) for r in RECIPES for s in ("base", "large")}


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
  # No persistent cache: a subprocess has no cache guard (tests/conftest.py: jaxlib 0.10.2 loads
  # executables with collectives in loop bodies without their order).
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


@pytest.mark.parametrize("name, lr, overrides", [
    ("consert_unsup_base.gin", 5e-7, ["--gin.TASK_FEATURE_LENGTHS={'inputs': 16}"]),
    # The joint file's SNLI+MNLI train pairs are not on this machine: the public dev/test pairs instead.
    ("consert_joint_base.gin", 2e-5, ["--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 12}",
                                      "--gin.DataConfig.task='consert_snli_devtest_pairs'",
                                      "--gin.DataConfig.split='all'"]),
])
def test_consert_files_train_with_their_adamw_and_warmup(tmp_path, name, lr, overrides):
  # The Base file's optimiser as written (AdamW, the script's rate, 10% linear warm-up, then
  # linear decay); only the model, batch, steps, the start (no public checkpoint here) and
  # the evaluation are shrunk.
  steps = 10
  rows = _st5_train(name, tmp_path / "wd", f"--gin.TrainConfig.num_train_steps={steps}",
                    f"--gin.TrainConfig.checkpoint_every={steps}", "--gin.TrainConfig.early_stopping=None",
                    "--gin.run.init_from=None", *overrides)
  assert json.loads((tmp_path / "wd" / "train_config.json").read_text())["optimizer"]["name"] == "adamw"
  assert [r["step"] for r in rows] == list(range(1, steps + 1))
  assert all(np.isfinite(r["train/loss"]) for r in rows)
  # sentence-transformers' WarmupLinear at the step each update used: int(0.1 * 10) = 1 warm-up step.
  warmup = 1
  expected = [lr * (s / warmup if s < warmup else (steps - s) / (steps - warmup)) for s in range(steps)]
  np.testing.assert_allclose([r["train/learning_rate"] for r in rows], expected, rtol=1e-6, atol=1e-15)
