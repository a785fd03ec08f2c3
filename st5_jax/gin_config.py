"""Gin at the edges: the configurables a run's gin files may bind, and the entry point.

Only constructors of frozen configs and `run` are configurable; nothing under jit or
inside the model and loss reads gin.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import pathlib
import re
import types
import typing
from typing import Any

import gin
from gin import config_parser

from st5_jax import configs, inference, multihost, objectives, optim, partitioning, paths, provenance, train
from st5_jax import hooks as hooks_lib
from st5_jax.checkpoints import lease as lease_lib, storage
from st5_jax.data import config as data_config
# Imported for their gin configurables (st5_jax.data.options, user_qa_pairs, ...), which must
# exist before a file is parsed; the objectives' task modules (seed_user_text, ...) are
# imported by `register`.
from st5_jax.data import registry as _registry  # noqa: F401
from st5_jax.retrieval import refresh as refresh_lib

_REGISTERED = False


@gin.configurable("st5_model")
def st5_model(size: str = "t5_base", *, pooling: str = "enc_mean", embedding_dim: int | None = 768,
              normalize: bool = True, max_length: int = 128, dtype: str | None = None,
              dropout_rate: float = 0.1, scan_layers: bool = False, remat_policy: str = "none",
              layer_attention_token: str = "first", layer_attention_norm: bool = True,
              prompts: dict[str, str] | None = None, default_prompt_name: str | None = None,
              towers: str = "shared", **t5_overrides: Any) -> configs.ST5Config:
  """An ST5Config from a named T5 size; dtype None = bfloat16 on accelerators, float32 on CPU.

  `prompts` / `default_prompt_name` are saved with the model (st5_config.json, every export) for
  inference (`encode(prompt_name=...)`, `encode_query`); training prepends DataConfig.prompts (whose
  query / document prompts are added here when the run starts: st5_jax.train.train_prompts).
  `towers`: "shared", "projection" or "separate" query / document parameters (st5_jax/model/st5.py).
  """
  if dtype is None:
    dtype = inference.default_dtype()
  t5 = configs.t5_size(size, dtype=dtype, dropout_rate=dropout_rate, scan_layers=scan_layers,
                       remat_policy=remat_policy, **t5_overrides)
  return configs.ST5Config(t5=t5, pooling=pooling, embedding_dim=embedding_dim, normalize=normalize,
                           max_length=max_length, layer_attention_token=layer_attention_token,
                           layer_attention_norm=layer_attention_norm, prompts=dict(prompts or {}),
                           default_prompt_name=default_prompt_name, towers=towers)


def register() -> None:
  """Registers the config classes (idempotent; `st5_model` and `run` are decorated)."""
  global _REGISTERED
  if _REGISTERED:
    return
  gin.external_configurable(optim.OptimizerConfig, "OptimizerConfig")
  gin.external_configurable(optim.AdamWConfig, "AdamWConfig")
  gin.external_configurable(train.TrainConfig, "TrainConfig")
  gin.external_configurable(train.DataConfig, "DataConfig")
  gin.external_configurable(hooks_lib.EarlyStopping, "EarlyStopping")
  gin.external_configurable(refresh_lib.NegativesRefresh, "NegativesRefresh")
  # Every registered objective, by its class name: TrainConfig.objective = @ConsertJoint().
  for cls in objectives.REGISTRY.values():
    gin.external_configurable(cls, cls.__name__)
  objectives.import_all_tasks()
  gin.external_configurable(partitioning.MeshConfig, "MeshConfig")
  gin.external_configurable(partitioning.rules_from_pairs, "logical_rules")
  _REGISTERED = True


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """Everything a gin file says about a run (what `run.*` binds)."""

  model: configs.ST5Config
  train_config: train.TrainConfig
  data: Any
  mesh: partitioning.MeshConfig
  init_from: str | None
  init_projection: str
  vocab: str | None
  rules: Any
  # What the run is sized for, e.g. {"slice": "v4-256", "topology": "v4:4x4x8",
  # "chip_hbm_gib": 32}; read by `st5 aot` and the docs, not by the trainer.
  target: dict[str, Any] | None
  # ANCE-style negatives mined again from the model in training: run.negatives_refresh = @NegativesRefresh().
  negatives_refresh: refresh_lib.NegativesRefresh | None = None


class GinConfigError(ValueError):
  """A mistake in a gin file or binding, in one line: `file:line: binding: what is wrong`."""


# Files parsed by `parse` (for naming where a binding came from once it is used).
_PARSED_FILES: list[str] = []


DEFAULT_OBJECTIVE_BINDING = "TrainConfig.objective = @Contrastive()"

# Bindings that moved when objectives became configurables (2026-12): old -> what to write.
MOVED_BINDINGS = {
    **{f"TrainConfig.{k}": f"Contrastive.{k} (with TrainConfig.objective = @Contrastive(), the default)"
       for k in ("temperature", "bidirectional", "label_smoothing", "loss", "hard_negative_weight")},
    **{f"TrainConfig.consert_{k}": f"ConsertUnsup.{k} or ConsertJoint.{k} (TrainConfig.objective = @ConsertUnsup() "
                                   "or @ConsertJoint())"
       for k in ("view1", "view1_rate", "view2", "view2_rate", "temperature", "weight", "shuffle")},
    "TrainConfig.seed_encoder": "TrainConfig.objective = @SeedEncoder() (its settings: SeedEncoder.num_layers, ...)",
    "SeedEncoderConfig": "SeedEncoder (TrainConfig.objective = @SeedEncoder(); SeedEncoder.num_layers, .window, "
                         ".memory, .decoder_loss_weight)",
    "st5_model.nli_classes": "ConsertJoint.nli_classes (the NLI head is ConSERT's joint objective's own)",
}


def _moved_hint(message: str) -> str:
  """' (moved: write X)' when `message` is about a binding of MOVED_BINDINGS."""
  for old in sorted(MOVED_BINDINGS, key=len, reverse=True):
    name, _, arg = old.rpartition(".")
    if old in message or (name and f"'{name}'" in message and f"'{arg}'" in message) or (
        not name and f"'{arg}'" in message):
      return f" ({old} moved: write {MOVED_BINDINGS[old]})"
  return ""


def _one_line(e: BaseException) -> str:
  """gin's 'message\n  In file "f", line n\n    text' as 'f:n: text: message'."""
  if isinstance(e, SyntaxError) and e.filename:
    return f"{e.filename}:{e.lineno}: {(e.text or '').strip()}: {e.msg}"
  text = str(e)
  m = re.search(r'\n\s*In file "([^"]*)", line (\d+)\n\s*(.*)', text)
  if not m:
    return " ".join(text.split())
  message = " ".join(text[:m.start()].split())
  return f"{m.group(1)}:{m.group(2)}: {m.group(3).strip()}: {message}"


