"""sentence-transformers' `encode` keywords for SentenceEncoder and SavedModelEncoder.

`SentenceTransformer.encode` users expect these to work unchanged:

    encode("one sentence")                  -> float32 [D] (a string gives one vector)
    encode(texts, batch_size=32)            -> float32 [N, D]
    show_progress_bar=True                  alias of show_progress
    normalize_embeddings=True               L2-normalise again (a no-op for models whose
                                            config has normalize=True, the ST5 default);
                                            False returns what the model outputs
    convert_to_numpy=False                  a list of 1-D float32 arrays (as ST's list)
    convert_to_tensor=True                  a torch.Tensor (needs torch), as ST returns

Other sentence-transformers keywords (prompt, precision, device, ...) are refused with a
TypeError that names them, rather than silently ignored. No JAX here: the SavedModel
encoder runs on TensorFlow alone.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

ST_KEYWORDS = ("batch_size", "show_progress_bar", "normalize_embeddings", "convert_to_numpy", "convert_to_tensor")


def encode(encode_list: Callable[[list[str], int | None, bool], np.ndarray], texts: str | Sequence[str],
           batch_size: int | None, *, show_progress: bool, show_progress_bar: bool | None,
           normalize_embeddings: bool, convert_to_numpy: bool, convert_to_tensor: bool,
           unknown: dict[str, Any]) -> Any:
  """Runs `encode_list(texts, batch_size, show_progress)` under the sentence-transformers keywords."""
  if unknown:
    raise TypeError(f"encode() got unsupported keyword(s) {sorted(unknown)}; the sentence-transformers keywords "
                    f"supported are {', '.join(ST_KEYWORDS)} (plus show_progress).")
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
  emb_NxD = encode_list(texts, batch_size, progress)
  if normalize_embeddings:
    norms_N = np.linalg.norm(emb_NxD, axis=1, keepdims=True)
    emb_NxD = (emb_NxD / np.maximum(norms_N, 1e-12)).astype(np.float32)
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
  """`encode` with sentence-transformers' keywords, for encoders that define `_encode_list`.

  Shared by SentenceEncoder (JAX) and SavedModelEncoder (TensorFlow), so both backends
  take the same arguments.
  """

  def encode(self, texts: str | Sequence[str], batch_size: int | None = None, *, show_progress: bool = False,
             show_progress_bar: bool | None = None, normalize_embeddings: bool = False,
             convert_to_numpy: bool = True, convert_to_tensor: bool = False, **unknown) -> Any:
    """float32 [len(texts), dim] embeddings in input order ([dim] for one string).

    Takes sentence-transformers' keywords as aliases: show_progress_bar,
    normalize_embeddings, convert_to_numpy, convert_to_tensor.
    """
    return encode(self._encode_list, texts, batch_size, show_progress=show_progress,
                  show_progress_bar=show_progress_bar, normalize_embeddings=normalize_embeddings,
                  convert_to_numpy=convert_to_numpy, convert_to_tensor=convert_to_tensor, unknown=unknown)

  __call__ = encode
