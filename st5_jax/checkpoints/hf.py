"""Hugging Face T5 folders (config.json + safetensors / pytorch_model.bin) <-> T5X names.

Reads `T5EncoderModel` and `T5ForConditionalGeneration` layouts, T5 1.0 and T5.1.1,
without executing pickles: safetensors directly, `.bin` only through
`torch.load(weights_only=True)`. The name map is used in both directions, so export to
Hugging Face / sentence-transformers (st5_jax/export) writes what this reads.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
from typing import Any, Mapping

import numpy as np
from safetensors import safe_open

from st5_jax import paths
from st5_jax.configs import T5Config

_ATTN = {"q": "query", "k": "key", "v": "value", "o": "out"}
_ATTN_INV = {v: k for k, v in _ATTN.items()}
# (HF layer index, HF module) -> T5X module, per stack.
_ENC_SUB = {0: ("SelfAttention", "attention", "pre_attention_layer_norm"),
            1: ("DenseReluDense", "mlp", "pre_mlp_layer_norm")}
_DEC_SUB = {0: ("SelfAttention", "self_attention", "pre_self_attention_layer_norm"),
            1: ("EncDecAttention", "encoder_decoder_attention", "pre_cross_attention_layer_norm"),
            2: ("DenseReluDense", "mlp", "pre_mlp_layer_norm")}
_EMBED_ALIASES = ("shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight")


def hf_to_t5x_name(key: str) -> tuple[str, bool] | None:
  """HF state-dict key -> (T5X name, transpose?) or None when the key is not a T5 weight."""
  if key in _EMBED_ALIASES:
    return "token_embedder/embedding", False
  if key == "lm_head.weight":
    return "decoder/logits_dense/kernel", True
  m = re.match(r"^(encoder|decoder)\.final_layer_norm\.weight$", key)
  if m:
    return f"{m[1]}/{m[1]}_norm/scale", False
  m = re.match(r"^(encoder|decoder)\.block\.(\d+)\.layer\.(\d+)\.(.+)$", key)
  if not m:
    return None
  stack, block, sub, rest = m[1], int(m[2]), int(m[3]), m[4]
  table = _ENC_SUB if stack == "encoder" else _DEC_SUB
  if sub not in table:
    return None
  hf_module, t5x_module, t5x_norm = table[sub]
  if rest == "layer_norm.weight":
    return f"{stack}/layers_{block}/{t5x_norm}/scale", False
  m = re.match(rf"^{hf_module}\.relative_attention_bias\.weight$", rest)
  if m:
    return f"{stack}/relpos_bias/rel_embedding", True
  m = re.match(rf"^{hf_module}\.(q|k|v|o)\.weight$", rest)
  if m:
    return f"{stack}/layers_{block}/{t5x_module}/{_ATTN[m[1]]}/kernel", True
  m = re.match(rf"^{hf_module}\.(wi|wi_0|wi_1|wo)\.weight$", rest)
  if m:
    return f"{stack}/layers_{block}/mlp/{m[1]}/kernel", True
  return None


def t5x_to_hf_name(name: str) -> tuple[str, bool]:
  """T5X name -> (HF key, transpose?); the inverse of `hf_to_t5x_name`."""
  if name == "token_embedder/embedding":
    return "shared.weight", False
  if name == "decoder/logits_dense/kernel":
    return "lm_head.weight", True
  m = re.match(r"^(encoder|decoder)/(encoder|decoder)_norm/scale$", name)
  if m:
    return f"{m[1]}.final_layer_norm.weight", False
  m = re.match(r"^(encoder|decoder)/relpos_bias/rel_embedding$", name)
  if m:
    return f"{m[1]}.block.0.layer.0.SelfAttention.relative_attention_bias.weight", True
  m = re.match(r"^(encoder|decoder)/layers_(\d+)/([a-z_]+)/(.+)$", name)
  if not m:
    raise ValueError(f"{name} has no Hugging Face T5 equivalent")
  stack, block, module, rest = m[1], m[2], m[3], m[4]
  table = _ENC_SUB if stack == "encoder" else _DEC_SUB
  for sub, (hf_module, t5x_module, t5x_norm) in table.items():
    if module == t5x_norm:
      return f"{stack}.block.{block}.layer.{sub}.layer_norm.weight", False
    if module == t5x_module:
      leaf = rest.split("/")[0]
      hf_leaf = _ATTN_INV.get(leaf, leaf)
      return f"{stack}.block.{block}.layer.{sub}.{hf_module}.{hf_leaf}.weight", True
  raise ValueError(f"{name} has no Hugging Face T5 equivalent")


_ACT_FROM_HF = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu", "silu": "silu", "swish": "silu"}


def t5_config_from_hf(hf: Mapping[str, Any]) -> T5Config:
  proj = hf.get("feed_forward_proj", "relu")
  gated = proj.startswith("gated-")
  act = proj.split("-")[-1]
  if act not in _ACT_FROM_HF:
    raise ValueError(f"Unsupported feed_forward_proj {proj!r} in config.json")
  if gated:
    # HF maps "gated-gelu" to the tanh approximation ("gelu_new"), as T5X does.
    acts = (_ACT_FROM_HF[act], "linear")
  else:
    acts = ("gelu_exact",) if act == "gelu" else (_ACT_FROM_HF[act],)
  num_layers = hf.get("num_layers", 12)
  return T5Config(
      vocab_size=hf.get("vocab_size", 32128), emb_dim=hf["d_model"], num_heads=hf["num_heads"],
      head_dim=hf["d_kv"], mlp_dim=hf["d_ff"], num_encoder_layers=num_layers,
      num_decoder_layers=hf.get("num_decoder_layers") or num_layers, mlp_activations=acts,
      # transformers>=5 writes `scale_decoder_outputs` (True for T5 1.0) and always
      # `tie_word_embeddings: true`; older configs use `tie_word_embeddings` for both.
      logits_via_embedding=hf.get("scale_decoder_outputs", hf.get("tie_word_embeddings", True)),
      relative_attention_num_buckets=hf.get("relative_attention_num_buckets", 32),
      relative_attention_max_distance=hf.get("relative_attention_max_distance", 128),
      layer_norm_epsilon=hf.get("layer_norm_epsilon", 1e-6), dropout_rate=hf.get("dropout_rate", 0.1))


def hf_config_from_t5(cfg: T5Config, *, encoder_only: bool) -> dict[str, Any]:
  # Inverse of t5_config_from_hf: HF's "gelu" is exact GELU, its gated "gated-gelu" is the
  # tanh approximation; other combinations have no HF spelling.
  acts = tuple(cfg.mlp_activations)
  to_hf = {("relu",): "relu", ("gelu_exact",): "gelu", ("gelu",): "gelu_new", ("silu",): "silu",
           ("gelu", "linear"): "gated-gelu", ("relu", "linear"): "gated-relu", ("silu", "linear"): "gated-silu"}
  if acts not in to_hf:
    raise ValueError(f"MLP activations {acts} have no Hugging Face T5 feed_forward_proj")
  proj = to_hf[acts]
  return {
      "architectures": ["T5EncoderModel" if encoder_only else "T5ForConditionalGeneration"],
      "model_type": "t5", "vocab_size": cfg.vocab_size, "d_model": cfg.emb_dim, "d_kv": cfg.head_dim,
      "d_ff": cfg.mlp_dim, "num_layers": cfg.num_encoder_layers,
      "num_decoder_layers": cfg.num_decoder_layers, "num_heads": cfg.num_heads,
      "relative_attention_num_buckets": cfg.relative_attention_num_buckets,
      "relative_attention_max_distance": cfg.relative_attention_max_distance,
      "dropout_rate": cfg.dropout_rate, "layer_norm_epsilon": cfg.layer_norm_epsilon,
      "initializer_factor": 1.0, "feed_forward_proj": proj,
      "tie_word_embeddings": cfg.logits_via_embedding, "scale_decoder_outputs": cfg.logits_via_embedding,
      "is_encoder_decoder": not encoder_only,
      "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0, "use_cache": False,
  }


def to_hf_state_dict(flat: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Unscanned T5X-named arrays -> HF state dict (numpy, contiguous)."""
  out = {}
  for name, value in flat.items():
    if name.startswith("projection_layer/"):
      continue
    key, transpose = t5x_to_hf_name(name)
    arr = np.asarray(value, np.float32)
    out[key] = np.ascontiguousarray(arr.T if transpose else arr)
  if "shared.weight" in out:
    out["encoder.embed_tokens.weight"] = out["shared.weight"]
  return out


