"""sentence-transformers folders in the layout of the public sentence-t5 models.

modules.json lists: a Transformer (a Hugging Face T5 encoder folder), Pooling (mean or
first token), Dense (no bias, identity activation; weight `linear.weight` [out, in]),
and optionally Normalize. Anything else cannot be expressed as a Sentence-T5 tower and
is refused with the reason. config_sentence_transformers.json's prompts, default_prompt_name
and truncate_dim are kept.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import numpy as np

from st5_jax.checkpoints import hf
from st5_jax.configs import ST5Config


def _module_type(entry: dict[str, Any]) -> str:
  return entry.get("type", "").rsplit(".", 1)[-1]


def _max_seq_length(tf_dir: pathlib.Path, root: pathlib.Path, default: int = 256) -> int:
  # sentence-transformers<6 writes sentence_bert_config.json:max_seq_length (the public
  # sentence-t5 folders); 6.x keeps it as the tokenizer's model_max_length.
  for d in (tf_dir, root):
    f = d / "sentence_bert_config.json"
    if f.is_file() and "max_seq_length" in (cfg := json.loads(f.read_text())):
      return int(cfg["max_seq_length"])
  for d in (tf_dir, root):
    f = d / "tokenizer_config.json"
    if f.is_file():
      n = json.loads(f.read_text()).get("model_max_length")
      if isinstance(n, int) and 0 < n < 100_000:
        return n
  return default


def load_folder(path: str | os.PathLike) -> tuple[ST5Config, dict[str, np.ndarray], dict[str, Any]]:
  """(config, T5X-named arrays including projection_layer/kernel, info) of a folder."""
  root = pathlib.Path(path)
  modules = json.loads((root / "modules.json").read_text())
  by_type = {}
  for entry in modules:
    by_type.setdefault(_module_type(entry), []).append(root / entry.get("path", ""))
  unsupported = sorted(set(by_type) - {"Transformer", "T5", "Pooling", "Dense", "Normalize"})
  if unsupported:
    raise ValueError(f"{root}: modules {unsupported} cannot be expressed as a Sentence-T5 tower")
  tf_dirs = by_type.get("Transformer") or by_type.get("T5")
  if not tf_dirs:
    raise ValueError(f"{root}/modules.json has no Transformer module")
  tf_dir = tf_dirs[0]
  if not hf.is_hf_t5_folder(tf_dir):
    raise ValueError(f"{tf_dir} is not a Hugging Face T5 folder (config.json model_type must be t5)")
  t5_cfg, flat, unknown = hf.load_folder(tf_dir)

  pooling = "enc_mean"
  if "Pooling" in by_type:
    pcfg = json.loads((by_type["Pooling"][0] / "config.json").read_text())
    modes = [k for k, v in pcfg.items() if k.startswith("pooling_mode") and v is True]
    mode = pcfg.get("pooling_mode") or (modes[0] if len(modes) == 1 else None)
    mapping = {"pooling_mode_mean_tokens": "enc_mean", "mean": "enc_mean",
               "pooling_mode_cls_token": "enc_first", "cls": "enc_first"}
    if mode not in mapping:
      raise ValueError(f"{by_type['Pooling'][0]}: pooling {modes or mode} is not first-token or mean pooling")
    pooling = mapping[mode]

  embedding_dim = None
  if "Dense" in by_type:
    if len(by_type["Dense"]) > 1:
      raise ValueError(f"{root}: more than one Dense module")
    ddir = by_type["Dense"][0]
    dcfg = json.loads((ddir / "config.json").read_text())
    act = dcfg.get("activation_function", "torch.nn.modules.linear.Identity")
    if dcfg.get("bias", True) or not act.endswith("Identity"):
      raise ValueError(f"{ddir}: Sentence-T5 projections have no bias and no activation "
                       f"(found bias={dcfg.get('bias', True)}, activation={act})")
    dense = hf.read_state_dict(ddir)
    flat["projection_layer/kernel"] = dense["linear.weight"].T
    embedding_dim = int(dcfg["out_features"])

  max_length = _max_seq_length(tf_dir, root)
  st_config = {}
  if (root / "config_sentence_transformers.json").is_file():
    st_config = json.loads((root / "config_sentence_transformers.json").read_text())
  config = ST5Config(t5=t5_cfg, pooling=pooling, embedding_dim=embedding_dim,
                     normalize="Normalize" in by_type, max_length=max_length,
                     prompts={k: v or "" for k, v in (st_config.get("prompts") or {}).items()},
                     default_prompt_name=st_config.get("default_prompt_name"),
                     truncate_dim=st_config.get("truncate_dim"))
  return config, flat, {"transformer_dir": str(tf_dir), "unknown_keys": unknown}
