"""TF SavedModel export: strings in, L2-normalised embeddings out, as the ST5 TF Hub models.

    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)
    model = tf.saved_model.load(DIR)
    emb_BxD = model(tf.constant(["A sentence.", "Another one."]))[0]
    emb_BxD = model.signatures["serving_default"](inputs=tf.constant([...]))["outputs"]
    q_BxD = model.signatures["prompt_query"](inputs=tf.constant([...]))["outputs"]  # a model with a "query" prompt

A model's prompts get a signature each (`prompt_` + the name: the prompt prepended in the graph);
`model(x)` / serving_default prepend the default prompt when the model names one; `model.embed(x)`
takes the texts as given. A config with truncate_dim truncates (and renormalises) every output in
the graph.

Asymmetric towers (ST5Config.towers) add a signature per side, `encode_query` and `encode_document`
(that side's tower, its "query" / "document" prompt prepended when the model has one, as
`SentenceEncoder.encode_query` / `encode_document`), and `model.embed_query(x)` / `model.embed_document(x)`
(texts as given). serving_default, `embed`, `encode_tokens` and the prompt signatures use the default route,
the document tower (st5_jax.encode_options.DEFAULT_ROUTE), except `prompt_query` / `prompt_document`, which
use their side's tower.

The forward pass is `SentenceT5(config).apply` converted with jax2tf (native
serialisation: one XlaCallModule op holding StableHLO, lowered for several platforms),
polymorphic in batch and length. Its parameters are arguments of that op fed from
tf.Variables, so weights are saved as variables (any model size) and never as graph
constants. Tokenisation runs in the graph with tensorflow_text's SentencepieceTokenizer:
pieces, truncation to max_length - 1, EOS, zero padding to a length bucket.

Layout of DIR (besides saved_model.pb and variables/):

    assets/spiece.model       the SentencePiece vocabulary
    assets/st5_config.json    the ST5Config of the exported tower
    assets/st5_export.json    parameter names (T5X, unscanned) in variable order, metadata
    README.md                 the model card

The layout's constants and its reader (`load_flat`, `read_config`, `read_metadata`, which
rebuild T5X-named arrays from the variables without JAX or tracing) live with the other
checkpoint readers in st5_jax.checkpoints.savedmodel; they are re-exported here.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import shutil
import tempfile
import time
from typing import Any, Mapping, MutableMapping, Sequence

import flax.linen as nn
import jax
import numpy as np
import sentencepiece as spm
from tqdm import tqdm

from st5_jax import encode_options, paths, vocab
from st5_jax.checkpoints import tree
# The layout and its reader (re-exported: `savedmodel.load_flat`, `read_config`, ... as before).
from st5_jax.checkpoints.savedmodel import (  # noqa: F401
    ASSETS_DIR, CONFIG_FILE, EXPORT_FILE, VOCAB_FILE, assets as _assets, is_export, load_flat,
    prompt_signature_key, read_config, read_metadata)
from st5_jax.configs import ST5Config
from st5_jax.inference import length_buckets
from st5_jax.model.st5 import SentenceT5, abstract_params

# TensorFlow (and jax2tf, which imports it) only inside the functions that run it:
# SentenceEncoder imports this module for SavedModelEncoder, and TensorFlow takes seconds
# to import.

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
INPUT_KEY = "inputs"
OUTPUT_KEY = "outputs"
TOKENS_KEY = "tokens"
# StableHLO lowered for all three lets one SavedModel serve on TF CPU, GPU and TPU builds;
# the runtime picks the lowering of the device it runs on.
DEFAULT_PLATFORMS = ("cpu", "cuda", "tpu")
BUILTIN_SIGNATURES = ("serving_default", "tokenize", "encode_tokens")


def _check_vocab(vocab_file: str, config: ST5Config) -> bytes:
  proto = vocab.model_proto(vocab_file)  # a tokenizer.json becomes a SentencePiece model here
  vocab.check_t5(spm.SentencePieceProcessor(model_proto=proto), where=vocab_file, vocab_size=config.t5.vocab_size)
  return proto


def _with_prompt(prompt: str, inputs):
  """The [batch] strings with `prompt` prepended (unchanged for an empty prompt)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top  (TensorFlow: see the note above `log`)

  return tf.strings.join([tf.constant(prompt), inputs]) if prompt else inputs