def parse(files: list[str], bindings: list[str], *, finalize: bool = False) -> None:
  """gin.parse_config_files_and_bindings, its mistakes as one-line GinConfigErrors.

  Nothing is read or compiled here; `run_spec()` then checks types and REQUIRED bindings.
  """
  register()
  _PARSED_FILES[:] = list(files)
  try:
    # The default objective made by gin, so that `Contrastive.*` bindings reach it in any file.
    gin.parse_config(DEFAULT_OBJECTIVE_BINDING)
    gin.parse_config_files_and_bindings(files, bindings, finalize_config=finalize)
  except (ValueError, OSError, SyntaxError, TypeError) as e:
    line = _one_line(e)
    raise GinConfigError(line + _moved_hint(line)) from e


def shipped_gin_dir() -> pathlib.Path:
  """The gin files shipped with st5_jax: the wheel's packaged copy (st5_jax/gin), else a checkout's gin/.

  pyproject.toml maps the repository's top-level gin/ into the wheel as the package data
  `st5_jax/gin`, so `st5 train --gin_file st5_tiny_cpu.gin` works from an installed wheel
  as from a checkout (or an editable install, which has no packaged copy).
  """
  here = pathlib.Path(__file__).resolve().parent
  for candidate in (here / "gin", here.parent / "gin"):
    if candidate.is_dir():
      return candidate
  raise GinConfigError(f"no shipped gin files next to {here} (neither {here / 'gin'} nor {here.parent / 'gin'}); "
                       "reinstall st5_jax")


def find_gin_file(name: str, search_paths: list[str] = ()) -> str:
  """A gin file by path, else by name under each of `search_paths` in turn, else among the shipped ones.

  The user's own `--gin_search_path` folders come before the shipped files, so a file of
  theirs with a shipped file's name wins.
  """
  if os.path.isfile(name):
    return name
  folders = [*search_paths, str(shipped_gin_dir())]
  for folder in folders:
    candidate = os.path.join(folder, name)
    if os.path.isfile(candidate):
      return candidate
  raise GinConfigError(f"gin file {name!r} not found (looked in the current directory, then in "
                       f"{', '.join(folders)})")


class _QuietIncludes(logging.Filter):
  """Gin logs 'Path not found' for every search-path candidate it tries; hide those."""

  def filter(self, record) -> bool:
    return not str(record.getMessage()).startswith("Path not found:")


