"""The interface of a training objective, and the registry the trainer looks objectives up in.

An objective is a frozen dataclass (its fields are its settings, bound by gin:
`TrainConfig.objective = @ConsertJoint()`, `ConsertJoint.view2 = 'token_cutoff'`) that
tells the trainer, the ahead-of-time check and the FLOP counter everything they need,
so none of them names an objective (t5x's `BaseModel`, sentence-transformers' losses):

  check(model_config, train_config)   refuse a model or run it cannot train, before anything compiles
  make_model(model_config)            the trainable module: the sentence tower, plus the heads the
                                      objective owns (ConSERT's NLI classifier, SEED's weak decoder)
  features(lengths)                   the batch features it reads, and their shapes (what `st5 aot` feeds it)
  make_value_and_grad(...)            (params, batch, dropout key) -> ((loss, metrics), grads)
  step_flops(...)                     model FLOPs of one step (forward + backward)
  load_pretrained(...)                its parameter tree from a pre-trained path (`run.init_from`)
  inference_towers(model_config)      what encodes at inference, by side (query / document): the module and
                                      the parameter subtrees of the trainable module it reads
  task_modules                        the modules that register the seqio tasks it ships
  example_gin                         its shipped tiny CPU gin file (the contract test builds it)

Objectives register themselves with `@register`; tests/test_objectives_contract.py covers
every registered one. docs/architecture.md walks through adding one.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
from typing import Any, Callable, ClassVar, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from st5_jax import paths
from st5_jax.checkpoints import loader, native
from st5_jax.configs import ST5Config
from st5_jax.model.st5 import SentenceT5, side_param_keys
from st5_jax.model.st5 import abstract_params as tower_abstract_params

log = logging.getLogger(__name__)
Array = jax.Array
# (params, batch, dropout key) -> ((loss, metrics), grads)
ValueAndGrad = Callable[[Any, Mapping[str, Array], Array], tuple[tuple[Array, dict], Any]]


# The sides an inference tower encodes: queries and documents (the same tower for a shared dual encoder).
SIDES = ("query", "document")


@dataclasses.dataclass(frozen=True)
class InferenceTower:
  """One side's encoder at inference: `module.apply({"params": {k: params[k] for k in param_keys}}, tokens_BxL)`.

  param_keys: the top-level parameter subtrees of the trainable module it reads (training
  may hold more: ConSERT's NLI head, SEED-Encoder's weak decoder).
  """

  module: nn.Module
  param_keys: tuple[str, ...]


class ObjectiveConfigError(ValueError):
  """An objective cannot train this model or run (raised by `check`, before compiling)."""


@dataclasses.dataclass(frozen=True)
class Feature:
  """A batch feature an objective reads: int32 [B, lengths[length_key]], or [B] when length_key is None."""

  length_key: str | None
  dtype: str = "int32"

  def shape(self, global_batch_size: int, lengths: Mapping[str, int]) -> tuple[int, ...]:
    if self.length_key is None:
      return (global_batch_size,)
    return (global_batch_size, int(lengths[self.length_key]))


def rebox(boxed_params: Any | None, params: Any) -> Any:
  """Re-attach logical axis names to raw parameters, so every use inside the model (also inside
  a scanned layer body) carries its sharding constraint; without it XLA may all-gather a whole
  stack of scanned fsdp-sharded layers outside the loop."""
  if boxed_params is None:
    return params
  is_box = lambda x: isinstance(x, nn.LogicallyPartitioned)  # noqa: E731
  return jax.tree.map(lambda box, x: box.replace_boxed(x), boxed_params, params, is_leaf=is_box)


def numerics(model_config: ST5Config) -> dict[str, Any]:
  """The T5 fields a run may change on a loaded checkpoint (not its architecture)."""
  t = model_config.t5
  return dict(dtype=t.dtype, dropout_rate=t.dropout_rate, scan_layers=t.scan_layers, remat_policy=t.remat_policy)


def refuse_asymmetric(objective: "Objective", model_config: ST5Config) -> None:
  """ObjectiveConfigError for asymmetric towers, in an objective that trains one shared tower."""
  if model_config.asymmetric:
    raise ObjectiveConfigError(f"{type(objective).__name__} trains one shared tower; st5_model.towers = "
                               f"{model_config.towers!r} (asymmetric towers) is for @Contrastive(), @Distill() and "
                               "@AlignUniform(): set st5_model.towers = 'shared'")


def check_same_architecture(path: str, fmt: str, loaded_t5, model_config: ST5Config) -> None:
  """Refuses a checkpoint whose T5 architecture differs from the run's (numerics may differ)."""
  t = model_config.t5
  if loaded_t5.replace(**numerics(model_config)) != t:
    diffs = {f: (getattr(loaded_t5, f), getattr(t, f)) for f in t.__dataclass_fields__
             if f not in numerics(model_config) and getattr(loaded_t5, f) != getattr(t, f)}
    raise ValueError(f"{path} ({fmt}) does not match the configured model: "
                     + ", ".join(f"{k}: checkpoint {a} vs config {b}" for k, (a, b) in diffs.items()))


