"""The contract every registered objective keeps (st5_jax/objectives/base.py), checked for all of them.

For each objective in `objectives.REGISTRY`, from its shipped tiny gin file (`example_gin`,
batch 8, t5_mini as shipped): the features its seqio task produces are the ones it declares;
its analytic FLOPs agree with XLA's cost analysis of the lowered step; the step compiles for
a TPU topology through `st5 aot`'s own code; a run saves, restores and continues; and the
trained tower exports and encodes as the work dir does. A new objective added to the
registry is covered without a new test; so is a setting that changes what an objective
declares, listed in VARIANTS (Contrastive with K = 3 hard negatives per query). Distill reads a
teacher cache, built here with a NumPy teacher (`_distill_cache`).
"""

import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from st5_jax import gin_config, objectives, partitioning, train
from st5_jax.gin_config import parse_gin

REPO = pathlib.Path(__file__).resolve().parents[1]
NAMES = sorted(objectives.REGISTRY)
BATCH = 8
OVERRIDES = [f"TrainConfig.global_batch_size = {BATCH}", "TrainConfig.num_train_steps = 2",
             "TrainConfig.checkpoint_every = 1", "TrainConfig.log_every = 1", "TrainConfig.eval_every = -1",
             "run.init_from = None"]
# Settings that change an objective's features, FLOPs and step, covered like one more objective:
# case -> (objective, extra gin bindings on its example gin). K hard negatives per query read a
# task with K negatives an example (registered below; the example gin's lengths serve it).
K = 3
K_TASK = "contract_three_hard_negatives"
VARIANTS = {"contrastive_k3": ("contrastive", [f"Contrastive.num_negatives = {K}", f"DataConfig.task = '{K_TASK}'"])}
CASES = NAMES + sorted(VARIANTS)
# Analytic model FLOPs / XLA's count of the whole lowered step (which adds the optimizer, norms,
# softmaxes and elementwise work): measured 0.958 (align_uniform, consert_unsup) to 0.974
# (consert_joint) on 2026-12-01, 0.971 (contrastive) and 0.980 (contrastive_k3, five towers), 0.971 (distill,
# 2026-12-05); a count off by 2x is far outside either way.
FLOPS_RATIO = (0.85, 1.15)


def _case(case):
  """(objective name, extra gin bindings) of a case: a registered objective, or one of VARIANTS."""
  return VARIANTS.get(case, (case, []))


def _spec(case):
  name, extra = _case(case)
  cls = objectives.REGISTRY[name]
  assert cls.example_gin and (REPO / "gin" / cls.example_gin).is_file(), f"{name}: no shipped example gin"
  parse_gin([cls.example_gin], OVERRIDES + extra)
  spec = gin_config.run_spec()
  assert type(spec.train_config.objective) is cls, f"{cls.example_gin} does not select {cls.__name__}"
  return spec


def _register_k_negatives_task():
  """A seqio task with K hard negatives an example (`negative_targets`, `negative_targets_1`, ...): in-memory
  text through seqio's pipeline, tokenised like the st5 tasks; no length of its own for the further negatives."""
  import seqio  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from st5_jax.data import registry, vocabulary  # pylint: disable=g-import-not-at-top
  from st5_jax.features import negative_features  # pylint: disable=g-import-not-at-top

  keys = ["inputs", "targets"] + [task_key for task_key, _ in negative_features(K)]
  words = "a man woman dog child plays runs sits on in the park beach guitar ball red blue".split()
  rng = np.random.default_rng(0)
  rows = {k: [" ".join(rng.choice(words, size=int(rng.integers(3, 12)))) for _ in range(4 * BATCH)] for k in keys}

  def dataset_fn(split, shuffle_files, seed=None):
    del split, shuffle_files, seed
    return tf.data.Dataset.from_tensor_slices(rows)

  if K_TASK in seqio.TaskRegistry.names():
    seqio.TaskRegistry.remove(K_TASK)
  vocab = vocabulary.get_vocabulary()
  seqio.TaskRegistry.add(K_TASK, source=seqio.FunctionDataSource(dataset_fn, splits=("all",)),
                         preprocessors=list(registry.PREPROCESSORS),
                         output_features={k: seqio.Feature(vocabulary=vocab, add_eos=True) for k in keys})


_DISTILL_CACHE = {}