def prompt_signatures(config: ST5Config) -> dict[str, str]:
  """{signature key: prompt name} of the model's prompts (prompt_signature_key); a clash is an error."""
  keys = {}
  for name in config.prompt_dict:
    key = prompt_signature_key(name)
    if key in keys:
      raise ValueError(f"prompts {keys[key]!r} and {name!r} would both be SavedModel signature {key!r}; rename one")
    keys[key] = name
  return keys


def _jax_forward(config: ST5Config, names: Sequence[str], platforms: Sequence[str], side: str | None = None):
  """The tower (of `side`, asymmetric towers) as a TF-callable `(list of param tensors, tokens_BxL) -> emb_BxD`."""
  from jax.experimental import jax2tf  # pylint: disable=g-import-not-at-top  (TensorFlow: see the note above `log`)

  model = SentenceT5(config)
  # fp32 exports promise fp32 results everywhere (e.g. no TF32 matmuls on GPUs).
  precision = "highest" if config.t5.dtype == "float32" else "default"

  def forward(param_list, tokens_BxL):
    params = tree.unflatten(dict(zip(names, param_list)))
    with jax.default_matmul_precision(precision):
      return model.apply({"params": params}, tokens_BxL, side=side)

  return jax2tf.convert(forward, polymorphic_shapes=[None, "(b, l)"], with_gradient=False,
                        native_serialization_platforms=tuple(platforms))


