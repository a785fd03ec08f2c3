"""Contrastive training of a Sentence-T5 dual encoder on a device mesh.

One pure `train_step(state, batch)` (jit with explicit in/out shardings, donated
state) and the driver around it: init or resume, data, then a loop that steps, asks
the preemption flag and hands every step to the hooks of st5_jax/hooks.py (NaN guard,
throughput, metrics via st5_jax/metric_writer.py, progress, periodic STS-B dev
evaluation with one compiled encoder, checkpoints). Everything is configured by
arguments; gin binds them in st5_jax/gin_config.py.

Resuming: a work dir that holds a committed checkpoint is restored (params, optimizer
state, step, data-iterator position), so rerunning the same command after an
interruption yields the same parameters as an uninterrupted run. Dropout keys are
`fold_in(PRNGKey(seed), step)`, so they need no saved state.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import pathlib
import shutil
import signal
import time
from typing import Any, Callable, Mapping, Protocol

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils
from jax.sharding import Mesh
from tqdm import tqdm

from st5_jax import grad_cache, losses, multihost, partitioning, paths, seed_encoder
from st5_jax import hooks as hooks_lib
from st5_jax import vocab as vocab_lib
from st5_jax.checkpoints import loader, native
from st5_jax.configs import SeedEncoderConfig, ST5Config
from st5_jax.consert import objective as consert_objective
from st5_jax.evaluation import in_training
from st5_jax.features import LEFT, RIGHT, RIGHT_NEG
from st5_jax.hooks import NonFiniteLossError  # noqa: F401  (what train() raises; callers catch train.NonFiniteLossError)
from st5_jax.metric_writer import MetricWriter
from st5_jax.model.st5 import SentenceT5, abstract_params
from st5_jax.optim import OptimizerConfig, logical_axes, make_optimizer

log = logging.getLogger(__name__)


class WorkdirWriteError(OSError):
  """The work dir stopped taking writes (disk full, quota, permissions, read-only)."""


# errno values and the texts tensorstore / orbax wrap them in (their errors are ValueErrors).
_STORAGE_ERRNOS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
                   errno.EACCES: "permission denied", errno.EPERM: "operation not permitted",
                   errno.EROFS: "read-only file system"}
_STORAGE_TEXTS = {"no space left on device": errno.ENOSPC, "os_error_code='28'": errno.ENOSPC,
                  "disk quota exceeded": errno.EDQUOT, "permission denied": errno.EACCES,
                  "read-only file system": errno.EROFS}


def _storage_errno(e: BaseException) -> int | None:
  """The storage errno behind `e` (or its causes), if a failed write is what it is."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, OSError) and e.errno in _STORAGE_ERRNOS:
      return e.errno
    text = str(e).lower()
    for needle, code in _STORAGE_TEXTS.items():
      if needle in text:
        return code
    e = e.__cause__ or e.__context__
  return None


def _committed_steps(workdir: epath.Path) -> list[int]:
  try:
    return sorted(int(p.name) for p in (workdir / native.CHECKPOINT_DIR).iterdir() if p.name.isdigit())
  except OSError:
    return []


def workdir_write_error(e: BaseException, workdir: epath.Path) -> WorkdirWriteError | None:
  """A one-line error naming the path, the reason and the free space, or None if `e` is no write failure."""
  code = _storage_errno(e)
  if code is None:
    return None
  space = ""
  if not paths.is_remote(workdir):
    existing = pathlib.Path(os.fspath(workdir))
    while not existing.exists() and existing != existing.parent:
      existing = existing.parent
    usage = shutil.disk_usage(existing)
    space = f" ({_bytes(usage.free)} free of {_bytes(usage.total)} on its file system)"
  steps = _committed_steps(workdir)
  kept = (f"Committed checkpoints are intact (steps {steps}); free space or fix the permissions and rerun "
          f"the same command to resume from step {steps[-1]}." if steps else
          "No checkpoint was committed yet; free space or fix the permissions and rerun the same command.")
  err = WorkdirWriteError(f"Cannot write to the work dir {workdir}: {_STORAGE_ERRNOS[code]}{space}. {kept}")
  err.errno = code  # set after: OSError(code, msg) would print as "[Errno 28] ..." on the CLI's one line
  return err


