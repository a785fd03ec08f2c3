"""What an export starts from: any model `SentenceEncoder.load` reads, as float32 arrays."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from st5_jax import paths
from st5_jax.checkpoints import loader, tree
from st5_jax.configs import ST5Config
from st5_jax.model.st5 import strip_tower


@dataclasses.dataclass
class ExportSource:
  """A tower ready to export: float32, unscanned config and T5X-named arrays."""

  path: str
  format: str  # as loader.detect_format
  config: ST5Config
  flat: dict[str, np.ndarray]
  vocab_file: str
  # Checkpoint step of a native model folder / work dir; None when unknown.
  step: int | None = None
  # The pooling the checkpoint was trained with, when the export uses another (a
  # layer_attention model exported with its attention head removed).
  trained_pooling: str | None = None


# The form a layer_attention model takes where its pooling cannot be expressed
# (sentence-transformers): the mean of the last layer, then the trained projection. This
# removed-at-inference form is this project's own: LayerAttPooler's paper and official code
# (nlpods/LayerAttPooler) always run the attention head.
# Measured (docs/results.md, lap_tiny_cpu at 900 steps): the mean keeps the full model's
# STS average (50.02 vs 48.67) where the last layer's first token, the c_L the head
# reads, loses 10 points (38.22): the head reads mostly a middle layer.
LAYER_ATTENTION_REMOVED_POOLING = "enc_mean"


def remove_layer_attention(src: ExportSource, *, pooling: str = LAYER_ATTENTION_REMOVED_POOLING) -> ExportSource:
  """The layer_attention tower `src` with its attention head removed at inference."""
  if src.config.pooling != "layer_attention":
    raise ValueError(f"{src.path} is not a layer_attention model (pooling {src.config.pooling})")
  if pooling not in ("enc_first", "enc_mean"):
    raise ValueError(f"a removed layer-attention head leaves enc_first or enc_mean pooling, not {pooling!r}")
  flat = {k: v for k, v in src.flat.items() if not strip_tower(k).startswith("layer_attention/")}
  return dataclasses.replace(src, config=src.config.replace(pooling=pooling), flat=flat,
                             trained_pooling="layer_attention")


def load_source(path: paths.PathLike, *, vocab: str | None = None, pooling: str | None = None,
                max_length: int | None = None, checkpoint: str = "auto") -> ExportSource:
  """Loads `path` (local or gs://) for export: float32 activations, no scan, no remat, parameters checked.
  `checkpoint`: of a work dir, "latest", "best" or "auto" (native.choose_checkpoint)."""
  from st5_jax.checkpoints import native  # pylint: disable=g-import-not-at-top
  path = native.choose_checkpoint(path, checkpoint)
  # Numerics of the exported graph: fp32 activations (the parity promise), unrolled layers
  # (names stay per-layer), no rematerialisation (inference only).
  overrides: dict[str, Any] = {"dtype": "float32", "scan_layers": False, "remat_policy": "none"}
  config, params, report, fmt = loader.load_model(path, pooling=pooling, t5_overrides=overrides)
  if max_length is not None:
    if max_length < 1:
      raise ValueError(f"max_length must be >= 1, got {max_length}")
    config = config.replace(max_length=max_length)
  flat = {k: np.asarray(v, np.float32) for k, v in tree.flatten(params).items()}
  del params
  vocab_file = loader.resolve_vocab(path, fmt, vocab)
  step = loader.model_step(path, fmt)
  head_removed = any(strip_tower(k).startswith("layer_attention/") for k in report.unused)
  return ExportSource(path=path, format=fmt, config=config, flat=flat, vocab_file=vocab_file, step=step,
                      trained_pooling="layer_attention" if head_removed else None)