def parse_gin(files: list[str], bindings: list[str], search_paths: list[str] = ()) -> None:
  """Finds `files` (find_gin_file) and parses them and `bindings`; includes resolve the same way.

  The one entry for every command and library that reads a run's gin files (`st5 train`,
  `st5 aot`, `st5 sweep`, `st5 data cache --gin_file`, the tests).
  """
  logging.getLogger().addFilter(_QuietIncludes())
  gin.clear_config()
  for folder in [*search_paths, str(shipped_gin_dir())]:
    gin.add_config_file_search_path(folder)
  # One-line GinConfigErrors (file:line: binding: reason) for unknown keys, missing includes, syntax.
  parse([find_gin_file(f, search_paths) for f in files], bindings)


@dataclasses.dataclass(frozen=True)
class Binding:
  """One `selector.arg = value` line of a gin file, where it is and what it binds."""

  key: str  # "scope/full.selector.arg" (the configurable's registered selector), or a macro's name
  configurable: str | None  # the registered selector; None for a macro
  value: str  # repr of the parsed value
  file: str
  line: int


def trace(files: list[str], *, search_paths: list[str] | None = None) -> list[Binding]:
  """Every binding `files` make, in the order gin applies them (an include expands where it stands).

  The last binding of a key is the one a run reads; an earlier one of the same key is overridden.
  Includes are found as gin finds them (an absolute path, else under each search path in turn;
  default: gin's search paths). `import` lines are imported, so their configurables resolve.
  """
  register()
  prefixes = list(search_paths) if search_paths is not None else list(gin.config._LOCATION_PREFIXES)  # pylint: disable=protected-access
  out: list[Binding] = []

  def find(name: str) -> str:
    for prefix in [""] if os.path.isabs(name) else prefixes:
      candidate = os.path.join(prefix, name)
      if os.path.isfile(candidate):
        return candidate
    raise GinConfigError(f"{name}: gin file not found (searched {prefixes})")

  def visit(path: str) -> None:
    with open(path, encoding="utf-8") as f:
      parser = config_parser.ConfigParser(f, gin.config.ParserDelegate(skip_unknown=True))
      for st in parser:
        if isinstance(st, config_parser.IncludeStatement):
          visit(find(st.filename))
        elif isinstance(st, config_parser.ImportStatement):
          importlib.import_module(st.module)
        elif isinstance(st, config_parser.BindingStatement):
          match = gin.config._REGISTRY.get_match(st.selector) if st.arg_name else None  # pylint: disable=protected-access
          selector = match.selector if match else st.selector
          key = f"{st.scope + '/' if st.scope else ''}{selector}" + (f".{st.arg_name}" if st.arg_name else "")
          out.append(Binding(key=key, configurable=match.selector if match else None, value=repr(st.value),
                             file=path, line=st.location.line_num))

  for f in files:
    visit(find(f))
  return out


def _where(selector: str, arg: str) -> str:
  """'file:line' of the last binding of selector.arg in the parsed files (else the command line)."""
  pattern = re.compile(rf"^\s*(?:[\w./]*/)?{re.escape(selector)}\.{re.escape(arg)}\s*=")
  found = "command line or an included file"
  for f in _PARSED_FILES:
    try:
      lines = open(f, encoding="utf-8").read().splitlines()
    except OSError:
      continue
    for i, line in enumerate(lines, 1):
      if pattern.match(line):
        found = f"{f}:{i}"
  return found


def _type_ok(value: Any, hint: Any) -> bool:
  """Does `value` fit the annotation? Only the simple ones gin files bind are checked."""
  if hint is Any or isinstance(hint, typing.TypeVar):
    return True
  origin = typing.get_origin(hint)
  if origin in (typing.Union, types.UnionType):
    return any(_type_ok(value, h) for h in typing.get_args(hint))
  if hint is type(None):
    return value is None
  if hint is bool:
    return isinstance(value, bool)
  if hint is int:
    return isinstance(value, int) and not isinstance(value, bool)
  if hint is float:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
  if hint is str:
    return isinstance(value, str)
  if origin is not None and isinstance(origin, type) and origin.__module__ in ("builtins", "collections.abc"):
    return isinstance(value, origin)
  if isinstance(hint, type) and (hint.__module__ in ("builtins", "collections.abc") or dataclasses.is_dataclass(hint)):
    return isinstance(value, hint)
  return True


def check_types(obj: Any, selector: str) -> None:
  """Raises GinConfigError for the first field of a frozen config whose value has the wrong type."""
  if not dataclasses.is_dataclass(obj):
    return
  hints = typing.get_type_hints(type(obj))
  for f in dataclasses.fields(obj):
    value = getattr(obj, f.name)
    if f.name in hints and not _type_ok(value, hints[f.name]):
      raise GinConfigError(f"{_where(selector, f.name)}: {selector}.{f.name} = {value!r}: expected "
                           f"{_type_name(hints[f.name])}, got {type(value).__name__}")
    if dataclasses.is_dataclass(value):
      check_types(value, type(value).__name__)