def _bytes(n: int) -> str:
  for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
    if n < 1024 or unit == "TiB":
      return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
    n /= 1024


class BatchIterator(Protocol):
  """What the trainer needs from a data pipeline (st5_jax.data provides one)."""

  def __next__(self) -> dict[str, jax.Array]: ...
  def get_state(self) -> dict[str, Any]: ...
  def set_state(self, state: Mapping[str, Any]) -> None: ...


# (mesh, global_batch_size, seed) -> iterator of global batches sharded on the batch axes.
IteratorFactory = Callable[[Mesh, int, int], BatchIterator]


OBJECTIVES = ("st5", "seed_encoder", "consert_unsup", "consert_joint")
LOSSES = ("st5", "simcse")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  num_train_steps: int
  global_batch_size: int
  optimizer: OptimizerConfig = OptimizerConfig()
  temperature: float = 0.01
  bidirectional: bool = False
  label_smoothing: float = 0.0
  seed: int = 0
  checkpoint_every: int = 1000
  keep_checkpoints: int = 3
  log_every: int = 10
  # STS-B dev Spearman every N steps (0: only before and after training; -1: never).
  eval_every: int = 0
  # GradCache: split the batch into this many sub-batches for the backward pass (0/1: off).
  grad_cache_chunks: int = 0
  # The loss: "st5" (in-batch softmax above), "seed_encoder" (pre-training: T5 span
  # corruption + SEED-Encoder's weak decoder, st5_jax/seed_encoder.py, configured by
  # `seed_encoder`; batches of st5_jax.features.SEED_* features), or a ConSERT objective
  # (st5_jax/consert/objective.py): "consert_unsup" (NT-Xent on two views of each LEFT
  # sentence; also the sup-unsup and joint-unsup continuations, started with run.init_from)
  # or "consert_joint" (NLI cross-entropy on LEFT, RIGHT, LABELS + weight x NT-Xent on each
  # side's two views; needs ST5Config.nli_classes).
  objective: str = "st5"
  seed_encoder: SeedEncoderConfig = SeedEncoderConfig()
  # ConSERT views: none, shuffle, token_cutoff, feature_cutoff, span_cutoff, dropout, adversarial
  # (second view of consert_joint only); the rate is the cutoff/dropout rate, or FGV's eps.
  consert_view1: str = "none"
  consert_view1_rate: float = 0.0
  consert_view2: str = "none"
  consert_view2_rate: float = 0.0
  consert_temperature: float = 0.1
  # Multiplies the sum of NT-Xent's two directions (the official `cl_rate`; 0.3 x the paper's L_con).
  consert_weight: float = 0.15
  # The shuffle view: "positions" (per-example relative bias, faithful), "tokens" (permute token
  # ids; equal for enc_mean and encdec_first, not enc_first), "auto" (tokens where equal).
  consert_shuffle: str = "auto"
  # "st5": the paper's in-batch softmax on dot products (eqs. 13-14). "simcse": SimCSE's
  # supervised loss (LayerAttPooler's): cosine logits and `hard_negative_weight` added to
  # each query's logit against its own hard negative (SimCSE 0, LayerAttPooler 1.0; their
  # temperature is 0.05: set `temperature` too).
  loss: str = "st5"
  hard_negative_weight: float = 0.0

  def __post_init__(self):
    if self.loss not in LOSSES:
      raise ValueError(f"TrainConfig.loss must be one of {LOSSES}, got {self.loss!r}")
    if self.loss == "st5" and self.hard_negative_weight:
      raise ValueError("TrainConfig.hard_negative_weight belongs to the SimCSE loss; set "
                       "TrainConfig.loss = 'simcse' to use it (the ST5 loss has no hard-negative weight).")
    if self.loss != "st5" and self.objective != "st5":
      raise ValueError(f"TrainConfig.loss={self.loss!r} is a loss of the contrastive ST5 objective; "
                       f"objective {self.objective!r} has its own loss (set loss='st5').")

  def loss_kwargs(self) -> dict[str, Any]:
    """Keyword arguments of losses.in_batch_softmax_loss for this run."""
    kw = dict(temperature=self.temperature, bidirectional=self.bidirectional,
              label_smoothing=self.label_smoothing)
    if self.loss == "simcse":
      kw.update(similarity="cosine", hard_negative_weight=self.hard_negative_weight)
    return kw


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Any registered seqio task or mixture as training input (st5_jax.data.make_train_iterator).

  The st5_* tasks register themselves; users' tasks are registered by their own
  module, imported from the gin file (`import my_tasks`). `model_features` renames
  task features in the batch (default: st5_jax.features; others keep their names).
  `numpy_path=False` sends this project's own sources through seqio's pipeline too.
  """

  task: str
  feature_lengths: Mapping[str, int]
  dedup: bool = False
  shuffle: bool = True
  split: str = "train"
  model_features: Mapping[str, str] | None = None
  numpy_path: bool = True

  def __call__(self, mesh: Mesh, global_batch_size: int, seed: int) -> BatchIterator:
    # Here, not at the top: st5_jax.data imports TensorFlow and seqio (seconds), which the
    # trainer, `st5 aot` and `st5 bench` do not need unless a run reads seqio data.
    from st5_jax.data import make_train_iterator  # pylint: disable=g-import-not-at-top
    return make_train_iterator(task=self.task, feature_lengths=dict(self.feature_lengths),
                               global_batch_size=global_batch_size, mesh=mesh,
                               data_axes=partitioning.BATCH_AXES, seed=seed, shuffle=self.shuffle,
                               dedup=self.dedup, split=self.split,
                               model_feature_names=dict(self.model_features or {}), numpy_path=self.numpy_path)


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any


# ----------------------------------------------------------------------------- the step


EmbedFn = Callable[[Any, jax.Array, jax.Array], jax.Array]  # (params, tokens_BxL, dropout key) -> emb_BxD


def make_embed_fn(model: SentenceT5, boxed_params: Any | None = None) -> EmbedFn:
  """The training-mode tower.

  With `boxed_params` (the logically annotated abstract tree), parameters are re-boxed
  before `apply`, so every use inside the model -- also inside a scanned layer body --
  carries its sharding constraint. Without it XLA may all-gather a whole stack of
  scanned fsdp-sharded layers (and keep their gradients unsharded) outside the loop.
  """
  is_box = lambda x: isinstance(x, nn.LogicallyPartitioned)  # noqa: E731

  def embed(params, tokens_BxL, key):
    if boxed_params is not None:
      params = jax.tree.map(lambda box, x: box.replace_boxed(x), boxed_params, params, is_leaf=is_box)
    return model.apply({"params": params}, tokens_BxL, deterministic=False, rngs={"dropout": key})

  return embed


def embed_towers(embed: EmbedFn, params: Any, tokens: Mapping[str, jax.Array], key: jax.Array) -> dict[str, jax.Array]:
  """Embeddings of every tower (side -> tokens [B, L]) with one forward per distinct token shape.

  The towers share their weights, so sides of the same shape go through the model as one
  batch: fewer, larger matmuls, the weights read once, and one weight-gradient
  accumulation instead of one per tower (profile in docs/performance.md). They are stacked
  on axis 1 ([B, k, L] -> [B*k, L]), so each device's rows of the merged batch are its own
  rows of every tower: no data movement on a batch-sharded mesh. Rows are independent,
  so this equals one forward per tower (dropout masks come from one key per group).
  """
  groups: dict[tuple[int, ...], list[str]] = {}
  for side, t in tokens.items():
    groups.setdefault(tuple(t.shape), []).append(side)
  keys = jax.random.split(key, len(groups))
  out = {}
  for (shape, sides), k in zip(groups.items(), keys):
    if len(sides) == 1:
      out[sides[0]] = embed(params, tokens[sides[0]], k)
      continue
    B = shape[0]
    stacked_BxkxL = jnp.stack([tokens[s] for s in sides], axis=1)
    emb_BkxD = embed(params, stacked_BxkxL.reshape(B * len(sides), *shape[1:]), k)
    emb_BxkxD = emb_BkxD.reshape(B, len(sides), -1)
    out.update({s: emb_BxkxD[:, i] for i, s in enumerate(sides)})
  return out


def make_train_step(embed: EmbedFn, tx: optax.GradientTransformation, config: TrainConfig,
                    schedule: optax.Schedule, *, value_and_grad: Callable | None = None,
                    ) -> Callable[[TrainState, dict[str, jax.Array]], tuple[TrainState, dict]]:
  """The pure step: embed both sides of the global batch, contrastive loss, Adafactor update.

  value_and_grad(params, batch, key) -> ((loss, metrics), grads) replaces the ST5 loss
  (the seed_encoder and ConSERT objectives; see `build`).
  """
  if (config.objective == "st5") != (value_and_grad is None):
    raise ValueError(f"objective {config.objective!r} needs its value_and_grad (train.build makes it)")
  base_key = jax.random.PRNGKey(config.seed)
  loss_kw = config.loss_kwargs()

  def loss_fn(params, batch, key):
    emb = embed_towers(embed, params, {s: batch[s] for s in (LEFT, RIGHT, RIGHT_NEG) if s in batch}, key)
    return losses.in_batch_softmax_loss(emb[LEFT], emb[RIGHT], emb.get(RIGHT_NEG), **loss_kw)

  def train_step(state: TrainState, batch: dict[str, jax.Array]):
    key = jax.random.fold_in(base_key, state.step)
    if value_and_grad is not None:
      (loss, metrics), grads = value_and_grad(state.params, batch, key)
    elif config.grad_cache_chunks > 1:
      (loss, metrics), grads = grad_cache.value_and_grad(embed, state.params, batch, key,
                                                         chunks=config.grad_cache_chunks, loss_kw=loss_kw)
    else:
      (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch, key)
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
  model: SentenceT5
  tx: optax.GradientTransformation
  schedule: optax.Schedule
  abstract_state: TrainState
  state_shardings: TrainState
  step_fn: Callable


def build(model_config: ST5Config, train_config: TrainConfig, mesh: Mesh,
          rules=partitioning.DEFAULT_RULES) -> Setup:
  """Model, optimizer, abstract state and shardings, and the jitted step (not yet compiled)."""
  partitioning.check_batch_size(train_config.global_batch_size, mesh)
  if train_config.objective == "seed_encoder":
    model, boxed = seed_encoder.make_model(model_config, train_config.seed_encoder)
  elif train_config.objective in OBJECTIVES:
    model, boxed = SentenceT5(model_config), abstract_params(model_config)
  else:
    raise ValueError(f"TrainConfig.objective must be one of {OBJECTIVES}, got {train_config.objective!r}")
  # The logical axes tell Adafactor which dim of a scanned stack is `layers` (per-layer statistics).
  tx, schedule = make_optimizer(train_config.optimizer, num_train_steps=train_config.num_train_steps,
                                param_axes=logical_axes(boxed))
  params_abs = nn.unbox(boxed)
  p_shard = partitioning.param_shardings(boxed, mesh, rules)
  opt_abs = jax.eval_shape(tx.init, params_abs)
  o_shard = partitioning.optimizer_state_shardings(train_config.optimizer, boxed, mesh, rules)
  rep = partitioning.replicated(mesh)
  abstract_state = TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=params_abs, opt_state=opt_abs)
  state_shardings = TrainState(step=rep, params=p_shard, opt_state=o_shard)
  batch_shard = partitioning.batch_sharding(mesh)
  objective_vg = None
  if train_config.objective == "seed_encoder":
    objective_vg = seed_encoder.make_value_and_grad(model=model, boxed_params=boxed, train_config=train_config)
  elif train_config.objective != "st5":
    objective_vg = consert_objective.make_value_and_grad(model=model, boxed_params=boxed,
                                                         train_config=train_config)
  step = make_train_step(make_embed_fn(model, boxed), tx, train_config, schedule, value_and_grad=objective_vg)

  def step_with_rules(state, batch):
    with partitioning.with_rules(rules):
      return step(state, batch)

  step_fn = jax.jit(step_with_rules, in_shardings=(state_shardings, batch_shard),
                    out_shardings=(state_shardings, rep), donate_argnums=(0,))
  return Setup(mesh, model, tx, schedule, abstract_state, state_shardings, step_fn)


def init_state(setup: Setup, model_config: ST5Config, *, seed: int, init_params: Any | None = None) -> TrainState:
  """A fresh state placed on the mesh: random parameters, or `init_params` (numpy tree)."""
  shard = setup.state_shardings
  if init_params is None:
    def init_fn(key):
      return nn.unbox(setup.model.init(key, jnp.ones((1, 8), jnp.int32))["params"])
    params = jax.jit(init_fn, out_shardings=shard.params)(jax.random.PRNGKey(seed))
  else:
    params = jax.tree.map(lambda x, s: jax.device_put(np.asarray(x, np.float32), s), init_params, shard.params)
  opt_state = jax.jit(setup.tx.init, out_shardings=shard.opt_state)(params)
  step = jax.device_put(jnp.zeros((), jnp.int32), shard.step)
  return TrainState(step=step, params=params, opt_state=opt_state)


def _abstract_with_shardings(abstract: Any, shardings: Any) -> Any:
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)


def restore_state(mngr, step: int, setup: Setup) -> tuple[TrainState, dict[str, Any]]:
  """Restores a checkpoint onto this run's mesh (which may differ from the one that saved it)."""
  target_params = _abstract_with_shardings(setup.abstract_state.params, setup.state_shardings.params)
  target_opt = _abstract_with_shardings(setup.abstract_state.opt_state, setup.state_shardings.opt_state)
  restored = mngr.restore(step, args=ocp.args.Composite(params=ocp.args.StandardRestore(target_params),
                                                        opt_state=ocp.args.StandardRestore(target_opt),
                                                        meta=ocp.args.JsonRestore()))
  meta = restored["meta"]
  step_arr = jax.device_put(jnp.asarray(meta["step"], jnp.int32), setup.state_shardings.step)
  return TrainState(step=step_arr, params=restored["params"], opt_state=restored["opt_state"]), meta