def _build_module(*, config: ST5Config, flat: MutableMapping[str, np.ndarray], names: Sequence[str],
                  vocab_proto: bytes, staged: pathlib.Path, platforms: Sequence[str], consume: bool):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top  (TensorFlow: see the note above `log`)
  import tensorflow_text as tf_text  # pylint: disable=g-import-not-at-top  (TensorFlow: see the note above `log`)

  route = encode_options.route(config, None)  # None for a shared tower, else the default route's side
  forwards = {side: _jax_forward(config, names, platforms, side)
              for side in (encode_options.SIDES if config.asymmetric else (None,))}
  forward = forwards[route]
  dim = config.encode_dim  # truncate_dim when the config sets one
  truncated = config.truncate_dim is not None and config.truncate_dim < config.output_dim
  max_length = config.max_length
  default_prompt = config.prompt_dict.get(config.default_prompt_name, "") if config.default_prompt_name else ""
  # Powers of two, as training's in-loop evaluation pads: TF compiles the XlaCallModule for
  # a handful of lengths instead of every batch maximum.
  buckets = length_buckets(max_length)

  class SentenceT5Module(tf.Module):
    """Callable on a [batch] tf.string tensor; returns [embeddings [batch, D]]."""

    # TF Hub's Reusable SavedModel API reads these as saved attributes; tf.Module's
    # read-only properties of the same names would not be saved.
    variables = None
    trainable_variables = None
    regularization_losses = None

    def __init__(self):
      super().__init__(name="sentence_t5")
      variables = []
      for name in names:
        value = flat.pop(name) if consume else flat[name]
        # Named after the T5X parameter, so `[v.name for v in model.variables]` documents itself.
        variables.append(tf.Variable(np.asarray(value, np.float32), trainable=False, name=name))
        del value
      self.params = variables
      self.variables = list(variables)
      # Not trainable: the converted forward pass carries no gradient.
      self.trainable_variables = []
      self.regularization_losses = []
      self.vocab_file = tf.saved_model.Asset(str(staged / VOCAB_FILE))
      self.config_file = tf.saved_model.Asset(str(staged / CONFIG_FILE))
      self.export_file = tf.saved_model.Asset(str(staged / EXPORT_FILE))
      # tensorflow_text's SentencePiece op takes the model proto as an attribute, so the
      # proto is also part of the graph; the asset is the file for every other reader.
      self.tokenizer = tf_text.SentencepieceTokenizer(model=vocab_proto, out_type=tf.int32)

    @tf.function(autograph=False, input_signature=[tf.TensorSpec([None], tf.string, name=INPUT_KEY)])
    def tokenize(self, inputs):
      """int32 [batch, L]: pieces truncated to max_length - 1, EOS, zero padding to a bucket."""
      pieces = self.tokenizer.tokenize(inputs)[:, : max_length - 1]
      batch = tf.shape(inputs, out_type=tf.int64)[0]
      eos = tf.RaggedTensor.from_tensor(tf.fill(tf.stack([batch, 1]), tf.constant(vocab.EOS_ID, tf.int32)))
      tokens = tf.concat([pieces, eos], axis=1)
      longest = tf.reduce_max(tf.concat([tokens.row_lengths(), [1]], axis=0))  # 1 for an empty batch
      bucket_lengths = tf.constant(buckets, tf.int64)
      padded_len = tf.reduce_min(tf.where(bucket_lengths >= longest, bucket_lengths, max_length))
      return tokens.to_tensor(default_value=0, shape=tf.stack([batch, padded_len]))

    def _encode_tokens(self, tokens, side):
      emb = forwards[side](self.params, tokens)
      if truncated:  # the first truncate_dim dimensions, renormalised when the model normalises
        emb = emb[:, :dim]
        if config.normalize:
          emb = emb / tf.maximum(tf.norm(emb, axis=1, keepdims=True), 1e-12)
      return tf.ensure_shape(emb, [None, dim])

    def _embed(self, inputs, side):
      tokens = self.tokenize(inputs)
      # The converted function assumes batch >= 1 (shape polymorphism's default).
      emb = tf.cond(tf.shape(tokens)[0] > 0, lambda: self._encode_tokens(tokens, side),
                    lambda: tf.zeros([0, dim], tf.float32))
      return tf.ensure_shape(emb, [None, dim])

    @tf.function(autograph=False, input_signature=[tf.TensorSpec([None, None], tf.int32, name=TOKENS_KEY)])
    def encode_tokens(self, tokens):
      """float32 [batch, D] from tokens (pad 0, EOS-terminated, at least one row); D = truncate_dim if set."""
      return self._encode_tokens(tokens, route)

    @tf.function(autograph=False, input_signature=[tf.TensorSpec([None], tf.string, name=INPUT_KEY)])
    def embed(self, inputs):
      """float32 [batch, D] of the texts as given (no prompt prepended)."""
      return self._embed(inputs, route)

    def side_embed(self, side: str):
      """Asymmetric towers: float32 [batch, D] of `side`'s tower, texts as given."""

      @tf.function(autograph=False, input_signature=[tf.TensorSpec([None], tf.string, name=INPUT_KEY)])
      def embed_side(inputs):
        return self._embed(inputs, side)

      return embed_side

    def side_signature(self, side: str, prompt: str):
      """Asymmetric towers: a serving function of `side`'s tower that prepends `prompt`."""

      @tf.function(autograph=False, input_signature=[tf.TensorSpec([None], tf.string, name=INPUT_KEY)])
      def serve_side(inputs):
        return {OUTPUT_KEY: self._embed(_with_prompt(prompt, inputs), side)}

      return serve_side

    @tf.function(autograph=False, input_signature=[tf.TensorSpec([None], tf.string, name=INPUT_KEY)])
    def __call__(self, inputs):
      """[float32 [batch, D]]: the texts with the default prompt (if the model names one) prepended."""
      return [self.embed(_with_prompt(default_prompt, inputs))]

    @tf.function(autograph=False, input_signature=[tf.TensorSpec([None], tf.string, name=INPUT_KEY)])
    def serve(self, inputs):
      return {OUTPUT_KEY: self.__call__(inputs)[0]}

    def prompt_signature(self, prompt: str, side: str | None = None):
      """A serving function that prepends `prompt` to its inputs (on `side`'s tower, asymmetric towers)."""
      if side is not None:
        return self.side_signature(side, prompt)

      @tf.function(autograph=False, input_signature=[tf.TensorSpec([None], tf.string, name=INPUT_KEY)])
      def serve_prompt(inputs):
        return {OUTPUT_KEY: self.embed(_with_prompt(prompt, inputs))}

      return serve_prompt

    @tf.function(autograph=False, input_signature=[tf.TensorSpec([None], tf.string, name=INPUT_KEY)])
    def serve_tokenize(self, inputs):
      return {TOKENS_KEY: self.tokenize(inputs)}

    @tf.function(autograph=False, input_signature=[tf.TensorSpec([None, None], tf.int32, name=TOKENS_KEY)])
    def serve_encode_tokens(self, tokens):
      return {OUTPUT_KEY: self.encode_tokens(tokens)}

  module = SentenceT5Module()
  if config.asymmetric:  # saved attributes: model.embed_query / model.embed_document
    module.embed_query = module.side_embed("query")
    module.embed_document = module.side_embed("document")
  return module