def _distill_cache() -> str:
  """A teacher cache (st5 distill-cache's folder) of NLI-like triples for the distill example gin, built once with a
  NumPy teacher of the gin's TEACHER_DIM (384) and named by $ST5_DISTILL_CACHE, as a user's run reads it."""
  if "dir" not in _DISTILL_CACHE:
    import atexit  # pylint: disable=g-import-not-at-top
    import shutil  # pylint: disable=g-import-not-at-top
    import tempfile  # pylint: disable=g-import-not-at-top

    import synthetic  # pylint: disable=g-import-not-at-top
    from st5_jax.objectives.distill import cache as cache_lib  # pylint: disable=g-import-not-at-top

    words = "a man woman dog child plays runs sits on in the park beach guitar ball red blue".split()
    rng = np.random.default_rng(0)
    keys = cache_lib.text_keys(1)
    rows = [{k: " ".join(rng.choice(words, size=int(rng.integers(3, 12)))) for k in keys} for _ in range(4 * BATCH)]
    folder = tempfile.mkdtemp(prefix="st5_contract_distill_")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    cache_lib.build_cache(cache_lib.Examples(keys, rows, {"contract": True}), synthetic.HashTeacher(384), folder)
    _DISTILL_CACHE["dir"] = folder
  return _DISTILL_CACHE["dir"]


def _import_tasks(case, spec):
  spec.train_config.objective.import_tasks()
  if case == "contrastive_k3":
    _register_k_negatives_task()
  if case == "distill":
    os.environ["ST5_DISTILL_CACHE"] = _distill_cache()


def _abstract(setup, spec, mesh):
  tc = spec.train_config
  state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                       setup.abstract_state, setup.state_shardings)
  from st5_jax import aot  # pylint: disable=g-import-not-at-top
  batch = aot.abstract_batch(mesh, tc.global_batch_size, dict(spec.data.feature_lengths), objective=tc.objective)
  return state, batch


@pytest.mark.parametrize("name", CASES)
def test_its_task_produces_the_features_it_declares(name):
  spec = _spec(name)
  obj, lengths = spec.train_config.objective, dict(spec.data.feature_lengths)
  _import_tasks(name, spec)
  mesh = partitioning.make_mesh(spec.mesh)
  declared = {k: (f.shape(BATCH, lengths), np.dtype(f.dtype)) for k, f in obj.features(lengths).items()}
  batch = next(spec.data(mesh, BATCH, 0))
  produced = {k: (tuple(v.shape), np.dtype(v.dtype)) for k, v in batch.items()}
  assert produced == declared, f"{name}: task {spec.data.task} gives {produced}, the objective reads {declared}"


@pytest.mark.parametrize("name", CASES)
def test_its_flops_agree_with_xla_cost_analysis_of_the_lowered_step(name):
  spec = _spec(name)
  tc = spec.train_config
  assert not spec.model.t5.scan_layers  # XLA counts a scanned body once: the check needs unrolled layers
  mesh = partitioning.make_mesh(partitioning.MeshConfig(1, 1, 1), devices=jax.devices()[:1])
  setup = train.build(spec.model, tc, mesh, spec.rules)
  state, batch = _abstract(setup, spec, mesh)
  with jax.set_mesh(mesh):
    lowered = setup.step_fn.lower(state, batch)
  cost = lowered.cost_analysis()
  xla = float((cost[0] if isinstance(cost, (list, tuple)) else cost)["flops"])
  ours = tc.objective.step_flops(spec.model, global_batch_size=BATCH, lengths=dict(spec.data.feature_lengths))
  lo, hi = FLOPS_RATIO
  assert lo <= ours / xla <= hi, f"{name}: analytic {ours:.4g} vs XLA {xla:.4g} (ratio {ours / xla:.3f})"


@pytest.fixture(scope="module")
def aot_reports(tmp_path_factory):
  """`st5 aot` on every objective's example gin for a v4-8 (2x2x1) topology, in one subprocess."""
  out = tmp_path_factory.mktemp("aot")
  env = dict(os.environ)
  env.pop("JAX_PLATFORMS", None)  # compile-only TPU devices need the TPU plugin
  script = ("import json, sys\nfrom st5_jax import cli\n"
            "for name, gin, extra in json.loads(sys.argv[1]):\n"
            "  args = ['aot', '--gin', gin, '--topology', 'v4:2x2x1', '--json', f'" + str(out) + "/{name}.json']\n"
            "  args += ['--gin.' + b.replace(' = ', '=') for b in " + repr(OVERRIDES) + " + extra]\n"
            "  cli.main(args)\n")
  cases = [[c, objectives.REGISTRY[_case(c)[0]].example_gin, _case(c)[1]] for c in CASES]
  proc = subprocess.run([sys.executable, "-c", script, json.dumps(cases)], capture_output=True, text=True, env=env,
                        timeout=1200, cwd=REPO)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return {n: json.loads((out / f"{n}.json").read_text()) for n in CASES}