def restore_latest_good(mngr, setup: Setup) -> tuple[TrainState, dict[str, Any]] | None:
  """Restores the newest checkpoint that reads back; skips (and reports) corrupt ones.

  Corrupt steps newer than the one restored are moved aside (`corrupt-<step>-<time>`,
  which orbax does not list): left in place, orbax would refuse to save any step at or
  below them, and every later load would pick them first.
  """
  bad: list[int] = []
  for step in sorted(mngr.all_steps(), reverse=True):
    try:
      restored = restore_state(mngr, step, setup)
    except Exception as e:  # noqa: BLE001  (any unreadable checkpoint: fall back to an older one)
      log.error("Checkpoint at step %d in %s cannot be restored (%s: %s); trying the previous one.",
                step, mngr.directory, type(e).__name__, str(e)[:300])
      bad.append(step)
      continue
    if bad:
      _move_aside(mngr, bad)
    return restored
  if mngr.all_steps():
    raise RuntimeError(f"No checkpoint in {mngr.directory} can be restored (steps {mngr.all_steps()}); "
                       "move the directory away to start over.")
  return None


def _move_aside(mngr, steps: list[int]) -> None:
  """Renames unreadable step dirs out of orbax's listing (lead process), then re-lists on all."""
  if _is_lead():
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for step in steps:
      src = paths.path(mngr.directory) / str(step)
      dst = paths.path(mngr.directory) / f"corrupt-{step}-{stamp}"
      src.rename(dst)
      log.error("Moved the unreadable checkpoint %s aside to %s.", src, dst)
  multihost.barrier("st5_move_corrupt_checkpoints")
  mngr.reload()


