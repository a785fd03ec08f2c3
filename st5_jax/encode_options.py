"""sentence-transformers' `encode` keywords for SentenceEncoder and SavedModelEncoder.

`SentenceTransformer.encode` users expect these to work unchanged:

    encode("one sentence")                  -> float32 [D] (a string gives one vector)
    encode(texts, batch_size=32)            -> float32 [N, D]
    prompt_name="query" / prompt="query: "  the model's named prompt / this text, prepended to every input
                                            before tokenisation (so it counts in max_length); without
                                            either, the model's default_prompt_name (if any)
    encode_query(texts) / encode_document   the model's "query" / "document" prompt, else no prompt (not
                                            the default one): what a SentenceTransformer (>= 5) loaded
                                            from the model's folder does, since it always holds "query"
                                            and "document" prompts, empty unless the model defines them
                                            (so its encode_document never reaches "passage" / "corpus")
    truncate_dim=d                          the first d dimensions, renormalised to unit L2 norm when the
                                            model normalises (sentence-transformers renormalises only with
                                            normalize_embeddings=True); default the model's truncate_dim
    precision="int8"                        codes of st5_jax.quantize ("float32", "int8", "uint8",
                                            "binary", "ubinary"); int8 / uint8 take `ranges` or
                                            `calibration_embeddings` (else the batch's own min and max)
    show_progress_bar=True                  alias of show_progress
    normalize_embeddings=True               L2-normalise again (a no-op for models whose
                                            config has normalize=True, the ST5 default);
                                            False returns what the model outputs
    convert_to_numpy=False                  a list of 1-D arrays (as ST's list)
    convert_to_tensor=True                  a torch.Tensor (needs torch), as ST returns
    task="query" / "document"               asymmetric towers (ST5Config.towers): that side's tower;
                                            encode_query / encode_document set it. Without a task an
                                            asymmetric model takes its default route, DEFAULT_ROUTE
                                            ("document", as Router.for_query_document); a shared tower
                                            ignores it

The order is sentence-transformers': prompt, encode, truncate, normalize_embeddings, quantize.
Other sentence-transformers keywords (device, output_value, ...) are refused with a TypeError
that names them, rather than silently ignored. No JAX here: the SavedModel encoder runs on
TensorFlow alone.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from st5_jax import quantize

log = logging.getLogger(__name__)

ST_KEYWORDS = ("batch_size", "prompt_name", "prompt", "truncate_dim", "precision", "show_progress_bar",
               "normalize_embeddings", "convert_to_numpy", "convert_to_tensor", "task")
SIDES = ("query", "document")  # the prompts (and towers) encode_query / encode_document use
# The side `encode` without a task uses on asymmetric towers: sentence-transformers' Router.for_query_document's.
DEFAULT_ROUTE = "document"


def route(config: Any, task: str | None) -> str | None:
  """The side an encode call uses: `task`, else DEFAULT_ROUTE on asymmetric towers; None for a shared tower."""
  if task is not None and task not in SIDES:
    raise ValueError(f"task must be one of {SIDES} (the towers' sides), got {task!r}")
  if not getattr(config, "asymmetric", False):
    return None
  return task if task is not None else DEFAULT_ROUTE


def resolve_prompt(prompts: Mapping[str, str], default_prompt_name: str | None, prompt: str | None,
                   prompt_name: str | None) -> str:
  """The text to prepend: `prompt`, else prompts[prompt_name], else the default prompt, else ""."""
  if prompt is not None:
    if not isinstance(prompt, str):
      raise TypeError(f"prompt must be a string, got {type(prompt).__name__}")
    if prompt_name is not None:
      log.warning("encode() got both prompt and prompt_name=%r; using prompt (as sentence-transformers does)",
                  prompt_name)
    return prompt
  if prompt_name is not None:
    if prompt_name not in prompts:
      known = ", ".join(repr(n) for n in prompts) or "none: pass prompt='...' or set st5_model.prompts"
      raise ValueError(f"prompt_name {prompt_name!r} is not one of the model's prompts ({known})")
    return prompts[prompt_name]
  if default_prompt_name is not None:
    return prompts[default_prompt_name]
  return ""


def side_prompt(prompts: Mapping[str, str], side: str) -> str:
  """The text `encode_query` (side "query") or `encode_document` (side "document") prepends when given none:
  the model's prompt of that name, else "" (see the module docstring)."""
  if side not in SIDES:
    raise ValueError(f"side must be one of {SIDES}, got {side!r}")
  return prompts.get(side, "")


