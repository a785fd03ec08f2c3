"""Training a Sentence-T5 tower on a device mesh, with any objective of st5_jax/objectives/.

One pure `train_step(state, batch)` (jit with explicit in/out shardings, donated
state) and the driver around it: init or resume, data, then a loop that steps, asks
the preemption flag and hands every step to the hooks of st5_jax/hooks.py (NaN guard,
throughput, metrics via st5_jax/metric_writer.py, progress, periodic STS-B dev
evaluation with one compiled encoder, the caller's hooks, checkpoints). The objective
(`TrainConfig.objective`) supplies the trainable module, the loss and its gradient, the
initialisation from a pre-trained path and the inference towers; this module names none.
Checkpoint I/O lives in st5_jax/checkpoints/ (state.py, storage.py). Everything is
configured by arguments; gin binds them in st5_jax/gin_config.py.

Resuming: a work dir that holds a committed checkpoint is restored (params, optimizer
state, step, data-iterator position), so rerunning the same command after an
interruption yields the same parameters as an uninterrupted run. Dropout keys are
`fold_in(PRNGKey(seed), step)`, so they need no saved state.

One trainer per work dir: `train` holds the work dir's lease (st5_jax/checkpoints/lease.py) and
stops with WorkdirLeaseLostError before a checkpoint (or, with one process, any step's writes)
once another trainer took it over.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import time
from typing import Any, Callable, Mapping, Sequence

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh
from tqdm import tqdm

from st5_jax import multihost, objectives, optim, partitioning, paths, provenance
from st5_jax import hooks as hooks_lib
from st5_jax.checkpoints import lease as lease_lib
from st5_jax.checkpoints import native, storage
from st5_jax.checkpoints.state import BestSaver, restore_latest_good, save_state
from st5_jax.configs import ST5Config
from st5_jax.evaluation import in_training
from st5_jax.hooks import BatchIterator, IteratorFactory  # the trainer's data interface (st5_jax.hooks owns it)
from st5_jax.metric_writer import MetricWriter
from st5_jax.objectives.base import Objective, ValueAndGrad, rebox
from st5_jax.optim import AdamWConfig, OptimizerConfig

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """What every run has; the objective's own settings live on the objective (st5_jax/objectives/)."""

  num_train_steps: int
  global_batch_size: int
  # The loss and the trainable module: gin `TrainConfig.objective = @ConsertJoint()` (default:
  # st5_jax.objectives.default(), the paper's in-batch softmax).
  objective: Objective = dataclasses.field(default_factory=objectives.default)
  optimizer: OptimizerConfig | AdamWConfig = OptimizerConfig()
  seed: int = 0
  checkpoint_every: int = 1000
  keep_checkpoints: int = 3
  log_every: int = 10
  # The dev metrics every N steps (0: only before and after training; -1: never): STS-B dev Spearman, or a dev
  # retrieval set's measure, e.g. "TREC-QA-dev/MRR@10" (st5_jax/evaluation/in_training.py).
  eval_every: int = 0
  eval_metrics: tuple[str, ...] = ("stsb_dev_spearman",)
  # GradCache: split the batch into this many sub-batches for the backward pass (0/1: off);
  # for objectives whose loss is over per-example embeddings (st5_jax/objectives/grad_cache.py).
  grad_cache_chunks: int = 0
  # Keep the best dev checkpoint (EarlyStopping.metric) in WORKDIR/best and stop after `patience` evaluations
  # without improvement: gin `TrainConfig.early_stopping = @EarlyStopping()` (needs eval_every > 0).
  early_stopping: hooks_lib.EarlyStopping | None = None
  # Which of the model's prompts each dev set encodes with, in `st5 eval --prompt`'s rules, e.g.
  # {"STSBenchmarkDev": "query", "TREC-QA-dev.query": "q"}; default: the model's default prompt for STS-B dev,
  # the "query" / "document" prompts for a retrieval set's sides (st5_jax/evaluation/in_training.py).
  eval_prompts: Mapping[str, str] | None = None

  def __post_init__(self):
    if self.early_stopping is not None and self.eval_every <= 0:
      raise ValueError(f"TrainConfig.early_stopping evaluates every TrainConfig.eval_every steps; set eval_every > 0 "
                       f"(it is {self.eval_every}).")
    in_training.check_metrics(self.eval_metrics, selected=self.early_stopping and self.early_stopping.metric)
    in_training.prompts_lib.parse(self.eval_prompts, where="TrainConfig.eval_prompts")  # the sets: at the run's start
    objectives.check_is_objective(self.objective, "TrainConfig.objective")

  def to_dict(self) -> dict[str, Any]:
    """As written to the work dir's train_config.json: the objective by name, with its settings."""
    d = dataclasses.asdict(self)
    d["objective"] = {"name": self.objective.name, **dataclasses.asdict(self.objective)}
    d["optimizer"] = {"name": "adamw" if isinstance(self.optimizer, AdamWConfig) else "adafactor",
                      **dataclasses.asdict(self.optimizer)}
    return d


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Any registered seqio task or mixture as training input (st5_jax.data.make_train_iterator).

  The st5_* tasks register themselves; users' tasks are registered by their own
  module, imported from the gin file (`import my_tasks`). `model_features` renames
  task features in the batch (default: st5_jax.features; others keep their names).
  `numpy_path=False` sends this project's own sources through seqio's pipeline too.
  `cache_dir` reads every task from its token cache `<cache_dir>/<task>/<split>` (written by
  `st5 data cache`; each host its own shards, resume by shard counts; docs/data.md).
  `prompts` prepends text to features before tokenisation, as sentence-transformers' trainer `prompts`:
  a string (every feature), {side or feature: prompt} (query -> inputs; document -> targets and every
  negative_targets*) or {task of the mixture: {...}} (st5_jax/data/prompts.py); the query and document
  prompts become the model's (`train_prompts`).
  """

  task: str
  feature_lengths: Mapping[str, int]
  dedup: bool = False
  shuffle: bool = True
  split: str = "train"
  model_features: Mapping[str, str] | None = None
  numpy_path: bool = True
  cache_dir: str | None = None
  prompts: Mapping[str, Any] | str | None = None

  def __post_init__(self):
    from st5_jax.data import prompts as prompts_lib  # pylint: disable=g-import-not-at-top  (no TensorFlow)
    prompts_lib.check_spec(self.prompts)

  def resolved_prompts(self) -> dict[str, dict[str, str]]:
    """{task: {task feature: prompt}} of `prompts` over the task's (or mixture's) tasks; {} without prompts."""
    if not self.prompts:
      return {}
    from st5_jax.data import DataConfigError, batch_layout  # pylint: disable=g-import-not-at-top  (seqio)
    from st5_jax.data import mixing, prompts as prompts_lib, streams  # pylint: disable=g-import-not-at-top
    tasks, _ = mixing.tasks_and_rates(streams.get_provider(self.task))
    layout = batch_layout(tasks, dict(self.feature_lengths), model_feature_names=dict(self.model_features or {}))
    try:
      return prompts_lib.resolve(self.prompts, [t.name for t in tasks],
                                 [f.task_key for f in layout.features if f.is_tokens])
    except ValueError as e:
      raise DataConfigError(str(e)) from e

  def __call__(self, mesh: Mesh, global_batch_size: int, seed: int) -> BatchIterator:
    # Here, not at the top: st5_jax.data imports TensorFlow and seqio (seconds), which the
    # trainer, `st5 aot` and `st5 bench` do not need unless a run reads seqio data.
    from st5_jax.data import DataConfigError, make_train_iterator  # pylint: disable=g-import-not-at-top
    iterator = make_train_iterator(task=self.task, feature_lengths=dict(self.feature_lengths),
                                   global_batch_size=global_batch_size, mesh=mesh,
                                   data_axes=partitioning.BATCH_AXES, seed=seed, shuffle=self.shuffle,
                                   dedup=self.dedup, split=self.split,
                                   model_feature_names=dict(self.model_features or {}), numpy_path=self.numpy_path,
                                   cache_dir=self.cache_dir, prompts=self.prompts)
    # Dedup hashes rows as token ids; float rows (a teacher's vectors, st5_jax.objectives.distill) are not.
    floats = [f.task_key for f in iterator.layout.features if np.dtype(f.dtype).kind == "f"]
    if self.dedup and floats:
      iterator.close()
      raise DataConfigError(f"DataConfig.dedup compares token rows; task {self.task} has float features {floats}: "
                            "set DataConfig.dedup = False")
    return iterator


def train_prompts(model_config: ST5Config, data: Any) -> ST5Config:
  """The model config with the query / document prompts the data trains with (DataConfig.prompts).

  A side whose prompt every task shares (`inputs`: query, `targets`: document) and that st5_model.prompts does
  not name is added, so `encode_query` / `encode_document` and every export use it; a different prompt of the
  same name in st5_model.prompts is refused (one line). Tasks of a mixture that train a side with different
  prompts add none for it (a warning says so). Other data factories, or no prompts: the config unchanged.
  """
  if not isinstance(data, DataConfig) or not data.prompts:
    return model_config
  from st5_jax.data import DataConfigError  # pylint: disable=g-import-not-at-top
  from st5_jax.data import prompts as prompts_lib  # pylint: disable=g-import-not-at-top
  have = model_config.prompt_dict
  add = {}
  for side, text in prompts_lib.side_prompts(data.resolved_prompts()).items():
    if text is None:
      log.warning("DataConfig.prompts trains the %s side of %s with different prompts per task: the model gets "
                  "no %r prompt from them (set st5_model.prompts).", side, data.task, side)
    elif text and side in have and have[side] != text:
      raise DataConfigError(f"DataConfig.prompts trains the {side} side with {text!r} but st5_model.prompts"
                            f"[{side!r}] is {have[side]!r}: make them equal (or drop one), so that "
                            f"encode_{side} uses the prompt the model was trained with.")
    elif text and side not in have:
      add[side] = text
  if add:
    log.info("The model's prompts get the trained ones: %s", add)
    return model_config.replace(prompts={**have, **add})
  return model_config


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any


# ----------------------------------------------------------------------------- the step


def make_train_step(value_and_grad: ValueAndGrad, tx: optax.GradientTransformation, config: TrainConfig,
                    schedule: optax.Schedule) -> Callable[[TrainState, dict[str, jax.Array]], tuple[TrainState, dict]]:
  """The pure step: the objective's loss and gradient on the global batch, then the optimizer update.

  value_and_grad(params, batch, dropout key) -> ((loss, metrics), grads) comes from the objective.
  """
  if value_and_grad is None:
    raise ValueError("make_train_step needs the objective's value_and_grad (train.build makes it)")
  base_key = jax.random.PRNGKey(config.seed)

  def train_step(state: TrainState, batch: dict[str, jax.Array]):
    key = jax.random.fold_in(base_key, state.step)
    (loss, metrics), grads = value_and_grad(state.params, batch, key)
    del loss  # in metrics
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = dict(metrics, learning_rate=schedule(state.step), grad_norm=optax.global_norm(grads),
                   param_norm=optax.global_norm(params))
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

  return train_step


# ---------------------------------------------------------------------- state and sharding


@dataclasses.dataclass
class Setup:
  """Everything derived from configs before any array exists."""

  mesh: Mesh
  model: nn.Module  # the objective's trainable module (the tower, plus any head it owns)
  tx: optax.GradientTransformation
  schedule: optax.Schedule
  abstract_state: TrainState
  state_shardings: TrainState
  step_fn: Callable
  objective: Objective
  boxed_params: Any  # logically annotated abstract parameters


def build(model_config: ST5Config, train_config: TrainConfig, mesh: Mesh,
          rules=partitioning.DEFAULT_RULES) -> Setup:
  """Model, optimizer, abstract state and shardings, and the jitted step (not yet compiled)."""
  partitioning.check_batch_size(train_config.global_batch_size, mesh)
  objective = train_config.objective
  objective.check(model_config, train_config)
  model, boxed = objective.make_model(model_config), objective.abstract_params(model_config)
  # The logical axes tell Adafactor which dim of a scanned stack is `layers` (per-layer statistics).
  tx, schedule = optim.make_optimizer(train_config.optimizer, num_train_steps=train_config.num_train_steps,
                                      param_axes=optim.logical_axes(boxed))
  params_abs = nn.unbox(boxed)
  p_shard = partitioning.param_shardings(boxed, mesh, rules)
  opt_abs = jax.eval_shape(tx.init, params_abs)
  o_shard = optim.state_shardings(train_config.optimizer, boxed, mesh, rules)
  rep = partitioning.replicated(mesh)
  abstract_state = TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=params_abs, opt_state=opt_abs)
  state_shardings = TrainState(step=rep, params=p_shard, opt_state=o_shard)
  batch_shard = partitioning.batch_sharding(mesh)
  value_and_grad = objective.make_value_and_grad(model, boxed, model_config, train_config)
  step = make_train_step(value_and_grad, tx, train_config, schedule)

  def step_with_rules(state, batch):
    with partitioning.with_rules(rules):
      return step(state, batch)

  step_fn = jax.jit(step_with_rules, in_shardings=(state_shardings, batch_shard),
                    out_shardings=(state_shardings, rep), donate_argnums=(0,))
  return Setup(mesh, model, tx, schedule, abstract_state, state_shardings, step_fn, objective, boxed)


def init_state(setup: Setup, model_config: ST5Config, *, seed: int, init_params: Any | None = None) -> TrainState:
  """A fresh state placed on the mesh: random parameters, or `init_params` (numpy tree)."""
  shard = setup.state_shardings
  if init_params is None:
    def init_fn(key):
      return nn.unbox(setup.objective.init_params(model_config, key))
    params = jax.jit(init_fn, out_shardings=shard.params)(jax.random.PRNGKey(seed))
  else:
    params = jax.tree.map(lambda x, s: jax.device_put(np.asarray(x, np.float32), s), init_params, shard.params)
  opt_state = jax.jit(setup.tx.init, out_shardings=shard.opt_state)(params)
  step = jax.device_put(jnp.zeros((), jnp.int32), shard.step)
  return TrainState(step=step, params=params, opt_state=opt_state)


# ------------------------------------------------------------------------------ the loop


@dataclasses.dataclass
class TrainResult:
  step: int
  interrupted_by: str | None
  summary: dict[str, Any]

def tower_encode(setup: Setup, model_config: ST5Config, side: str, rules=partitioning.DEFAULT_RULES
                 ) -> tuple[Callable[[Any, jax.Array], jax.Array], tuple[str, ...]]:
  """(encode(params, tokens_BxL) -> emb_BxD, the parameter keys it reads): the objective's inference tower of
  `side` ("query" / "document"), its parameters re-boxed as in the step (for a ShardedEncoder on the run's mesh)."""
  tower = setup.objective.inference_towers(model_config)[side]
  boxed = {k: setup.boxed_params[k] for k in tower.param_keys}

  def encode(params, tokens_BxL):
    with partitioning.with_rules(rules):
      return tower.module.apply({"params": rebox(boxed, params)}, tokens_BxL)

  return encode, tuple(tower.param_keys)


def make_dev_eval(setup: Setup, model_config: ST5Config, *, data_dir: str | None, vocab_file: str,
                  metrics: Sequence[str] = (in_training.STSB_DEV,), rules=partitioning.DEFAULT_RULES,
                  batch_size: int = 128, eval_prompts: Mapping[str, str] | None = None
                  ) -> Callable[[Any], dict[str, float] | None]:
  """params -> {metric: value} of the dev metrics (None without data), on the run's mesh.

  The objective's inference towers encode (query side: STS-B dev and queries; document side: corpora), with the
  model's prompts as `st5 eval` uses them (eval_prompts: TrainConfig.eval_prompts' choices).
  Build it once per run and call it at every evaluation: its encoder is compiled once per
  length bucket on the first call and reused (tests/test_train.py counts compiles).
  """
  if not data_dir:
    return lambda params: None
  encode, param_keys = tower_encode(setup, model_config, "query", rules)
  towers = setup.objective.inference_towers(model_config)
  document = None if towers["query"] is towers["document"] else tower_encode(setup, model_config, "document", rules)
  return in_training.dev_evaluator(encode, param_keys=param_keys, max_length=model_config.max_length,
                                   mesh=setup.mesh, param_shardings=setup.state_shardings.params,
                                   vocab_file=vocab_file, batch_size=batch_size, metrics=metrics, data_dir=data_dir,
                                   document=document, prompts=model_config.prompt_dict,
                                   default_prompt_name=model_config.default_prompt_name, eval_prompts=eval_prompts)


def train(*, workdir: str | os.PathLike, model_config: ST5Config, train_config: TrainConfig,
          make_iterator: IteratorFactory, mesh_config: partitioning.MeshConfig = partitioning.MeshConfig(),
          init_from: str | None = None, init_projection: str = "auto", vocab_file: str,
          eval_data_dir: str | None = None, rules=partitioning.DEFAULT_RULES, progress: bool = True,
          run_info: Mapping[str, Any] | None = None, stop_after_steps: int | None = None,
          hooks: Sequence[hooks_lib.Hook] = (),
          lease: lease_lib.LeaseOptions | lease_lib.Held = lease_lib.LeaseOptions()) -> TrainResult:
  """Trains (or resumes) in `workdir`; returns the final step and a summary.

  init_from: a pre-trained model in any format `SentenceEncoder.load` reads; its T5
    architecture must match `model_config.t5` (numerics such as dtype, dropout and
    scan come from `model_config`). Ignored when `workdir` already has a checkpoint.
  init_projection: "auto" keeps the checkpoint's projection when it has one of the
    right size, else initialises one; "fresh" always initialises it.
  stop_after_steps: stop (with a checkpoint) after this many steps of this invocation;
    for tests and time-boxed jobs. The schedule still follows num_train_steps.
  hooks: the caller's own (st5_jax.hooks.Hook), run after the evaluation and before the
    checkpoint of each step; one may replace the batch stream and keep state in the checkpoint;
    `Hook.start` gets the run's context (st5_jax.hooks.RunContext) once, before any resume.
  lease: how to hold the work dir's lease for the call (LeaseOptions: expiry, renewal, takeover), or one
    the caller already holds (lease.hold, as gin_config.train_from_gin does). Another trainer's lease is a
    lease.WorkdirInUseError, raised before anything is written.

  A work dir that stops taking writes (disk full, permissions) raises storage.WorkdirWriteError
  naming the path and the free space; committed checkpoints stay intact for a rerun.
  """
  storage.quiet_background_storage_errors()  # the storage error is reported once, below
  if not isinstance(lease, lease_lib.Held):
    with lease_lib.hold(workdir, lease) as held:
      return train(workdir=workdir, model_config=model_config, train_config=train_config,
                   make_iterator=make_iterator, mesh_config=mesh_config, init_from=init_from,
                   init_projection=init_projection, vocab_file=vocab_file, eval_data_dir=eval_data_dir, rules=rules,
                   progress=progress, run_info=run_info, stop_after_steps=stop_after_steps, hooks=hooks, lease=held)
  try:
    return _train(workdir=workdir, model_config=model_config, train_config=train_config,
                  make_iterator=make_iterator, mesh_config=mesh_config, init_from=init_from,
                  init_projection=init_projection, vocab_file=vocab_file, eval_data_dir=eval_data_dir, rules=rules,
                  progress=progress, run_info=run_info, stop_after_steps=stop_after_steps, hooks=hooks, lease=lease)
  except Exception as e:
    err = storage.workdir_write_error(e, paths.path(workdir))
    if err is None:
      raise
    raise err from e  # one line from the CLI (`st5 train: error: ...`), not also a log line


@dataclasses.dataclass(frozen=True)
class _Run:
  """What the loop of one invocation works with (built once by `_train`)."""

  setup: Setup
  config: TrainConfig
  mngr: Any  # orbax CheckpointManager
  writer: MetricWriter
  stream: hooks_lib.Stream
  dev_eval: Callable[[Any], dict[str, float] | None]
  progress: bool
  caller_hooks: hooks_lib.Hooks
  lease: lease_lib.Held
  keeper: hooks_lib.BestKeeper | None = None  # early stopping


def _train(*, workdir, model_config, train_config, make_iterator, mesh_config, init_from, init_projection,
           vocab_file, eval_data_dir, rules, progress, run_info, stop_after_steps, hooks, lease) -> TrainResult:
  workdir = paths.mkdir(workdir)  # local or gs://
  tc = train_config
  model_config = train_prompts(model_config, make_iterator)  # saved, evaluated and exported with them
  caller_hooks = hooks_lib.Hooks()
  for hook in hooks:
    caller_hooks.add(hook)
  if tc.eval_every < 0:
    eval_data_dir = None
  elif not eval_data_dir:
    log.warning("No data dir ($ST5_DATA_DIR or gin st5_jax.data.options.data_dir): skipping the dev evaluation.")
  mesh = partitioning.make_mesh(mesh_config)
  setup = build(model_config, tc, mesh, rules)
  if multihost.is_lead():
    native.write_config(workdir, model_config)
    native.copy_vocab(workdir, vocab_file)
    # The config the run started with (a resume keeps it) and the changes since (st5_jax/provenance.py).
    provenance.write_train_config(workdir, tc.to_dict(), resumed=bool(native.committed_steps(workdir)))
  mngr = native.checkpoint_manager(workdir, max_to_keep=tc.keep_checkpoints, enable_async_checkpointing=True)
  writer = MetricWriter(workdir, enabled=multihost.is_lead())
  try:
    summary_path = workdir / "results.json"
    summary: dict[str, Any] = json.loads(paths.read_text(summary_path)) if summary_path.exists() else {}
    summary.update({"workdir": str(workdir), "num_train_steps": tc.num_train_steps,
                    "global_batch_size": tc.global_batch_size, "mesh": dict(mesh.shape), **(run_info or {})})

    dev_eval = make_dev_eval(setup, model_config, data_dir=eval_data_dir, vocab_file=vocab_file,
                             metrics=tc.eval_metrics, rules=rules, eval_prompts=tc.eval_prompts)
    if tc.early_stopping is not None and eval_data_dir is None:
      raise ValueError("TrainConfig.early_stopping needs the dev evaluation (TrainConfig.eval_metrics): set "
                       "$ST5_DATA_DIR (or gin st5_jax.data.options.data_dir).")
    with jax.set_mesh(mesh):
      restored = restore_latest_good(mngr, setup)
      stream = hooks_lib.Stream(make_iterator(mesh, tc.global_batch_size, tc.seed), mesh=mesh,
                                global_batch_size=tc.global_batch_size, seed=tc.seed)
      caller_hooks.start(hooks_lib.RunContext(workdir, setup, model_config, vocab_file, rules, tc.num_train_steps,
                                              stream))
      keeper = None
      if tc.early_stopping is not None:
        best_saver = BestSaver(workdir, model_config, vocab_file)

        def save_best(state_, step_, score):
          lease.check(f"writing the best checkpoint of step {step_}")
          best_saver(state_, step_, score)

        keeper = hooks_lib.BestKeeper(tc.early_stopping, save_best,
                                      restored[1].get("early_stopping") if restored else None)
      if restored is not None:
        state, meta = restored
        caller_hooks.load_state_dict(meta.get("hooks", {}), stream)  # may switch the stream, before its position
        stream.set_state(meta["data_state"])
        log.info("Resumed from %s at step %d", mngr.directory, meta["step"])
      else:
        init_params = None
        if init_from:
          init_params = tc.objective.init_from(init_from, model_config, init_projection=init_projection, seed=tc.seed)
          summary["init_from"] = str(init_from)
        state = init_state(setup, model_config, seed=tc.seed, init_params=init_params)
        before = dev_eval(state.params)
        summary.update({f"{k}_before": v for k, v in (before or {}).items()})
        if before is not None:
          writer.write(0, before, prefix="eval")
          log.info("%s before training", hooks_lib.describe(before))

      start_step = int(jax.device_get(state.step))
      end = tc.num_train_steps if stop_after_steps is None else min(tc.num_train_steps, start_step + stop_after_steps)
      if keeper is not None and keeper.should_stop:  # a rerun of a run that stopped early: nothing left to do
        log.info("Stopped early at step %d (best %s at step %s): nothing to resume.", keeper.stopped_at,
                 keeper.best, keeper.best_step)
        end = start_step
      run = _Run(setup=setup, config=tc, mngr=mngr, writer=writer, stream=stream, dev_eval=dev_eval,
                 progress=progress, caller_hooks=caller_hooks, lease=lease, keeper=keeper)
      t_start = time.perf_counter()
      state, step, interrupted, last_metrics = _loop(run, state, start_step=start_step, end=end)
      mngr.wait_until_finished()
      summary.update({"last_step": step, "train_seconds_this_run": round(time.perf_counter() - t_start, 1),
                      "final_metrics": last_metrics, "interrupted_by": interrupted})
      if step == tc.num_train_steps and interrupted is None and not (keeper and keeper.should_stop):
        after = dev_eval(state.params)
        summary.update({f"{k}_after": v for k, v in (after or {}).items()})
        if after is not None:
          writer.write(step, after, prefix="eval")
          log.info("%s after training", hooks_lib.describe(after))
          if keeper is not None:
            keeper.update(step, after[keeper.config.metric], state)
      if keeper is not None:
        summary["early_stopping"] = keeper.state_dict()
    mngr.wait_until_finished()
    mngr.close()
    lease.check("writing results.json")
    writer.close()
    if multihost.is_lead():
      paths.write_text(summary_path, json.dumps(summary, indent=2))
    return TrainResult(step=step, interrupted_by=interrupted, summary=summary)
  except BaseException as e:
    if isinstance(e, lease_lib.WorkdirLeaseLostError) and paths.is_remote(workdir):
      raise  # abandon() would rewrite the remote metrics.jsonl, which the new holder writes now
    writer.abandon()  # a failed write (a full disk) must not fail again, or print, at exit
    raise


def _loop(run: _Run, state: TrainState, *, start_step: int, end: int
          ) -> tuple[TrainState, int, str | None, dict[str, float]]:
  """Steps from `start_step` to `end`; returns (state, step, interrupting signal name, last logged metrics)."""
  tc, stream = run.config, run.stream

  def save(state_: TrainState, step_: int, *, force: bool) -> None:
    run.lease.check(f"writing the checkpoint of step {step_}")  # never into a work dir another trainer holds
    meta = {"step": step_, "data_state": stream.get_state(), "seed": tc.seed, "time": time.time()}
    if run.keeper is not None:
      meta["early_stopping"] = run.keeper.state_dict()
    if run.caller_hooks.state_dict():
      meta["hooks"] = run.caller_hooks.state_dict()
    save_state(run.mngr, state_, meta, force=force)

  bar = None
  if run.progress and multihost.is_lead():
    bar = tqdm(total=tc.num_train_steps, initial=start_step, desc="train", unit="step", dynamic_ncols=True)
  hooks, metrics_hook = hooks_lib.trainer_hooks(
      mngr=run.mngr, writer=run.writer, save=save, evaluate=run.dev_eval,
      on_score=run.keeper.update if run.keeper else None, caller=run.caller_hooks.hooks,
      global_batch_size=tc.global_batch_size, num_train_steps=tc.num_train_steps, log_every=tc.log_every,
      checkpoint_every=tc.checkpoint_every, eval_every=tc.eval_every, bar=bar, lead=multihost.is_lead(),
      metric=tc.early_stopping.metric if tc.early_stopping else tc.eval_metrics[0])

  step, interrupted, step_fn = start_step, None, None
  with multihost.StopFlag() as stop:
    while step < end:
      batch = next(stream)
      if step_fn is None:
        step_fn = multihost.compile_together(run.setup.step_fn, state, batch, name="train_step")
      state, metrics = step_fn(state, batch)
      step += 1
      run.lease.check_cached(f"step {step}'s writes")  # lost (renewal thread): stop before metrics or a checkpoint
      stopping = stop.should_stop(step)  # every step, the same step on every process
      hooks.run(hooks_lib.StepInfo(step=step, state=state, metrics=metrics, batch=batch,
                                   last=stopping or step == end, stopping=stopping, stream=stream))
      if stopping:
        interrupted = signal.Signals(stop.signum).name
        break
      if run.keeper is not None and run.keeper.should_stop:  # early stopping: save this step and end
        if step not in run.mngr.all_steps():
          save(state, step, force=True)
        log.info("Early stopping at step %d: %d evaluations without improvement; best %s at step %s (best/).",
                 step, run.keeper.bad, run.keeper.best, run.keeper.best_step)
        break
  if bar is not None:
    bar.close()
  return state, step, interrupted, metrics_hook.last