def save_state(mngr, state: TrainState, meta: dict[str, Any], *, force: bool = False) -> None:
  mngr.save(int(meta["step"]), args=ocp.args.Composite(params=ocp.args.StandardSave(state.params),
                                                       opt_state=ocp.args.StandardSave(state.opt_state),
                                                       meta=ocp.args.JsonSave(meta)), force=force)


# ------------------------------------------------------------------------------ the loop


class _StopFlag:
  """Turns SIGTERM/SIGINT (TPU preemption, Ctrl-C) into a checkpoint and a clean exit.

  One process: Python signal handlers. Several processes must stop at the same step or
  the next collective hangs: JAX's preemption service (started by
  jax.distributed.initialize) catches SIGTERM on any host and the hosts agree on the
  step (`multihost_utils.reached_preemption_sync_point`, called at every step). A Python
  SIGTERM handler would replace the service's, so none is installed then.
  """

  def __init__(self):
    self.signum: int | None = None
    self._old = {}
    self._multi = jax.process_count() > 1

  def should_stop(self, step: int) -> bool:
    """Call once per step, with the same step on every process."""
    if self._multi and self.signum is None and multihost_utils.reached_preemption_sync_point(step):
      self.signum = signal.SIGTERM
      log.warning("Preemption notice (SIGTERM on some host): saving a checkpoint at step %d and exiting.", step)
    return self.signum is not None

  def __enter__(self):
    if self._multi:
      return self
    for sig in (signal.SIGTERM, signal.SIGINT):
      try:
        self._old[sig] = signal.signal(sig, self._handle)
      except ValueError:  # not the main thread: leave signals alone
        pass
    return self

  def _handle(self, signum, frame):
    del frame
    if self.signum is not None:  # second signal: stop now
      raise KeyboardInterrupt
    self.signum = signum
    log.warning("Received %s: will save a checkpoint after the current step and exit.", signal.Signals(signum).name)

  def __exit__(self, *exc):
    for sig, old in self._old.items():
      signal.signal(sig, old)