def truncate_embeddings(emb_NxD: np.ndarray, truncate_dim: int | None, *, renormalise: bool) -> np.ndarray:
  """The first `truncate_dim` columns, each row rescaled to unit L2 norm when `renormalise`."""
  if truncate_dim is None or truncate_dim == emb_NxD.shape[-1]:
    return emb_NxD
  if not isinstance(truncate_dim, (int, np.integer)) or isinstance(truncate_dim, bool) or truncate_dim < 1:
    raise ValueError(f"truncate_dim must be a positive int, got {truncate_dim!r}")
  if truncate_dim > emb_NxD.shape[-1]:
    raise ValueError(f"truncate_dim {truncate_dim} is larger than the embedding size {emb_NxD.shape[-1]}")
  out_NxT = emb_NxD[..., :truncate_dim]
  if renormalise:
    norms_N = np.linalg.norm(out_NxT, axis=-1, keepdims=True)
    out_NxT = out_NxT / np.maximum(norms_N, 1e-12)
  return np.ascontiguousarray(out_NxT, np.float32)


def encode(encode_list: Callable[[list[str], int | None, bool], np.ndarray], texts: str | Sequence[str],
           batch_size: int | None, *, prompt: str = "", truncate_dim: int | None = None, renormalise: bool = True,
           precision: str = "float32", ranges: np.ndarray | None = None,
           calibration_embeddings: np.ndarray | None = None, show_progress: bool, show_progress_bar: bool | None,
           normalize_embeddings: bool, convert_to_numpy: bool, convert_to_tensor: bool,
           unknown: dict[str, Any]) -> Any:
  """Runs `encode_list(texts, batch_size, show_progress)` under the sentence-transformers keywords."""
  if unknown:
    raise TypeError(f"encode() got unsupported keyword(s) {sorted(unknown)}; the sentence-transformers keywords "
                    f"supported are {', '.join(ST_KEYWORDS)} (plus show_progress, ranges, calibration_embeddings).")
  quantize.check_precision(precision)
  single = isinstance(texts, str)
  if single:
    texts = [texts]
  texts = list(texts)
  bad = [type(t).__name__ for t in texts if not isinstance(t, str)]
  if bad:
    raise TypeError(f"encode() takes strings; got {bad[0]} among the inputs")
  if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
    raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
  progress = show_progress if show_progress_bar is None else bool(show_progress_bar)
  if prompt:
    texts = [prompt + t for t in texts]  # tokenised together: the prompt counts in max_length
  emb_NxD = encode_list(texts, batch_size, progress)
  emb_NxD = truncate_embeddings(emb_NxD, truncate_dim, renormalise=renormalise)
  if normalize_embeddings:
    norms_N = np.linalg.norm(emb_NxD, axis=1, keepdims=True)
    emb_NxD = (emb_NxD / np.maximum(norms_N, 1e-12)).astype(np.float32)
  if precision != "float32" and len(emb_NxD):
    emb_NxD = quantize.quantize_embeddings(emb_NxD, precision, ranges=ranges,
                                           calibration_embeddings=calibration_embeddings)
  if convert_to_tensor:
    try:
      import torch  # pylint: disable=g-import-not-at-top  (optional; seconds to import, only for tensors)
    except ImportError as e:
      raise ImportError("convert_to_tensor=True returns a torch.Tensor and needs torch installed; "
                        "use the default (a numpy array) otherwise.") from e
    out = torch.from_numpy(np.ascontiguousarray(emb_NxD))
    return out[0] if single else out
  if not convert_to_numpy:
    rows = list(emb_NxD)
    return rows[0] if single else rows
  return emb_NxD[0] if single else emb_NxD


