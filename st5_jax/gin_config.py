"""Gin at the edges: the configurables a run's gin files may bind, and the entry point.

Only constructors of frozen configs and `run` are configurable; nothing under jit or
inside the model and loss reads gin.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import gin

from st5_jax import configs, optim, partitioning, paths, train

_REGISTERED = False


@gin.configurable("st5_model")
def st5_model(size: str = "t5_base", *, pooling: str = "enc_mean", embedding_dim: int | None = 768,
              normalize: bool = True, max_length: int = 128, dtype: str | None = None,
              dropout_rate: float = 0.1, scan_layers: bool = False, remat_policy: str = "none",
              layer_attention_token: str = "first", layer_attention_norm: bool = True,
              **t5_overrides: Any) -> configs.ST5Config:
  """An ST5Config from a named T5 size; dtype None = bfloat16 on accelerators, float32 on CPU."""
  if dtype is None:
    import jax
    dtype = "float32" if jax.default_backend() == "cpu" else "bfloat16"
  t5 = configs.t5_size(size, dtype=dtype, dropout_rate=dropout_rate, scan_layers=scan_layers,
                       remat_policy=remat_policy, **t5_overrides)
  return configs.ST5Config(t5=t5, pooling=pooling, embedding_dim=embedding_dim, normalize=normalize,
                           max_length=max_length, layer_attention_token=layer_attention_token,
                           layer_attention_norm=layer_attention_norm)


def register() -> None:
  """Registers the config classes (idempotent; `st5_model` and `run` are decorated)."""
  global _REGISTERED
  if _REGISTERED:
    return
  gin.external_configurable(optim.OptimizerConfig, "OptimizerConfig")
  gin.external_configurable(train.TrainConfig, "TrainConfig")
  gin.external_configurable(train.DataConfig, "DataConfig")
  gin.external_configurable(configs.SeedEncoderConfig, "SeedEncoderConfig")
  gin.external_configurable(partitioning.MeshConfig, "MeshConfig")
  gin.external_configurable(partitioning.rules_from_pairs, "logical_rules")
  # Data configurables (st5_jax.data.options, user_qa_pairs, ...) must exist before parsing.
  import st5_jax.data.registry  # noqa: F401  pylint: disable=g-import-not-at-top
  import st5_jax.data.seed_pretraining  # noqa: F401  pylint: disable=g-import-not-at-top  (seed_user_text)
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
  eval_data_dir: str | None
  rules: Any
  # What the run is sized for, e.g. {"slice": "v4-256", "topology": "v4:4x4x8",
  # "chip_hbm_gib": 32}; read by `st5 aot` and the docs, not by the trainer.
  target: dict[str, Any] | None


@gin.configurable("run")
def run_spec(*, model: configs.ST5Config = gin.REQUIRED, train_config: train.TrainConfig = gin.REQUIRED,
             data: Any = gin.REQUIRED, mesh: partitioning.MeshConfig = partitioning.MeshConfig(),
             init_from: str | None = None, init_projection: str = "auto", vocab: str | None = None,
             eval_data_dir: str | None = None, rules: Any = partitioning.DEFAULT_RULES,
             target: dict[str, Any] | None = None) -> RunSpec:
  """The run's configuration, as bound by gin (`run.model = @st5_model()`, ...)."""
  return RunSpec(model=model, train_config=train_config, data=data, mesh=mesh, init_from=init_from,
                 init_projection=init_projection, vocab=vocab, eval_data_dir=eval_data_dir, rules=rules,
                 target=target)


def train_from_gin(*, workdir: str, progress: bool = True) -> train.TrainResult:
  """Trains with the parsed gin config; writes config.gin and operative_config.gin to the work dir."""
  import jax

  spec = run_spec()
  vocab_file = paths.vocab_path(spec.vocab)
  eval_data_dir = spec.eval_data_dir or os.environ.get(paths.DATA_DIR_ENV)
  if jax.process_index() == 0:
    paths.write_text(paths.join(workdir, "config.gin"), gin.config_str())
    paths.write_text(paths.join(workdir, "operative_config.gin"), gin.operative_config_str())
  return train.train(workdir=workdir, model_config=spec.model, train_config=spec.train_config,
                     make_iterator=spec.data, mesh_config=spec.mesh, init_from=spec.init_from,
                     init_projection=spec.init_projection, vocab_file=vocab_file, eval_data_dir=eval_data_dir,
                     rules=spec.rules, progress=progress, run_info={"target": spec.target} if spec.target else None)