@dataclasses.dataclass
class TrainResult:
  step: int
  interrupted_by: str | None
  summary: dict[str, Any]

def _is_lead() -> bool:
  return jax.process_index() == 0


def make_sts_dev_eval(setup: Setup, model_config: ST5Config, *, data_dir: str | None, vocab_file: str,
                      rules=partitioning.DEFAULT_RULES, batch_size: int = 128) -> Callable[[Any], float | None]:
  """params -> STS-B dev Spearman x100 (None without data), on the run's mesh.

  Build it once per run and call it at every evaluation: its encoder is compiled once
  per length bucket on the first call and reused (tests/test_train.py counts compiles).
  """
  if not data_dir:
    return lambda params: None
  evaluator = in_training.StsDevEvaluator(
      in_training.ShardedEncoder(model_config, mesh=setup.mesh, boxed_params=abstract_params(model_config),
                                 param_shardings=setup.state_shardings.params, rules=rules,
                                 tokenizer=vocab_lib.Tokenizer(vocab_file), batch_size=batch_size),
      data_dir=data_dir)
  return evaluator


def train(*, workdir: str | os.PathLike, model_config: ST5Config, train_config: TrainConfig,
          make_iterator: IteratorFactory, mesh_config: partitioning.MeshConfig = partitioning.MeshConfig(),
          init_from: str | None = None, init_projection: str = "auto", vocab_file: str,
          eval_data_dir: str | None = None, rules=partitioning.DEFAULT_RULES, progress: bool = True,
          run_info: Mapping[str, Any] | None = None, stop_after_steps: int | None = None) -> TrainResult:
  """Trains (or resumes) in `workdir`; returns the final step and a summary.

  init_from: a pre-trained model in any format `SentenceEncoder.load` reads; its T5
    architecture must match `model_config.t5` (numerics such as dtype, dropout and
    scan come from `model_config`). Ignored when `workdir` already has a checkpoint.
  init_projection: "auto" keeps the checkpoint's projection when it has one of the
    right size, else initialises one; "fresh" always initialises it.
  stop_after_steps: stop (with a checkpoint) after this many steps of this invocation;
    for tests and time-boxed jobs. The schedule still follows num_train_steps.

  A work dir that stops taking writes (disk full, permissions) raises WorkdirWriteError
  naming the path and the free space; committed checkpoints stay intact for a rerun.
  """
  try:
    return _train(workdir=workdir, model_config=model_config, train_config=train_config,
                  make_iterator=make_iterator, mesh_config=mesh_config, init_from=init_from,
                  init_projection=init_projection, vocab_file=vocab_file, eval_data_dir=eval_data_dir, rules=rules,
                  progress=progress, run_info=run_info, stop_after_steps=stop_after_steps)
  except Exception as e:
    err = workdir_write_error(e, paths.path(workdir))
    if err is None:
      raise
    log.error("%s", err)
    raise err from e


