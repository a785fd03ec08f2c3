"""Frozen model configurations: T5 sizes and the Sentence-T5 head.

Configs are plain data; gin binds them at the edges (gin/models/*.gin) and the model
code reads them. `T5Config` carries everything that changes the parameter tree or the
math; `ST5Config` adds pooling, projection and normalisation.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

POOLINGS = ("enc_first", "enc_mean", "encdec_first", "layer_attention")
# Token read as each layer's "[CLS]" by layer_attention pooling.
LAYER_ATTENTION_TOKENS = ("first", "eos")
REMAT_POLICIES = ("none", "full", "dots", "dots_with_no_batch_dims")
# Query / document towers (st5_jax/model/st5.py): one shared tower; a shared T5 with a projection per side;
# separate T5s and projections per side (t5x_retrieval's asymmetric dual encoder, ADE).
TOWERS = ("shared", "projection", "separate")


@dataclasses.dataclass(frozen=True)
class T5Config:
  """Shapes and numerics of a T5 encoder-decoder (T5 1.0 or T5.1.1)."""

  vocab_size: int = 32128
  emb_dim: int = 768
  num_heads: int = 12
  head_dim: int = 64
  mlp_dim: int = 3072
  num_encoder_layers: int = 12
  num_decoder_layers: int = 12
  # ("relu",) for T5 1.0; ("gelu", "linear") is T5.1.1's gated GELU (tanh approximation).
  mlp_activations: tuple[str, ...] = ("relu",)
  # T5 1.0 ties the output projection to the embedding; T5.1.1 has `logits_dense`.
  logits_via_embedding: bool = True
  relative_attention_num_buckets: int = 32
  relative_attention_max_distance: int = 128
  layer_norm_epsilon: float = 1e-6
  dropout_rate: float = 0.1
  # Activation dtype; parameters are always float32.
  dtype: str = "float32"
  # Scan over layers (one compiled layer body; stacked params with a "layers" axis).
  scan_layers: bool = False
  remat_policy: str = "none"

  def __post_init__(self):
    if self.remat_policy not in REMAT_POLICIES:
      raise ValueError(f"remat_policy must be one of {REMAT_POLICIES}, got {self.remat_policy!r}")
    if tuple(self.mlp_activations) != self.mlp_activations:
      object.__setattr__(self, "mlp_activations", tuple(self.mlp_activations))

  def replace(self, **kw) -> "T5Config":
    return dataclasses.replace(self, **kw)


@dataclasses.dataclass(frozen=True)
class ST5Config:
  """A Sentence-T5 tower: T5 + pooling + optional projection + L2 normalisation."""

  t5: T5Config = T5Config()
  pooling: str = "enc_mean"
  # Size of the projection (no bias) after pooling; None is the paper's raw mode:
  # pooled T5 outputs without projection.
  embedding_dim: int | None = 768
  normalize: bool = True
  # Longest token sequence (EOS included) the encoder sees at inference.
  max_length: int = 128
  # layer_attention pooling (st5_jax/model/layer_attention.py): the token whose state in
  # every layer is the query ("first", or the "eos" token), and whether the intermediate
  # states go through the encoder's final RMS norm first (False: Hugging Face's
  # `output_hidden_states`, raw residual streams).
  layer_attention_token: str = "first"
  layer_attention_norm: bool = True
  # Inference (the trainer's data prompts are DataConfig.prompts, whose query / document entries are added
  # here when training starts: st5_jax.train.train_prompts): text prepended to every input before tokenisation, by
  # name, as sentence-transformers' `prompts` (e.g. {"query": "query: ", "document": "passage: "}; a dict
  # is accepted and stored as (name, text) pairs sorted by name), and the name `encode` uses when given
  # none (sentence-transformers' `default_prompt_name`).
  prompts: tuple[tuple[str, str], ...] = ()
  default_prompt_name: str | None = None
  # Inference only: `encode` keeps the first truncate_dim dimensions (renormalised to unit length when the
  # model normalises); None keeps all output_dim. Set by `st5 export --truncate_dim` or a loaded
  # sentence-transformers folder's config, never by training.
  truncate_dim: int | None = None
  # What the query side (`inputs`) and the document side (`targets`, hard negatives) share: "shared" (one
  # tower), "projection" (one T5, `left_projection_layer` / `right_projection_layer`), "separate" (`left_tower/`
  # and `right_tower/`, each a whole tower). Omitted from to_dict when "shared" (old fingerprints unchanged).
  towers: str = "shared"

  def __post_init__(self):
    if self.pooling not in POOLINGS:
      raise ValueError(f"pooling must be one of {POOLINGS}, got {self.pooling!r}")
    if self.layer_attention_token not in LAYER_ATTENTION_TOKENS:
      raise ValueError(f"layer_attention_token must be one of {LAYER_ATTENTION_TOKENS}, "
                       f"got {self.layer_attention_token!r}")
    prompts = self.prompts.items() if isinstance(self.prompts, dict) else self.prompts
    pairs = tuple(sorted((name, text) for name, text in prompts))
    bad = [p for p in pairs if not (isinstance(p[0], str) and p[0] and isinstance(p[1], str))]
    if bad:
      raise ValueError(f"prompts map non-empty names to strings, e.g. {{'query': 'query: '}}; got {bad[0]!r}")
    names = [name for name, _ in pairs]
    if len(set(names)) != len(names):
      raise ValueError(f"prompts name {names} more than once")
    object.__setattr__(self, "prompts", pairs)
    if self.default_prompt_name is not None and self.default_prompt_name not in names:
      raise ValueError(f"default_prompt_name {self.default_prompt_name!r} is not one of the prompts "
                       f"({', '.join(names) or 'none defined'})")
    if self.towers not in TOWERS:
      raise ValueError(f"towers must be one of {TOWERS}, got {self.towers!r}")
    if self.towers == "projection" and self.embedding_dim is None:
      raise ValueError("towers='projection' puts a projection on each side; it needs st5_model.embedding_dim "
                       "(the raw mode, embedding_dim=None, has none): set one or use towers='separate'")
    if self.truncate_dim is not None and not 1 <= self.truncate_dim <= self.output_dim:
      raise ValueError(f"truncate_dim must be between 1 and the embedding size {self.output_dim}, "
                       f"got {self.truncate_dim}")

  @property
  def uses_decoder(self) -> bool:
    return self.pooling == "encdec_first"

  @property
  def output_dim(self) -> int:
    """Size of the tower's output (the projection's, else d_model)."""
    return self.embedding_dim if self.embedding_dim is not None else self.t5.emb_dim

  @property
  def encode_dim(self) -> int:
    """Size of what `encode` returns: truncate_dim when set, else output_dim."""
    return self.truncate_dim if self.truncate_dim is not None else self.output_dim

  @property
  def asymmetric(self) -> bool:
    """True when the query and document sides encode with different parameters."""
    return self.towers != "shared"

  @property
  def prompt_dict(self) -> dict[str, str]:
    return dict(self.prompts)

  def replace(self, **kw) -> "ST5Config":
    return dataclasses.replace(self, **kw)

  def to_dict(self) -> dict[str, Any]:
    """The fields as JSON types; the inference-only ones and `towers` only when set (so older configs read back
    unchanged and a model without prompts or asymmetric towers keeps the fingerprint it had)."""
    d = dataclasses.asdict(self)
    d["prompts"] = self.prompt_dict
    for key, unset in (("prompts", {}), ("default_prompt_name", None), ("truncate_dim", None),
                       ("towers", "shared")):
      if d[key] == unset:
        del d[key]
    return d

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), indent=2, sort_keys=True)

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> "ST5Config":
    d = dict(d)
    # Written before the NLI head moved to ConSERT's objective (2026-12): the head's parameters
    # stay in such checkpoints and are reported unused by the tower.
    d.pop("nli_classes", None)
    t5 = dict(d.pop("t5", {}))
    if "mlp_activations" in t5:
      t5["mlp_activations"] = tuple(t5["mlp_activations"])
    return cls(t5=T5Config(**t5), **d)


def _t5_1_0(emb, mlp, heads, head_dim, layers) -> T5Config:
  return T5Config(emb_dim=emb, mlp_dim=mlp, num_heads=heads, head_dim=head_dim,
                  num_encoder_layers=layers, num_decoder_layers=layers,
                  mlp_activations=("relu",), logits_via_embedding=True)


def _t5_1_1(emb, mlp, heads, head_dim, layers) -> T5Config:
  return T5Config(emb_dim=emb, mlp_dim=mlp, num_heads=heads, head_dim=head_dim,
                  num_encoder_layers=layers, num_decoder_layers=layers,
                  mlp_activations=("gelu", "linear"), logits_via_embedding=False)


# Shapes of the released T5 1.0 and T5.1.1 checkpoints (their T5X gin configs; Hugging Face
# google-t5/t5-* and google/t5-v1_1-*): vocabulary 32128; T5 1.0 ReLU MLP with logits tied to
# the embedding, T5.1.1 gated GELU with separate logits. The 11B encoder alone is about
# 4.86B parameters (tests/test_gin_and_launch.py counts it), the encoder-decoder 11.3B.
SIZES: dict[str, T5Config] = {
    "t5_small": _t5_1_0(512, 2048, 8, 64, 6),
    "t5_base": _t5_1_0(768, 3072, 12, 64, 12),
    "t5_large": _t5_1_0(1024, 4096, 16, 64, 24),
    "t5_3b": _t5_1_0(1024, 16384, 32, 128, 24),
    "t5_11b": _t5_1_0(1024, 65536, 128, 128, 24),
    "t5_1_1_small": _t5_1_1(512, 1024, 6, 64, 8),
    "t5_1_1_base": _t5_1_1(768, 2048, 12, 64, 12),
    "t5_1_1_large": _t5_1_1(1024, 2816, 16, 64, 24),
    "t5_1_1_xl": _t5_1_1(2048, 5120, 32, 64, 24),
    "t5_1_1_xxl": _t5_1_1(4096, 10240, 64, 64, 24),
    # Tiny sizes for tests and CPU runs (full T5 vocabulary, so real text works).
    "t5_tiny": _t5_1_0(32, 64, 4, 8, 2),
    "t5_1_1_tiny": _t5_1_1(32, 48, 4, 8, 2),
    # Small enough to train on 2 CPU cores in minutes, large enough to learn NLI.
    "t5_mini": _t5_1_0(128, 512, 4, 32, 4),
}


def t5_size(name: str, **overrides) -> T5Config:
  """A named size, optionally with fields replaced (e.g. dtype, scan_layers)."""
  try:
    cfg = SIZES[name]
  except KeyError:
    raise ValueError(f"Unknown T5 size {name!r}; known: {', '.join(SIZES)}") from None
  return cfg.replace(**overrides) if overrides else cfg