def _type_name(hint: Any) -> str:
  return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


_CHECKED = {"train_config": "TrainConfig", "mesh": "MeshConfig", "data": "DataConfig",
            "negatives_refresh": "NegativesRefresh"}


@gin.configurable("run")
def _run_spec(*, model: configs.ST5Config = gin.REQUIRED, train_config: train.TrainConfig = gin.REQUIRED,
             data: Any = gin.REQUIRED, mesh: partitioning.MeshConfig = partitioning.MeshConfig(),
             init_from: str | None = None, init_projection: str = "auto", vocab: str | None = None,
             eval_data_dir: str | None = None, rules: Any = partitioning.DEFAULT_RULES,
             target: dict[str, Any] | None = None,
             negatives_refresh: refresh_lib.NegativesRefresh | None = None) -> RunSpec:
  """The run's configuration, as bound by gin (`run.model = @st5_model()`, ...)."""
  if eval_data_dir is not None:  # a second way to set the data folder, removed 2026-12
    raise GinConfigError(f"{_where('run', 'eval_data_dir')}: run.eval_data_dir is no longer read: bind "
                         f"{data_config.GIN_DATA_DIR} = {eval_data_dir!r} (or set {paths.DATA_DIR_ENV}); the "
                         "evaluation sets, the public tasks and the vocabulary are read from that one folder")
  spec = RunSpec(model=model, train_config=train_config, data=data, mesh=mesh, init_from=init_from,
                 init_projection=init_projection, vocab=vocab, rules=rules, target=target,
                 negatives_refresh=negatives_refresh)
  return spec


def run_spec() -> RunSpec:
  """The parsed run configuration; a REQUIRED binding left unset or a mistyped value is one GinConfigError."""
  try:
    spec = _run_spec()
  except RuntimeError as e:
    m = re.search(r"Required bindings for `(\w+)` not provided in config: \[(.*)\]", str(e))
    if not m:
      raise
    names = [n.strip(" '\"") for n in m.group(2).split(",")]
    files = ", ".join(_PARSED_FILES) or "the gin files"
    raise GinConfigError(f"{files}: {', '.join(f'{m.group(1)}.{n}' for n in names)} is REQUIRED but not bound "
                         f"(e.g. `{m.group(1)}.{names[0]} = ...`)") from e
  except (TypeError, ValueError) as e:
    line = _one_line(e)
    raise GinConfigError(line + _moved_hint(line)) from e
  # After the call: gin appends its own lines to errors raised inside a configurable.
  for field, selector in _CHECKED.items():
    check_types(getattr(spec, field), selector)
  return spec


def train_from_gin(*, workdir: str, progress: bool = True, lease: lease_lib.LeaseOptions = lease_lib.LeaseOptions(),
                   allow_config_change: bool = False) -> train.TrainResult:
  """Trains with the parsed gin config, holding the work dir's lease (st5_jax/checkpoints/lease.py).

  A start writes config.gin and operative_config.gin to the work dir; a resume checks its operative
  bindings against the recorded ones (st5_jax/provenance.py: a change outside its allow-list needs
  `allow_config_change`) and records any change in config_history.json.
  """
  spec = run_spec()
  vocab_file = paths.vocab_path(spec.vocab)
  eval_data_dir = data_config.data_dir(required=False)  # STS-B dev: the folder the tasks read
  config_text, operative_text = gin.config_str(), gin.operative_config_str()
  with lease_lib.hold(workdir, lease) as held:  # before anything is written to the work dir
    try:
      provenance.check_and_record(workdir, config_text=config_text, operative_text=operative_text,
                                  allow_change=allow_config_change, write=multihost.is_lead())
    except OSError as e:  # the config files could not be written: the work dir's one-line error
      err = storage.workdir_write_error(e, paths.path(workdir))
      if err is None:
        raise
      raise err from e
    return train.train(workdir=workdir, model_config=spec.model, train_config=spec.train_config,
                       make_iterator=spec.data, mesh_config=spec.mesh, init_from=spec.init_from,
                       init_projection=spec.init_projection, vocab_file=vocab_file, eval_data_dir=eval_data_dir,
                       rules=spec.rules, progress=progress,
                       run_info={"target": spec.target} if spec.target else None,
                       hooks=[spec.negatives_refresh.hook(spec.data)] if spec.negatives_refresh else [], lease=held)