@dataclasses.dataclass(frozen=True)
class _Run:
  """What the loop of one invocation works with (built once by `_train`)."""

  setup: Setup
  config: TrainConfig
  mngr: Any  # orbax CheckpointManager
  writer: MetricWriter
  iterator: BatchIterator
  sts_dev_eval: Callable[[Any], float | None]
  progress: bool


def _train(*, workdir, model_config, train_config, make_iterator, mesh_config, init_from, init_projection,
           vocab_file, eval_data_dir, rules, progress, run_info, stop_after_steps) -> TrainResult:
  workdir = paths.mkdir(workdir)  # local or gs://
  tc = train_config
  if tc.eval_every < 0:
    eval_data_dir = None
  elif not eval_data_dir:
    log.warning("No data dir ($ST5_DATA_DIR or gin st5_jax.data.options.data_dir): skipping STS-B dev evaluation.")
  mesh = partitioning.make_mesh(mesh_config)
  setup = build(model_config, tc, mesh, rules)
  if _is_lead():
    native.write_config(workdir, model_config)
    native.copy_vocab(workdir, vocab_file)
    (workdir / "train_config.json").write_text(json.dumps(dataclasses.asdict(tc), indent=2))
  mngr = native.checkpoint_manager(workdir, max_to_keep=tc.keep_checkpoints, enable_async_checkpointing=True)
  writer = MetricWriter(workdir, enabled=_is_lead())
  summary_path = workdir / "results.json"
  summary: dict[str, Any] = json.loads(paths.read_text(summary_path)) if summary_path.exists() else {}
  summary.update({"workdir": str(workdir), "num_train_steps": tc.num_train_steps,
                  "global_batch_size": tc.global_batch_size, "mesh": dict(mesh.shape), **(run_info or {})})

  sts_dev_eval = make_sts_dev_eval(setup, model_config, data_dir=eval_data_dir, vocab_file=vocab_file, rules=rules)
  with jax.set_mesh(mesh):
    restored = restore_latest_good(mngr, setup)
    iterator = make_iterator(mesh, tc.global_batch_size, tc.seed)
    if restored is not None:
      state, meta = restored
      iterator.set_state(meta["data_state"])
      log.info("Resumed from %s at step %d", mngr.directory, meta["step"])
    else:
      init_params = None
      if init_from:
        init_params = _load_pretrained(init_from, model_config, init_projection, tc.seed, train_config=tc)
        summary["init_from"] = str(init_from)
      state = init_state(setup, model_config, seed=tc.seed, init_params=init_params)
      before = sts_dev_eval(state.params)
      summary["stsb_dev_spearman_before"] = before
      if before is not None:
        writer.write(0, {"stsb_dev_spearman": before}, prefix="eval")
        log.info("STS-B dev Spearman before training: %.2f", before)

    start_step = int(jax.device_get(state.step))
    end = tc.num_train_steps if stop_after_steps is None else min(tc.num_train_steps, start_step + stop_after_steps)
    run = _Run(setup=setup, config=tc, mngr=mngr, writer=writer, iterator=iterator, sts_dev_eval=sts_dev_eval,
               progress=progress)
    t_start = time.perf_counter()
    state, step, interrupted, last_metrics = _loop(run, state, start_step=start_step, end=end)
    mngr.wait_until_finished()
    summary.update({"last_step": step, "train_seconds_this_run": round(time.perf_counter() - t_start, 1),
                    "final_metrics": last_metrics, "interrupted_by": interrupted})
    if step == tc.num_train_steps and interrupted is None:
      after = sts_dev_eval(state.params)
      summary["stsb_dev_spearman_after"] = after
      if after is not None:
        writer.write(step, {"stsb_dev_spearman": after}, prefix="eval")
        log.info("STS-B dev Spearman after training: %.2f", after)
  mngr.wait_until_finished()
  mngr.close()
  writer.close()
  if _is_lead():
    paths.write_text(summary_path, json.dumps(summary, indent=2))
  return TrainResult(step=step, interrupted_by=interrupted, summary=summary)