@pytest.mark.parametrize("name", CASES)
def test_it_compiles_for_a_tpu_topology_through_st5_aot(name, aot_reports):
  report = aot_reports[name]
  spec = _spec(name)
  ours = spec.train_config.objective.step_flops(spec.model, global_batch_size=BATCH,
                                                lengths=dict(spec.data.feature_lengths))
  assert report["devices"] == 4 and report["fits"] and report["step_flops"] == pytest.approx(ours)
  assert report["lengths"] == dict(spec.data.feature_lengths)


# The registered objectives only: a variant changes the features and the step, not saving or exporting
# (its step runs in tests/test_grad_cache.py; here it would add a minute of t5_mini training).
@pytest.mark.parametrize("name", NAMES)
def test_it_saves_restores_continues_and_exports_its_tower(name, tmp_path, vocab_path):
  from st5_jax.checkpoints import native  # pylint: disable=g-import-not-at-top
  from st5_jax.encoder import SentenceEncoder  # pylint: disable=g-import-not-at-top
  from st5_jax.export.api import export_model  # pylint: disable=g-import-not-at-top

  spec = _spec(name)
  _import_tasks(name, spec)
  kw = dict(workdir=tmp_path / "work", model_config=spec.model, train_config=spec.train_config,
            make_iterator=spec.data, mesh_config=spec.mesh, vocab_file=vocab_path, progress=False, rules=spec.rules)
  first = train.train(**kw, stop_after_steps=1)
  assert first.step == 1 and native.committed_steps(tmp_path / "work") == [1]
  _, params_1, _ = native.load_params(tmp_path / "work")
  second = train.train(**kw)  # restores step 1 (params, optimizer state, data position) and continues
  assert second.step == 2 and np.isfinite(second.summary["final_metrics"]["loss"])
  _, params_2, step = native.load_params(tmp_path / "work")
  assert step == 2
  moved = [k for k, v in params_1.items()
           if not np.array_equal(np.asarray(jax.tree.leaves(v)[0]), np.asarray(jax.tree.leaves(params_2[k])[0]))]
  assert moved, "the continued step changed no parameter"

  sentences = ["A man is playing a guitar.", "Two dogs run on the beach."]
  emb = SentenceEncoder.load(str(tmp_path / "work")).encode(sentences)
  assert emb.shape == (2, spec.model.output_dim) and np.all(np.isfinite(emb))
  export_model(str(tmp_path / "work"), format="sentence-transformers", out=tmp_path / "export", platforms=("cpu",))
  np.testing.assert_allclose(SentenceEncoder.load(str(tmp_path / "export")).encode(sentences), emb, atol=1e-5)


def test_an_old_style_objective_string_is_one_line_saying_what_to_write():
  for old, new in [("consert_joint", "@ConsertJoint()"), ("seed_encoder", "@SeedEncoder()"), ("st5", "@Contrastive()")]:
    with pytest.raises(gin_config.GinConfigError) as e:
      parse_gin(["st5_tiny_cpu.gin"], [f"TrainConfig.objective = '{old}'"])
      gin_config.run_spec()
    msg = str(e.value)
    assert "\n" not in msg and f"TrainConfig.objective = {new}" in msg, msg


@pytest.mark.parametrize("binding,hint", [
    ("TrainConfig.temperature = 0.05", "Contrastive.temperature"),
    ("TrainConfig.consert_view1 = 'shuffle'", "ConsertUnsup.view1 or ConsertJoint.view1"),
    ("SeedEncoderConfig.window = 3", "SeedEncoder"),
    ("st5_model.nli_classes = 3", "ConsertJoint.nli_classes"),
])
def test_a_moved_binding_names_its_new_home(binding, hint):
  with pytest.raises(gin_config.GinConfigError) as e:
    parse_gin(["st5_tiny_cpu.gin"], [binding])
    gin_config.run_spec()
  assert "\n" not in str(e.value) and hint in str(e.value), str(e.value)