def read_state_dict(folder: str | os.PathLike, *, prefix: str = "") -> dict[str, np.ndarray]:
  """All tensors of a HF weights folder as float32 numpy arrays, without pickle execution."""
  folder = pathlib.Path(folder)
  files = sorted(folder.glob("*.safetensors"))
  if files:
    out = {}
    for f in files:
      # The "flax" framework reads bfloat16 too, which plain numpy cannot.
      try:
        with safe_open(str(f), framework="flax") as st:
          for k in st.keys():
            out[prefix + k] = np.asarray(st.get_tensor(k), np.float32)
      except Exception as e:  # noqa: BLE001  (SafetensorError and friends do not name the file)
        raise ValueError(f"{f} is not a readable safetensors file ({type(e).__name__}: {e}); it may be "
                         "truncated or corrupt.") from e
    return out
  bins = sorted(folder.glob("pytorch_model*.bin"))
  if bins:
    try:
      import torch  # pylint: disable=g-import-not-at-top  (optional and slow to import: .bin folders only)
    except ImportError as e:
      raise ImportError(f"{bins[0]} is a PyTorch file; reading it needs torch (`pip install torch`), "
                        "or convert the folder to safetensors.") from e
    out = {}
    for f in bins:
      sd = torch.load(str(f), map_location="cpu", weights_only=True)  # no pickle code execution
      out.update({prefix + k: v.float().numpy() for k, v in sd.items()})
    return out
  raise FileNotFoundError(f"No *.safetensors or pytorch_model*.bin weights in {folder}")