def _load_pretrained(path: str, model_config: ST5Config, init_projection: str, seed: int, *,
                     train_config: TrainConfig | None = None) -> Any:
  if init_projection not in ("auto", "fresh"):
    raise ValueError(f"init_projection must be 'auto' or 'fresh', got {init_projection!r}")
  if train_config is not None and train_config.objective == "seed_encoder":
    # The pre-training model: T5 decoder and weak decoder kept fresh where the checkpoint lacks them.
    params, report = seed_encoder.load_pretrained(
        path, model_config=model_config, seed_config=train_config.seed_encoder, rng=jax.random.PRNGKey(seed + 1),
        fresh_projection=(init_projection == "fresh"))
    log.info("Initialised from %s: %s", path, report.summary())
    return params
  t = model_config.t5
  numerics = dict(dtype=t.dtype, dropout_rate=t.dropout_rate, scan_layers=t.scan_layers,
                  remat_policy=t.remat_policy)
  loaded_cfg, params, report, fmt = loader.load_model(
      path, pooling=model_config.pooling, embedding_dim=model_config.embedding_dim,
      fresh_projection=(init_projection == "fresh"), rng=jax.random.PRNGKey(seed + 1), t5_overrides=numerics,
      nli_classes=model_config.nli_classes, init_missing_head=True)
  if loaded_cfg.t5 != t:
    diffs = {f.name: (getattr(loaded_cfg.t5, f.name), getattr(t, f.name)) for f in dataclasses.fields(t)
             if getattr(loaded_cfg.t5, f.name) != getattr(t, f.name)}
    raise ValueError(f"{path} ({fmt}) does not match the configured model: "
                     + ", ".join(f"{k}: checkpoint {a} vs config {b}" for k, (a, b) in diffs.items()))
  log.info("Initialised from %s: %s", path, report.summary())
  return params