class Objective:
  """Base class of the training objectives (subclasses are frozen dataclasses; see the module doc).

  The defaults describe an objective that trains the plain `SentenceT5` tower: override
  `make_model` for heads, `features`, `make_value_and_grad` and `step_flops` always.
  """

  name: ClassVar[str] = ""
  example_gin: ClassVar[str] = ""
  task_modules: ClassVar[tuple[str, ...]] = ()
  # Parameter prefixes of heads the objective adds to the tower (initialised fresh when a
  # pre-trained checkpoint lacks them; dropped at inference).
  head_prefixes: ClassVar[tuple[str, ...]] = ()

  def check(self, model_config: ST5Config, train_config: Any) -> None:
    del model_config, train_config

  def make_model(self, model_config: ST5Config) -> nn.Module:
    return SentenceT5(model_config)

  def init_params(self, model_config: ST5Config, rng: Array, *, length: int = 8) -> Any:
    """Boxed parameters of a fresh trainable module."""
    return self.make_model(model_config).init(rng, jnp.ones((1, length), jnp.int32))["params"]

  def abstract_params(self, model_config: ST5Config) -> Any:
    """Shapes and logical axes of the trainable module's parameters, without allocating them."""
    return jax.eval_shape(lambda: self.init_params(model_config, jax.random.PRNGKey(0)))

  def features(self, lengths: Mapping[str, int]) -> dict[str, Feature]:
    raise NotImplementedError

  def make_value_and_grad(self, model: nn.Module, boxed_params: Any, model_config: ST5Config,
                          train_config: Any) -> ValueAndGrad:
    raise NotImplementedError

  def step_flops(self, model_config: ST5Config, *, global_batch_size: int, lengths: Mapping[str, int]) -> float:
    raise NotImplementedError

  def load_pretrained(self, path: str, model_config: ST5Config, *, fresh_projection: bool,
                      rng: Array) -> tuple[Any, Any]:
    """(numpy parameter tree, load report) of the trainable module from any checkpoint format."""
    loaded_cfg, params, report, fmt = loader.load_model(
        path, pooling=model_config.pooling, embedding_dim=model_config.embedding_dim,
        fresh_projection=fresh_projection, rng=rng, t5_overrides=numerics(model_config), init_missing_head=True,
        head_prefixes=self.head_prefixes, towers=model_config.towers,
        abstract_fn=(lambda cfg: self.abstract_params(cfg)) if self.head_prefixes else None,
        init_fn=(lambda cfg, key: self.init_params(cfg, key)) if self.head_prefixes else None)
    check_same_architecture(path, fmt, loaded_cfg.t5, model_config)
    return params, report

  def init_from(self, path: str, model_config: ST5Config, *, init_projection: str = "auto", seed: int = 0) -> Any:
    """The parameter tree a run starts from (`run.init_from`): a work dir's best checkpoint when it kept one.

    init_projection: "auto" keeps the checkpoint's projection when it has one of the right
    size, else initialises one; "fresh" always initialises it (with PRNGKey(seed + 1)).
    """
    if init_projection not in ("auto", "fresh"):
      raise ValueError(f"init_projection must be 'auto' or 'fresh', got {init_projection!r}")
    chosen = native.choose_checkpoint(path, "auto")
    if chosen != os.fspath(paths.path(path)):
      log.info("init_from %s: its best checkpoint (%s), kept by early stopping", path, chosen)
    params, report = self.load_pretrained(chosen, model_config, fresh_projection=(init_projection == "fresh"),
                                          rng=jax.random.PRNGKey(seed + 1))
    log.info("Initialised from %s: %s", chosen, report.summary())
    return params

  def inference_towers(self, model_config: ST5Config) -> dict[str, InferenceTower]:
    """The towers that encode at inference, by side (SIDES): here one shared `SentenceT5` without dropout.

    The trainer's in-training evaluation encodes with them; an objective whose inference
    model differs (a removable head) overrides this. Asymmetric towers (ST5Config.towers) give each side
    its own tower: `SentenceT5(cfg, side=side)` on that side's parameters.
    """
    cfg = model_config.replace(t5=model_config.t5.replace(dropout_rate=0.0))
    if cfg.asymmetric:
      return {side: InferenceTower(SentenceT5(cfg, side=side), side_param_keys(cfg, side)) for side in SIDES}
    tower = InferenceTower(SentenceT5(cfg), tuple(tower_abstract_params(cfg)))
    return {side: tower for side in SIDES}

  # ------------------------------------------------------------------ shared by the callers

  def required_lengths(self, lengths: Mapping[str, int]) -> dict[str, Feature]:
    """`features(lengths)`, with a clear error for a length the data config does not give."""
    try:
      return self.features(lengths)
    except KeyError as e:
      raise ObjectiveConfigError(f"objective {type(self).__name__} needs a {e.args[0]!r} length in "
                                 f"DataConfig.feature_lengths (TASK_FEATURE_LENGTHS), got {dict(lengths)}") from None

  def import_tasks(self) -> None:
    for module in self.task_modules:
      importlib.import_module(module)


REGISTRY: dict[str, type[Objective]] = {}


def register(cls: type[Objective]) -> type[Objective]:
  """Class decorator: adds an objective to the registry (gin name = the class name)."""
  if not cls.name:
    raise ValueError(f"{cls.__name__} has no `name`")
  if cls.name in REGISTRY and REGISTRY[cls.name] is not cls:
    raise ValueError(f"objective name {cls.name!r} is taken by {REGISTRY[cls.name].__name__}")
  REGISTRY[cls.name] = cls
  return cls