def is_hf_t5_folder(path: paths.PathLike) -> bool:
  """A folder (local or gs://) whose config.json says model_type t5/mt5."""
  cfg = paths.join(path, "config.json")
  if not paths.is_file(cfg):
    return False
  try:
    return json.loads(paths.read_text(cfg)).get("model_type") in ("t5", "mt5")
  except (ValueError, UnicodeDecodeError, AttributeError):
    return False


def load_folder(path: str | os.PathLike) -> tuple[T5Config, dict[str, np.ndarray], list[str]]:
  """(config, T5X-named arrays, unrecognised HF keys) of a HF T5 folder."""
  path = pathlib.Path(path)
  hf_cfg = json.loads((path / "config.json").read_text())
  cfg = t5_config_from_hf(hf_cfg)
  state = read_state_dict(path)
  flat, unknown = {}, []
  for key, value in state.items():
    mapped = hf_to_t5x_name(key)
    if mapped is None:
      unknown.append(key)
      continue
    name, transpose = mapped
    if name == "decoder/logits_dense/kernel" and cfg.logits_via_embedding:
      continue  # tied: lm_head is a copy of the embedding
    flat[name] = value.T if transpose else value
  if (not cfg.logits_via_embedding and "decoder/layers_0/mlp/wo/kernel" in flat
      and "decoder/logits_dense/kernel" not in flat):
    # transformers>=5 ties lm_head to the embedding and saves it once.
    flat["decoder/logits_dense/kernel"] = flat["token_embedder/embedding"].T
  return cfg, flat, unknown