def _loop(run: _Run, state: TrainState, *, start_step: int, end: int
          ) -> tuple[TrainState, int, str | None, dict[str, float]]:
  """Steps from `start_step` to `end`; returns (state, step, interrupting signal name, last logged metrics)."""
  tc, iterator = run.config, run.iterator

  def save(state_: TrainState, step_: int, *, force: bool) -> None:
    meta = {"step": step_, "data_state": iterator.get_state(), "seed": tc.seed, "time": time.time()}
    save_state(run.mngr, state_, meta, force=force)

  bar = None
  if run.progress and _is_lead():
    bar = tqdm(total=tc.num_train_steps, initial=start_step, desc="train", unit="step", dynamic_ncols=True)
  nan_guard = hooks_lib.NanGuard(run.mngr)
  throughput = hooks_lib.Throughput(tc.global_batch_size)
  metrics_hook = hooks_lib.LogMetrics(run.writer, throughput, num_train_steps=tc.num_train_steps, bar=bar,
                                      lead=_is_lead())
  logged = (tc.log_every, tc.checkpoint_every)  # a checkpoint step is a logged (and NaN-checked) step
  hooks = hooks_lib.Hooks()
  hooks.add_hook(nan_guard.record, every=1)
  hooks.add_hook(throughput.count, every=1)
  hooks.add_hook(nan_guard.check, every=logged, at_end=True)
  hooks.add_hook(metrics_hook, every=logged, at_end=True)
  if bar is not None:
    hooks.add_hook(lambda info: bar.update(1), every=1)
  hooks.add_hook(hooks_lib.PeriodicEval(run.sts_dev_eval, run.writer, skip_step=tc.num_train_steps),
                 every=tc.eval_every)
  hooks.add_hook(hooks_lib.Checkpoint(save, run.writer), every=tc.checkpoint_every, at_end=True)

  step, interrupted, step_fn = start_step, None, None
  with _StopFlag() as stop:
    while step < end:
      batch = next(iterator)
      if step_fn is None:
        step_fn = multihost.compile_together(run.setup.step_fn, state, batch, name="train_step")
      state, metrics = step_fn(state, batch)
      step += 1
      stopping = stop.should_stop(step)  # every step, the same step on every process
      hooks.run(hooks_lib.StepInfo(step=step, state=state, metrics=metrics, batch=batch,
                                   last=stopping or step == end, stopping=stopping))
      if stopping:
        interrupted = signal.Signals(stop.signum).name
        break
  if bar is not None:
    bar.close()
  return state, step, interrupted, metrics_hook.last
