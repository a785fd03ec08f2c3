"""sentence-transformers folders in the layout of the public sentence-t5 models.

modules.json lists: a Transformer (a Hugging Face T5 encoder folder), Pooling (mean or
first token), Dense (no bias, identity activation; weight `linear.weight` [out, in]),
and optionally Normalize. Anything else cannot be expressed as a Sentence-T5 tower and
is refused with the reason. config_sentence_transformers.json's prompts, default_prompt_name
and truncate_dim are kept.

A `Router` with "query" and "document" routes (what `st5 export` writes for asymmetric towers,
st5_jax/export/sentence_transformers.py), then optionally Normalize, reads back as asymmetric towers:
"projection" when both routes share the Transformer module, "separate" when they do not ("shared" when
they share everything).
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import numpy as np

from st5_jax.checkpoints import hf
from st5_jax.configs import ST5Config
from st5_jax.model.st5 import SIDE_PREFIX, split_towers


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


def _load_router(root: pathlib.Path, modules: list[dict[str, Any]]
                 ) -> tuple[ST5Config, dict[str, np.ndarray], dict[str, Any]]:
  """A query / document Router (+ Normalize) as asymmetric towers (module docstring)."""
  kinds = [_module_type(m) for m in modules]
  if kinds not in (["Router"], ["Router", "Normalize"]):
    raise ValueError(f"{root}: a Router folder reads back as asymmetric Sentence-T5 towers only as "
                     f"[Router, Normalize] or [Router], got {kinds}")
  router_dir = root / modules[0].get("path", "")
  router = json.loads((router_dir / "router_config.json").read_text())
  structure = router.get("structure", {})
  if set(structure) != {"query", "document"}:
    raise ValueError(f"{router_dir}/router_config.json: routes {sorted(structure)}; asymmetric towers read "
                     "exactly 'query' and 'document'")
  sides = {}
  for side, ids in structure.items():
    entries = [{"type": router["types"][i], "path": str((router_dir / i).relative_to(root))} for i in ids]
    entries += [m for m in modules if _module_type(m) == "Normalize"]
    sides[side] = load_modules(root, entries)
  (cq, fq, info), (cd, fd, _) = sides["query"], sides["document"]
  if cq.replace(prompts=(), default_prompt_name=None) != cd.replace(prompts=(), default_prompt_name=None):
    raise ValueError(f"{root}: the query and document routes differ in more than their weights ({cq} vs {cd})")
  same_t5 = structure["query"][0] == structure["document"][0]
  towers = "shared" if structure["query"] == structure["document"] else "projection" if same_t5 else "separate"
  if towers == "separate":
    flat = {f"{SIDE_PREFIX[side]}_tower/{k}": v for side, (_, f, _) in sides.items() for k, v in f.items()}
  else:
    flat = split_towers(fq, towers)
    if towers == "projection":
      flat["right_projection_layer/kernel"] = fd["projection_layer/kernel"]
  default_route = router.get("parameters", {}).get("default_route")
  if towers != "shared" and default_route not in (None, "document"):
    raise ValueError(f"{router_dir}/router_config.json: default_route {default_route!r}; st5_jax's `encode` on "
                     "asymmetric towers takes the document route (sentence-transformers' for_query_document): "
                     "set it to 'document'")
  return cq.replace(towers=towers), flat, {**info, "router_default_route": default_route}


def load_folder(path: str | os.PathLike) -> tuple[ST5Config, dict[str, np.ndarray], dict[str, Any]]:
  """(config, T5X-named arrays including projection_layer/kernel, info) of a folder."""
  root = pathlib.Path(path)
  modules = json.loads((root / "modules.json").read_text())
  if modules and _module_type(modules[0]) in ("Router", "Asym"):
    return _load_router(root, modules)
  return load_modules(root, modules)


def load_modules(root: pathlib.Path, modules: list[dict[str, Any]]
                 ) -> tuple[ST5Config, dict[str, np.ndarray], dict[str, Any]]:
  """(config, arrays, info) of a [Transformer, Pooling, Dense, Normalize] module list under `root`."""
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
