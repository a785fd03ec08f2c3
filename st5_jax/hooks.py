"""Hooks of the training loop: what runs every N steps around the train step.

The loop in st5_jax/train.py only steps, asks the preemption flag, and hands each step
to `Hooks.run` (levanter's `add_hook(fn, every=...)`). A hook runs when the step is a
multiple of one of its periods, and, with `at_end`, also on the last step of the
invocation (the end of training, `stop_after_steps`, or a preemption stop). Hooks run
in the order they were added; the trainer adds them as: NaN-guard bookkeeping,
throughput, metrics (guard first, so a poisoned step is never logged as good),
progress, periodic evaluation, the caller's hooks (`train(..., hooks=[Hook(...)])`),
checkpoint. A caller's hook may replace the batch stream (`info.stream.replace(it)`: the
next step reads the new one), keep state of its own in every checkpoint (`name`,
`state_dict`, `load_state_dict`) and be handed the run's context once before the loop
(`start`: the work dir, the objective's towers, the vocabulary), which is what a negatives
refresh needs (st5_jax/retrieval/refresh.py).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Any, Callable, Mapping, Protocol, Sequence

import jax
from jax.sharding import Mesh

log = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError):
  pass


class BatchIterator(Protocol):
  """What the trainer needs from a data pipeline (st5_jax.data provides one)."""

  def __next__(self) -> dict[str, jax.Array]: ...
  def get_state(self) -> dict[str, Any]: ...
  def set_state(self, state: Mapping[str, Any]) -> None: ...


# (mesh, global_batch_size, seed) -> iterator of global batches sharded on the batch axes.
IteratorFactory = Callable[[Mesh, int, int], BatchIterator]


class Stream:
  """The batch stream the loop reads. A hook may replace its iterator at a step boundary.

  The data state saved with a checkpoint is the current iterator's; on resume the hooks'
  `load_state_dict` runs first (and may replace the iterator again, e.g. with the same
  generation of mined negatives), then the saved data state is set on whatever iterator
  the stream then holds.
  """

  def __init__(self, iterator, *, mesh=None, global_batch_size: int | None = None, seed: int | None = None):
    self.iterator = iterator
    # What the trainer built the first iterator with, for a hook that builds the next one
    # from an iterator factory: factory(stream.mesh, stream.global_batch_size, stream.seed).
    self.mesh, self.global_batch_size, self.seed = mesh, global_batch_size, seed

  def replace(self, iterator) -> None:
    self.iterator = iterator

  def __next__(self):
    return next(self.iterator)

  def get_state(self) -> dict[str, Any]:
    return self.iterator.get_state()

  def set_state(self, state: Mapping[str, Any]) -> None:
    self.iterator.set_state(state)


@dataclasses.dataclass(frozen=True)
class StepInfo:
  """One finished step: `step` counts steps done (the state's step after the update)."""

  step: int
  state: Any
  metrics: Mapping[str, jax.Array]  # still on device
  batch: Mapping[str, jax.Array]
  last: bool  # the last step of this invocation (end, stop_after_steps or preemption)
  stopping: bool  # preempted / interrupted: the run stops after this step
  stream: Stream | None = None  # the batch stream (a hook may replace its iterator)


@dataclasses.dataclass(frozen=True)
class RunContext:
  """What the trainer hands a caller's hook once, before the loop (`Hook.start`)."""

  workdir: Any  # an epath.Path, local or gs://
  setup: Any  # train.Setup: the mesh, the objective, the boxed parameters and their shardings
  model_config: Any  # configs.ST5Config
  vocab_file: str
  rules: Any  # the logical-axis rules the step runs with
  num_train_steps: int
  stream: Stream


@dataclasses.dataclass(frozen=True)
class Hook:
  """`fn(info)` at multiples of any of `every` (0 or negative: never), and on the last step with `at_end`.

  A hook with state names itself: `state_dict()` is saved with every checkpoint (under
  meta["hooks"][name]) and `load_state_dict(state, stream)` gets it back, with the batch
  stream, when a run resumes -- before the stream's data state is restored. `start(context)`
  runs once per invocation, after the stream is made and before any `load_state_dict`.
  """

  fn: Callable[[StepInfo], None]
  every: int | tuple[int, ...]
  at_end: bool = False
  name: str | None = None
  state_dict: Callable[[], Mapping[str, Any]] | None = None
  load_state_dict: Callable[[Mapping[str, Any], Stream], None] | None = None
  start: Callable[[RunContext], None] | None = None

  def __post_init__(self):
    object.__setattr__(self, "every", (self.every,) if isinstance(self.every, int) else tuple(self.every))
    if (self.state_dict is None) != (self.load_state_dict is None):
      raise ValueError("a hook with state needs both state_dict and load_state_dict")
    if self.state_dict is not None and not self.name:
      raise ValueError("a hook with state needs a name (its key in the checkpoint)")

  def due(self, info: StepInfo) -> bool:
    return (self.at_end and info.last) or any(n > 0 and info.step % n == 0 for n in self.every)


class Hooks:
  """An ordered list of hooks; `add_hook(fn, every=N)` or `every=(N, M)` (due at multiples of either)."""

  def __init__(self):
    self.hooks: list[Hook] = []

  def add_hook(self, fn: Callable[[StepInfo], None], *, every: int | Sequence[int], at_end: bool = False) -> None:
    self.add(Hook(fn, every if isinstance(every, int) else tuple(every), at_end))

  def add(self, hook: Hook) -> None:
    if hook.name and hook.name in {h.name for h in self.hooks}:
      raise ValueError(f"two hooks are named {hook.name!r}; a hook's name keys its state in the checkpoint")
    self.hooks.append(hook)

  def state_dict(self) -> dict[str, Any]:
    """The state of every hook that keeps one, by name (saved in the checkpoint's metadata)."""
    return {h.name: dict(h.state_dict()) for h in self.hooks if h.state_dict is not None}

  def start(self, context: RunContext) -> None:
    for h in self.hooks:
      if h.start is not None:
        h.start(context)

  def load_state_dict(self, states: Mapping[str, Any], stream: Stream) -> None:
    """Hands each stateful hook its saved state; a hook the checkpoint does not know starts fresh."""
    for h in self.hooks:
      if h.load_state_dict is not None and h.name in states:
        h.load_state_dict(states[h.name], stream)

  def run(self, info: StepInfo) -> None:
    for hook in self.hooks:
      if hook.due(info):
        hook.fn(info)


class NanGuard:
  """Raises NonFiniteLossError naming the first step whose loss or gradient norm is not finite.

  `record` (every step) keeps each step's loss and gradient norm on device; `check` (every
  logged step, and before every save: a checkpoint step is a logged step) fetches them, so
  a non-finite value is reported at the step it happened, not at the step it was seen, and
  a poisoned state is never saved.
  """

  def __init__(self, mngr):
    self.mngr = mngr
    self.unchecked: list[tuple[int, jax.Array, jax.Array]] = []

  def record(self, info: StepInfo) -> None:
    self.unchecked.append((info.step, info.metrics["loss"], info.metrics["grad_norm"]))

  def check(self, info: StepInfo) -> None:
    del info
    steps, self.unchecked = jax.device_get(self.unchecked), []
    for step, loss, grad_norm in steps:
      if not (math.isfinite(float(loss)) and math.isfinite(float(grad_norm))):
        self.mngr.wait_until_finished()
        raise NonFiniteLossError(
            f"Non-finite loss ({float(loss)}) or gradient norm ({float(grad_norm)}) at step {step}; stopping "
            f"without saving. The last good checkpoint is step {self.mngr.latest_step()} in "
            f"{self.mngr.directory}. Check that step's batch (token ids outside the vocabulary give NaN "
            "embeddings) and the parameters; lower the learning rate, or use float32 activations.")


def tokens_per_example(batch: Mapping[str, jax.Array]) -> int:
  # Token features are integer [B, L]: not [B] labels, nor a teacher's float vectors (st5_jax.objectives.distill).
  return sum(int(v.shape[1]) for v in batch.values()
             if v.ndim == 2 and jax.numpy.issubdtype(v.dtype, jax.numpy.integer))


class Throughput:
  """Examples, tokens and steps per second since the last logged step."""

  def __init__(self, global_batch_size: int):
    self.global_batch_size = global_batch_size
    self._reset(time.perf_counter())

  def _reset(self, now: float) -> None:
    self.t_last, self.steps, self.examples, self.tokens = now, 0, 0, 0

  def count(self, info: StepInfo) -> None:
    self.steps += 1
    self.examples += self.global_batch_size
    self.tokens += self.global_batch_size * tokens_per_example(info.batch)

  def rates(self) -> dict[str, float]:
    """The rates since the previous call; starts the next interval."""
    now = time.perf_counter()
    dt = max(now - self.t_last, 1e-9)
    rates = dict(examples_per_sec=self.examples / dt, tokens_per_sec=self.tokens / dt, steps_per_sec=self.steps / dt)
    self._reset(now)
    return rates


class LogMetrics:
  """Fetches the step's metrics, adds throughput, writes them (metrics.jsonl, TensorBoard) and shows them."""

  def __init__(self, writer, throughput: Throughput, *, num_train_steps: int, bar=None, lead: bool = True):
    self.writer, self.throughput, self.bar = writer, throughput, bar
    self.num_train_steps = num_train_steps
    self.lead = lead
    self.last: dict[str, float] = {}

  def __call__(self, info: StepInfo) -> None:
    host = {k: float(v) for k, v in jax.device_get(info.metrics).items()}
    host.update(self.throughput.rates())
    self.writer.write(info.step, host)
    self.last = host
    # Every objective reports `loss`; `accuracy` where it has one (not alignment + uniformity).
    acc = {"acc": f"{host['accuracy']:.2f}"} if "accuracy" in host else {}
    if self.bar is not None:
      self.bar.set_postfix(loss=f"{host['loss']:.3f}", **acc, ex_s=f"{host['examples_per_sec']:.0f}", refresh=False)
    elif self.lead:  # no progress bar (pods, logs): one line per logged step
      log.info("step %d/%d: loss %.4f,%s %.0f examples/s", info.step, self.num_train_steps, host["loss"],
               f" accuracy {host['accuracy']:.3f}," if acc else "", host["examples_per_sec"])


def describe(scores: Mapping[str, float]) -> str:
  """'STS-B dev Spearman 68.09' / 'TREC-QA-dev/MRR@10 0.412' for the log."""
  return ", ".join(f"STS-B dev Spearman {v:.2f}" if k == "stsb_dev_spearman" else f"{k} {v:.4f}"
                   for k, v in scores.items())


class PeriodicEval:
  """The dev metrics of the current parameters (one evaluator, compiled once, reused every call)."""

  def __init__(self, evaluate: Callable[[Any], Mapping[str, float] | None], writer, *, skip_step: int,
               on_score: Callable[[int, float, Any], None] | None = None, metric: str = "stsb_dev_spearman"):
    self.evaluate, self.writer = evaluate, writer
    self.skip_step = skip_step  # the final step: evaluated once after training instead
    self.on_score = on_score  # early stopping's BestKeeper.update, with `metric`'s value
    self.metric = metric

  def __call__(self, info: StepInfo) -> None:
    if info.step == self.skip_step:
      return
    scores = self.evaluate(info.state.params)
    if scores is not None:
      self.writer.write(info.step, dict(scores), prefix="eval")
      log.info("step %d: %s", info.step, describe(scores))
      if self.on_score is not None:
        self.on_score(info.step, scores[self.metric], info.state)


@dataclasses.dataclass(frozen=True)
class EarlyStopping:
  """Keep the best evaluated parameters in WORKDIR/best; stop after `patience` evaluations without improvement.

  The metric is one of the in-training evaluation's `TrainConfig.eval_metrics` (higher is
  better): STS-B dev Spearman x 100 by default, or a dev retrieval measure such as
  "TREC-QA-dev/MRR@10"; taken every `TrainConfig.eval_every` steps and after the last step
  (not before training).
  An evaluation improves when it beats the best so far by more than `min_delta`.
  `patience=None` never stops early (the best is still kept). As sentence-transformers'
  `fit(evaluator=..., save_best_model=True)` and ConSERT's official runs, plus the stop.
  """

  patience: int | None = 5
  min_delta: float = 0.0
  metric: str = "stsb_dev_spearman"

  def __post_init__(self):
    if self.patience is not None and self.patience < 1:
      raise ValueError(f"EarlyStopping.patience must be >= 1 or None, got {self.patience}")
    if self.min_delta < 0:
      raise ValueError(f"EarlyStopping.min_delta must be >= 0, got {self.min_delta}")
    if not self.metric:
      raise ValueError("EarlyStopping.metric must name one of TrainConfig.eval_metrics")


class BestKeeper:
  """Best score, its step and the evaluations since; saves the best parameters; says when to stop.

  Its `state_dict()` rides in every checkpoint's metadata, so a resumed run continues with
  the same best-so-far and patience count. Every process sees the same scores (the
  evaluation is one sharded computation), so every process decides the same.
  """

  def __init__(self, config: EarlyStopping, save_best: Callable[[Any, int, float], None],
               restored: Mapping[str, Any] | None = None):
    self.config, self.save_best = config, save_best
    r = dict(restored or {})
    self.best: float | None = r.get("best")
    self.best_step: int | None = r.get("best_step")
    self.bad: int = int(r.get("bad_evaluations", 0))
    self.stopped_at: int | None = r.get("stopped_at")

  def update(self, step: int, score: float, state: Any) -> None:
    if not math.isfinite(score):  # a NaN score never becomes the best
      self.bad += 1
      log.warning("step %d: %s is %s; counted as no improvement", step, self.config.metric, score)
    elif self.best is None or score > self.best + self.config.min_delta:
      self.best, self.best_step, self.bad = float(score), step, 0
      self.save_best(state, step, float(score))
      log.info("step %d: best %s so far (%.4g); kept in best/", step, self.config.metric, score)
    else:
      self.bad += 1
      log.info("step %d: no improvement on %s (step %s) for %d evaluation(s)%s", step, self.best,
               self.best_step, self.bad, f" of {self.config.patience}" if self.config.patience else "")
    if self.config.patience is not None and self.bad >= self.config.patience and self.stopped_at is None:
      self.stopped_at = step

  @property
  def should_stop(self) -> bool:
    return self.stopped_at is not None

  def state_dict(self) -> dict[str, Any]:
    return {"best": self.best, "best_step": self.best_step, "bad_evaluations": self.bad,
            "stopped_at": self.stopped_at, "metric": self.config.metric}


class Checkpoint:
  """Saves the state and the data position; a preemption save is forced (any step)."""

  def __init__(self, save: Callable[..., None], writer):
    self.save, self.writer = save, writer

  def __call__(self, info: StepInfo) -> None:
    self.save(info.state, info.step, force=info.stopping)
    if not info.stopping:
      self.writer.flush()


def trainer_hooks(*, mngr, writer, save: Callable[..., None], evaluate: Callable[[Any], float | None],
                  on_score: Callable[[int, float, Any], None] | None, caller: Sequence[Hook], global_batch_size: int,
                  num_train_steps: int, log_every: int, checkpoint_every: int, eval_every: int, bar=None,
                  lead: bool = True, metric: str = "stsb_dev_spearman") -> tuple[Hooks, LogMetrics]:
  """The trainer's hooks in their order (module doc), with the caller's before the checkpoint.

  Returns the hooks and the metrics hook (whose `last` is the run's last logged metrics).
  """
  nan_guard = NanGuard(mngr)
  throughput = Throughput(global_batch_size)
  metrics = LogMetrics(writer, throughput, num_train_steps=num_train_steps, bar=bar, lead=lead)
  logged = (log_every, checkpoint_every)  # a checkpoint step is a logged (and NaN-checked) step
  hooks = Hooks()
  hooks.add_hook(nan_guard.record, every=1)
  hooks.add_hook(throughput.count, every=1)
  hooks.add_hook(nan_guard.check, every=logged, at_end=True)
  hooks.add_hook(metrics, every=logged, at_end=True)
  if bar is not None:
    hooks.add_hook(lambda info: bar.update(1), every=1)
  hooks.add_hook(PeriodicEval(evaluate, writer, skip_step=num_train_steps, on_score=on_score, metric=metric),
                 every=eval_every)
  for hook in caller:  # before the checkpoint: what they change at a step is saved with it
    hooks.add(hook)
  hooks.add_hook(Checkpoint(save, writer), every=checkpoint_every, at_end=True)
  return hooks, metrics