class EncodeAliases:
  """`encode` with sentence-transformers' keywords, for encoders that define `config` and `_encode_list`.

  Shared by SentenceEncoder (JAX) and SavedModelEncoder (TensorFlow), so both backends
  take the same arguments. `_encode_list` returns the model's output before any truncation
  but the one a SavedModel applies in its graph.
  """

  @property
  def prompts(self) -> dict[str, str]:
    """The model's prompts by name (sentence-transformers' `prompts`); {} for a model without any."""
    return self.config.prompt_dict

  @property
  def default_prompt_name(self) -> str | None:
    return self.config.default_prompt_name

  @property
  def truncate_dim(self) -> int | None:
    return self.config.truncate_dim

  def encode(self, texts: str | Sequence[str], batch_size: int | None = None, *, prompt_name: str | None = None,
             prompt: str | None = None, truncate_dim: int | None = None, precision: str = "float32",
             ranges: np.ndarray | None = None, calibration_embeddings: np.ndarray | None = None,
             show_progress: bool = False, show_progress_bar: bool | None = None, normalize_embeddings: bool = False,
             convert_to_numpy: bool = True, convert_to_tensor: bool = False, task: str | None = None,
             **unknown) -> Any:
    """float32 [len(texts), dim] embeddings in input order ([dim] for one string); see the module docstring.

    Takes sentence-transformers' keywords: prompt_name, prompt, truncate_dim, precision,
    show_progress_bar, normalize_embeddings, convert_to_numpy, convert_to_tensor; and
    quantize_embeddings' ranges / calibration_embeddings for int8 / uint8.
    """
    text = resolve_prompt(self.prompts, self.default_prompt_name, prompt, prompt_name)
    side = route(self.config, task)
    encode_list = self._encode_list if side is None else \
        (lambda t, b, p: self._encode_list(t, b, p, side=side))  # noqa: E731
    return encode(encode_list, texts, batch_size, prompt=text,
                  truncate_dim=truncate_dim if truncate_dim is not None else self.config.truncate_dim,
                  renormalise=self.config.normalize, precision=precision, ranges=ranges,
                  calibration_embeddings=calibration_embeddings, show_progress=show_progress,
                  show_progress_bar=show_progress_bar, normalize_embeddings=normalize_embeddings,
                  convert_to_numpy=convert_to_numpy, convert_to_tensor=convert_to_tensor, unknown=unknown)

  __call__ = encode

  def encode_query(self, texts: str | Sequence[str], batch_size: int | None = None, *,
                   prompt_name: str | None = None, prompt: str | None = None, **kwargs) -> Any:
    """`encode` with the model's "query" prompt (or none) when neither prompt nor prompt_name is given, on the
    query side's tower (task="query")."""
    if prompt_name is None and prompt is None:
      prompt = side_prompt(self.prompts, "query")
    kwargs.setdefault("task", "query")
    return self.encode(texts, batch_size, prompt_name=prompt_name, prompt=prompt, **kwargs)

  def encode_document(self, texts: str | Sequence[str], batch_size: int | None = None, *,
                      prompt_name: str | None = None, prompt: str | None = None, **kwargs) -> Any:
    """`encode` with the model's "document" prompt (or none) when neither prompt nor prompt_name is given, on the
    document side's tower (task="document")."""
    if prompt_name is None and prompt is None:
      prompt = side_prompt(self.prompts, "document")
    kwargs.setdefault("task", "document")
    return self.encode(texts, batch_size, prompt_name=prompt_name, prompt=prompt, **kwargs)
