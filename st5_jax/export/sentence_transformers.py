"""sentence-transformers export in the layout of the public sentence-t5 models.

    DIR/                       the Transformer module (path ""): a Hugging Face T5EncoderModel
      config.json, model.safetensors, spiece.model, tokenizer files,
      sentence_bert_config.json (max_seq_length)
    DIR/1_Pooling/config.json  first-token (enc_first) or mean (enc_mean) pooling
    DIR/2_Dense/               projection: linear.weight [out, in], no bias, Identity activation
    DIR/3_Normalize/           L2 normalisation
    DIR/modules.json, README.md
    DIR/config_sentence_transformers.json   the model's prompts, default_prompt_name and truncate_dim

Asymmetric towers (ST5Config.towers) become a `Router` (sentence-transformers >= 5) with a "query" and a
"document" route, default route "document" (Router.for_query_document's, and `SentenceEncoder.encode`'s
without a task), then one Normalize:

    DIR/modules.json           [Router (path ""), Normalize]
    DIR/router_config.json     types, structure (route -> module folders), default_route
    DIR/query_0_Transformer/   the query tower's T5 (the shared one for towers="projection")
    DIR/query_1_Pooling/       pooling (both routes)
    DIR/query_2_Dense/         the query projection
    DIR/document_0_Transformer/  towers="separate" only: the document tower's T5
    DIR/document_2_Dense/      the document projection

Only the weights and JSON are written here (safetensors, no torch needed); when
transformers is installed its T5Tokenizer adds tokenizer.json. st5_jax reads the folder
back with st5_jax.checkpoints.sentence_transformers.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import tempfile
from typing import Mapping, MutableMapping

import numpy as np
from safetensors.numpy import save_file

from st5_jax import vocab
from st5_jax.checkpoints import hf
from st5_jax.configs import ST5Config
from st5_jax.encode_options import DEFAULT_ROUTE, SIDES
from st5_jax.model.st5 import side_flat

VOCAB_FILE = "spiece.model"
CONFIG_FILE = "config_sentence_transformers.json"
_LEGACY = "sentence_transformers.models."
ROUTER_CONFIG_FILE = "router_config.json"
# Hugging Face's T5 config can express these MLPs exactly (feed_forward_proj).
_HF_ACTIVATIONS = {("relu",), ("gelu_exact",), ("silu",), ("gelu", "linear"), ("relu", "linear"),
                   ("silu", "linear")}


class UnsupportedExportError(ValueError):
  """The tower cannot be expressed in the target format; the message says why."""


def check_exportable(config: ST5Config) -> None:
  """Raises UnsupportedExportError when sentence-transformers cannot run this tower."""
  if config.uses_decoder:
    raise UnsupportedExportError(
        "encdec_first cannot be exported to sentence-transformers: its embedding is the first output "
        "of the T5 decoder (fed only the start token, attending to the encoder outputs), but a "
        "sentence-transformers Transformer module runs only the T5 encoder (T5EncoderModel) and its "
        "Pooling module only pools encoder token embeddings. Export it with --format savedmodel, or "
        "train an enc_first / enc_mean model for sentence-transformers.")
  if config.pooling == "layer_attention":
    raise UnsupportedExportError(
        "layer_attention pooling cannot be exported to sentence-transformers as it is: it reads every encoder "
        "layer, but the Pooling module sees only the last one. Export its removed-at-inference form (what "
        "`st5 export` does for such a model, or pass --pooling enc_first / enc_mean), or use --format savedmodel.")
  acts = tuple(config.t5.mlp_activations)
  if acts not in _HF_ACTIVATIONS:
    raise UnsupportedExportError(
        f"MLP activations {acts} have no exact Hugging Face T5 feed_forward_proj (supported: "
        f"{sorted(_HF_ACTIVATIONS)}); the exported encoder would compute something else.")


def st_config(config: ST5Config) -> dict:
  """config_sentence_transformers.json: prompts, default prompt, similarity, and truncate_dim when set.

  sentence-transformers reads truncate_dim from it and slices after the Normalize module without
  renormalising (st5_jax renormalises): `encode(..., normalize_embeddings=True)` gives st5_jax's vectors.
  """
  out = {"prompts": config.prompt_dict, "default_prompt_name": config.default_prompt_name,
         "similarity_fn_name": "cosine"}
  if config.truncate_dim is not None:
    out["truncate_dim"] = config.truncate_dim
  return out


def _encoder_state_dict(flat: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  encoder_only = {k: v for k, v in flat.items()
                  if k == "token_embedder/embedding" or k.startswith("encoder/")}
  sd = hf.to_hf_state_dict(encoder_only)
  # T5EncoderModel ties encoder.embed_tokens to shared; transformers saves it once.
  sd.pop("encoder.embed_tokens.weight", None)
  return sd


def _write_tokenizer(out: pathlib.Path, vocab_file: str, max_length: int) -> None:
  (out / VOCAB_FILE).write_bytes(vocab.model_proto(vocab_file))  # gs:// or a tokenizer.json too
  # Enough for transformers to build the tokenizer from spiece.model on its own.
  (out / "tokenizer_config.json").write_text(json.dumps({
      "tokenizer_class": "T5Tokenizer", "model_max_length": max_length, "extra_ids": vocab.EXTRA_IDS,
      "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}, indent=2))
  try:
    import transformers  # pylint: disable=g-import-not-at-top  (optional; seconds to import)
  except ImportError:
    return  # tokenizer.json is an optimisation; loaders convert spiece.model themselves.
  tok = transformers.T5Tokenizer.from_pretrained(str(out), model_max_length=max_length)
  tok.save_pretrained(str(out))


def _write_transformer(d: pathlib.Path, config: ST5Config, flat: Mapping[str, np.ndarray], vocab_file: str) -> None:
  """A Transformer module folder: the Hugging Face T5 encoder, its tokenizer, max_seq_length."""
  d.mkdir(exist_ok=True)
  hf_config = dict(hf.hf_config_from_t5(config.t5, encoder_only=True), dtype="float32")
  (d / "config.json").write_text(json.dumps(hf_config, indent=2))
  save_file(_encoder_state_dict(flat), str(d / "model.safetensors"), metadata={"format": "pt"})
  _write_tokenizer(d, vocab_file, config.max_length)
  (d / "sentence_bert_config.json").write_text(
      json.dumps({"max_seq_length": config.max_length, "do_lower_case": False}, indent=2))


def _write_pooling(d: pathlib.Path, config: ST5Config) -> None:
  d.mkdir()
  (d / "config.json").write_text(json.dumps({
      "word_embedding_dimension": config.t5.emb_dim,
      "pooling_mode_cls_token": config.pooling == "enc_first",
      "pooling_mode_mean_tokens": config.pooling == "enc_mean",
      "pooling_mode_max_tokens": False,
      "pooling_mode_mean_sqrt_len_tokens": False}, indent=2))


def _write_dense(d: pathlib.Path, kernel_DxE: np.ndarray) -> None:
  d.mkdir()
  kernel_DxE = np.asarray(kernel_DxE, np.float32)
  (d / "config.json").write_text(json.dumps({
      "in_features": int(kernel_DxE.shape[0]), "out_features": int(kernel_DxE.shape[1]), "bias": False,
      "activation_function": "torch.nn.modules.linear.Identity"}, indent=2))
  save_file({"linear.weight": np.ascontiguousarray(kernel_DxE.T)}, str(d / "model.safetensors"),
            metadata={"format": "pt"})


def _write_router(tmp: pathlib.Path, config: ST5Config, flat: Mapping[str, np.ndarray], vocab_file: str) -> None:
  """The Router module at the folder's root (see the module docstring): a route per side."""
  types, structure = {}, {}
  for side in SIDES:
    side_arrays = side_flat(dict(flat), config, side)
    owner = side if config.towers == "separate" else "query"  # "projection": one T5 for both routes
    ids = [f"{owner}_0_Transformer", "query_1_Pooling"]
    if config.embedding_dim is not None:
      ids.append(f"{side}_2_Dense")
    for module_id in ids:
      if module_id in types:
        continue
      kind = module_id.rsplit("_", 1)[-1]
      types[module_id] = _LEGACY + kind
      if kind == "Transformer":
        _write_transformer(tmp / module_id, config, side_arrays, vocab_file)
      elif kind == "Pooling":
        _write_pooling(tmp / module_id, config)
      else:
        _write_dense(tmp / module_id, side_arrays["projection_layer/kernel"])
    structure[side] = ids
  (tmp / ROUTER_CONFIG_FILE).write_text(json.dumps({
      "types": types, "structure": structure,
      "parameters": {"default_route": DEFAULT_ROUTE, "allow_empty_key": True, "route_mappings": {}}}, indent=2))