def export(*, config: ST5Config, flat: MutableMapping[str, np.ndarray], vocab_file: str,
           out: str | os.PathLike, platforms: Sequence[str] = DEFAULT_PLATFORMS,
           metadata: Mapping[str, Any] | None = None, consume: bool = False) -> dict[str, Any]:
  """Writes the SavedModel to `out` (which must not exist); returns what it measured.

  `flat`: unscanned T5X-named arrays of `config`'s tower (extra names are an error).
  `consume=True` removes arrays from `flat` as their variables are made, so the host
  holds one copy of the weights (an 11B model is 44 GB in float32).
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top  (TensorFlow: see the note above `log`)

  out = pathlib.Path(out)
  if out.exists():
    raise FileExistsError(f"{out} exists; export writes a new directory")
  if config.t5.scan_layers:
    raise ValueError("export takes unscanned parameters: pass a config with scan_layers=False "
                     "(st5_jax.export.source.load_source does this)")
  expected = {k: tuple(v.shape) for k, v in tree.flatten(nn.unbox(abstract_params(config))).items()}
  names = sorted(expected)
  missing = [k for k in names if k not in flat]
  extra = sorted(k for k in flat if k not in expected)
  bad = [f"{k}: {np.shape(flat[k])} vs {expected[k]}" for k in names
         if k in flat and tuple(np.shape(flat[k])) != expected[k]]
  if missing or extra or bad:
    raise ValueError(f"Parameters do not fit the {config.pooling} tower: missing {missing}, "
                     f"unexpected {extra}, shapes {bad}")
  vocab_proto = _check_vocab(vocab_file, config)
  prompt_keys = prompt_signatures(config)
  side_keys = {f"encode_{side}": side for side in encode_options.SIDES} if config.asymmetric else {}
  clash = sorted(set(side_keys) & set(prompt_keys))
  if clash:
    raise ValueError(f"a prompt's signature {clash[0]!r} would replace the asymmetric towers' side signature; "
                     "rename the prompt")
  shapes = [list(expected[k]) for k in names]
  meta = {"format_version": FORMAT_VERSION, "param_names": names, "param_shapes": shapes,
          "output_dim": config.encode_dim, "max_length": config.max_length, "pooling": config.pooling,
          "platforms": list(platforms), "signatures": [*BUILTIN_SIGNATURES, *side_keys, *prompt_keys],
          "prompt_signatures": prompt_keys, **({"side_signatures": side_keys} if side_keys else {}),
          "default_prompt_name": config.default_prompt_name,
          "truncate_dim": config.truncate_dim,
          "input_key": INPUT_KEY, "output_key": OUTPUT_KEY, **dict(metadata or {})}
  start = time.perf_counter()
  # Written next to `out` and renamed at the end, so a crash never leaves a SavedModel
  # that looks complete.
  out.parent.mkdir(parents=True, exist_ok=True)
  tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
  staged = pathlib.Path(tempfile.mkdtemp(prefix="st5_export_assets_"))
  try:
    (staged / VOCAB_FILE).write_bytes(vocab_proto)
    (staged / CONFIG_FILE).write_text(config.to_json())
    (staged / EXPORT_FILE).write_text(json.dumps(meta, indent=1))
    module = _build_module(config=config, flat=flat, names=names, vocab_proto=vocab_proto, staged=staged,
                           platforms=platforms, consume=consume)
    signatures = {"serving_default": module.serve.get_concrete_function(),
                  "tokenize": module.serve_tokenize.get_concrete_function(),
                  "encode_tokens": module.serve_encode_tokens.get_concrete_function()}
    for key, side in side_keys.items():
      signatures[key] = module.side_signature(side, encode_options.side_prompt(config.prompt_dict, side)
                                              ).get_concrete_function()
    for key, name in prompt_keys.items():
      side = name if config.asymmetric and name in encode_options.SIDES else None
      signatures[key] = module.prompt_signature(config.prompt_dict[name], side).get_concrete_function()
    traced = time.perf_counter()
    tf.saved_model.save(module, str(tmp), signatures=signatures)
    del module
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; an export is meant to be shared.
    os.replace(tmp, out)
  finally:
    shutil.rmtree(staged, ignore_errors=True)
    if tmp.exists():
      shutil.rmtree(tmp, ignore_errors=True)
  end = time.perf_counter()
  size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
  stats = {"trace_seconds": round(traced - start, 2), "save_seconds": round(end - traced, 2),
           "export_seconds": round(end - start, 2), "bytes": size, "num_params": int(sum(np.prod(s) for s in shapes))}
  log.info("SavedModel %s: %.1f MB in %.1fs", out, size / 2**20, end - start)
  return stats


class SavedModelEncoder(encode_options.EncodeAliases):
  """`SentenceEncoder`'s interface over an exported SavedModel, run by TensorFlow.

  Only TensorFlow and tensorflow_text are used (no JAX); the batching mirrors
  `SentenceEncoder.encode` (sorted by length, in input order on return).
  """

  def __init__(self, path: str | os.PathLike, *, batch_size: int = 64):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top  (TensorFlow: see the note above `log`)
    import tensorflow_text  # noqa: F401  pylint: disable=g-import-not-at-top  (registers the SentencePiece ops)

    self.path = str(path)
    local = paths.local_dir(path)  # TensorFlow's loader reads local files (gs:// is copied once)
    self.config = read_config(local)
    self.metadata = read_metadata(local)
    self.source = f"savedmodel:{path}"
    self.report = None
    self.max_batch_size = batch_size
    self.vocab_file = str(_assets(local) / VOCAB_FILE)
    self._tf = tf
    self.model = tf.saved_model.load(local)

  @property
  def dim(self) -> int:
    """Size of the graph's output (truncate_dim when exported with one)."""
    return self.config.encode_dim

  def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
    """Token ids with EOS, as the graph computes them (padding removed)."""
    texts = list(texts)
    if not texts:
      return []
    tokens = self.model.tokenize(self._tf.constant(texts, self._tf.string)).numpy()
    return [row[row != 0].tolist() for row in tokens]

  def encode_tokens(self, tokens_BxL: np.ndarray) -> np.ndarray:
    return self.model.encode_tokens(self._tf.constant(tokens_BxL, self._tf.int32)).numpy()

  def _encode_list(self, texts: list[str], batch_size: int | None, show_progress: bool,
                   side: str | None = None) -> np.ndarray:
    """float32 [len(texts), dim] embeddings of the texts as given (no default prompt), in input order; `side`:
    that side's tower (asymmetric towers)."""
    # Exports before prompts (2026-12-05) have no `embed`; their __call__ adds no prompt either.
    embed = getattr(self.model, "embed", None) or (lambda batch: self.model(batch)[0])
    if side is not None:
      embed = getattr(self.model, f"embed_{side}")
    batch_size = batch_size or self.max_batch_size
    out_NxD = np.zeros((len(texts), self.dim), np.float32)
    # Characters approximate token counts well enough to keep padding low.
    order = np.argsort([-len(t) for t in texts], kind="stable")
    progress = None
    if show_progress:
      progress = tqdm(total=len(texts), desc="encode", unit="sent")
    for start in range(0, len(texts), batch_size):
      idx = order[start:start + batch_size]
      batch = self._tf.constant([texts[i] for i in idx], self._tf.string)
      out_NxD[idx] = embed(batch).numpy()
      if progress:
        progress.update(len(idx))
    if progress:
      progress.close()
    return out_NxD