def export(*, config: ST5Config, flat: MutableMapping[str, np.ndarray], vocab_file: str,
           out: str | os.PathLike) -> dict[str, int]:
  """Writes the folder to `out` (which must not exist); returns {"bytes": size}."""
  check_exportable(config)
  out = pathlib.Path(out)
  if out.exists():
    raise FileExistsError(f"{out} exists; export writes a new directory")
  if config.embedding_dim is not None and not config.asymmetric and "projection_layer/kernel" not in flat:
    raise ValueError("config has a projection but the parameters have no projection_layer/kernel")
  out.parent.mkdir(parents=True, exist_ok=True)
  tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
  try:
    (tmp / CONFIG_FILE).write_text(json.dumps(st_config(config), indent=2))
    if config.asymmetric:
      _write_router(tmp, config, flat, vocab_file)
      modules = [{"idx": 0, "name": "0", "path": "", "type": _LEGACY + "Router"}]
    else:
      _write_transformer(tmp, config, flat, vocab_file)
      modules = [{"idx": 0, "name": "0", "path": "", "type": _LEGACY + "Transformer"}]
      _write_pooling(tmp / "1_Pooling", config)
      modules.append({"idx": 1, "name": "1", "path": "1_Pooling", "type": _LEGACY + "Pooling"})
      if config.embedding_dim is not None:
        dense_dir = tmp / f"{len(modules)}_Dense"
        _write_dense(dense_dir, flat["projection_layer/kernel"])
        modules.append({"idx": len(modules), "name": str(len(modules)), "path": dense_dir.name,
                        "type": _LEGACY + "Dense"})
    if config.normalize:
      norm_dir = tmp / f"{len(modules)}_Normalize"
      norm_dir.mkdir()
      modules.append({"idx": len(modules), "name": str(len(modules)), "path": norm_dir.name,
                      "type": _LEGACY + "Normalize"})
    (tmp / "modules.json").write_text(json.dumps(modules, indent=2))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; an export is meant to be shared.
    os.replace(tmp, out)
  finally:
    if tmp.exists():
      shutil.rmtree(tmp, ignore_errors=True)
  return {"bytes": sum(f.stat().st_size for f in out.rglob("*") if f.is_file())}
