"""Quantized embeddings, in NumPy: sentence-transformers' `quantize_embeddings`, and exact search over them.

    codes_NxD = quantize_embeddings(emb_NxD, "int8", calibration_embeddings=calib_MxD)  # int8 [N, D]
    codes_NxB = quantize_embeddings(emb_NxD, "binary")                                  # int8 [N, ceil(D / 8)]
    scores_QxK, indices_QxK = search(queries_QxD, codes_NxB, 10, precision="binary", dim=D, rescore_multiplier=4)

Precisions (the same codes, bit for bit, as `sentence_transformers.quantization.quantize_embeddings`):

  float32   the embeddings as float32.
  int8      per dimension, [min, max] cut into 255 equal steps: floor((x - min) / step) clipped to [0, 255],
            minus 128. The ranges ([2, D]: min, max) are `ranges` when given, else the per-dimension min and
            max of `calibration_embeddings`, else of the embeddings themselves (fragile: the codes of one
            text depend on the others; sentence-transformers refuses it for one embedding, and so does this).
  uint8     the same without the -128.
  binary    one bit a dimension (x > 0), packed 8 to a byte (np.packbits, big-endian within the byte, the
            last byte zero-padded), stored as int8 byte - 128.
  ubinary   the same bytes as uint8, without the offset.

Search (`search`), exact over the whole corpus, ties to the lower corpus index: the queries are quantized
like the corpus (same ranges) and scored by Hamming distance for binary / ubinary (the number of differing
bits; a score is minus the distance) or by the integer dot product of the codes for int8 / uint8. With
`rescore_multiplier` m >= 1 the top k * m candidates are scored again with the float32 queries against the
candidates' bits (0 / 1) or dequantized values (min + code * step) and the top k of those kept, as
sentence-transformers' `semantic_search_faiss` / `semantic_search_usearch` rescore; m = 0 keeps the
quantized scores.
"""

from __future__ import annotations

from typing import Any

import numpy as np

PRECISIONS = ("float32", "int8", "uint8", "binary", "ubinary")
SCALAR = ("int8", "uint8")
BINARY = ("binary", "ubinary")
DEFAULT_RESCORE_MULTIPLIER = 4
_INDEX_BITS = 32  # search's sort key: (-score) * 2^32 + corpus index (N < 2^31)


def check_precision(precision: str) -> str:
  if precision not in PRECISIONS:
    raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
  return precision


def code_dtype(precision: str) -> np.dtype:
  """The dtype of `precision`'s codes."""
  check_precision(precision)
  return np.dtype({"float32": np.float32, "int8": np.int8, "uint8": np.uint8, "binary": np.int8,
                   "ubinary": np.uint8}[precision])


def code_width(precision: str, dim: int) -> int:
  """Columns of the codes of `dim`-dimensional embeddings: dim, or ceil(dim / 8) bytes for the binary ones."""
  return -(-dim // 8) if check_precision(precision) in BINARY else dim


def quantization_ranges(calibration_MxD: np.ndarray) -> np.ndarray:
  """[2, D]: per-dimension min and max of the calibration embeddings."""
  calibration_MxD = np.asarray(calibration_MxD)
  if calibration_MxD.ndim != 2 or len(calibration_MxD) < 1:
    raise ValueError(f"calibration embeddings must be a [M, D] array with M >= 1, got shape {calibration_MxD.shape}")
  return np.vstack((np.min(calibration_MxD, axis=0), np.max(calibration_MxD, axis=0)))


def _steps(ranges_2xD: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(starts, steps) float32 [D] of int8 / uint8 ranges; a constant dimension gets step 1."""
  ranges_2xD = np.asarray(ranges_2xD).astype(np.float32, copy=False)
  starts_D = ranges_2xD[0, :]
  steps_D = (ranges_2xD[1, :] - starts_D) / 255
  return starts_D, np.where(steps_D == 0, 1, steps_D)


def resolve_ranges(emb_NxD: np.ndarray, precision: str, ranges: np.ndarray | None = None,
                   calibration_embeddings: np.ndarray | None = None) -> np.ndarray | None:
  """The [2, D] ranges int8 / uint8 codes use (None for the other precisions); see the module docstring."""
  if check_precision(precision) not in SCALAR:
    return None
  dim = emb_NxD.shape[-1]
  if ranges is not None:
    ranges = np.asarray(ranges)
    if ranges.shape != (2, dim):
      raise ValueError(f"ranges must have shape (2, {dim}) (min and max of each dimension), got {ranges.shape}")
    return ranges
  if calibration_embeddings is not None:
    calibration_embeddings = np.asarray(calibration_embeddings)
    if calibration_embeddings.ndim != 2 or calibration_embeddings.shape[1] != dim:
      raise ValueError(f"calibration embeddings must have shape (M, {dim}), got {calibration_embeddings.shape}")
    return quantization_ranges(calibration_embeddings)
  if emb_NxD.ndim == 1 or emb_NxD.shape[0] == 1:
    raise ValueError(f"{precision} codes of one embedding need `ranges` or `calibration_embeddings` (the "
                     "per-dimension min and max of a representative set): one embedding has no range")
  return quantization_ranges(emb_NxD)


def quantize_embeddings(emb_NxD: np.ndarray, precision: str, *, ranges: np.ndarray | None = None,
                        calibration_embeddings: np.ndarray | None = None) -> np.ndarray:
  """`emb_NxD` (float, [N, D] or [D]) as `precision` codes; equal to sentence-transformers' quantize_embeddings."""
  check_precision(precision)
  emb_NxD = np.asarray(emb_NxD)
  if emb_NxD.dtype.kind not in "f":
    raise TypeError(f"embeddings to quantize must be float, got {emb_NxD.dtype}")
  if precision == "float32":
    return emb_NxD.astype(np.float32)
  if emb_NxD.ndim == 2 and emb_NxD.shape[0] == 0:
    return np.zeros((0, code_width(precision, emb_NxD.shape[1])), code_dtype(precision))
  if precision in SCALAR:
    starts_D, steps_D = _steps(resolve_ranges(emb_NxD, precision, ranges, calibration_embeddings))
    codes_NxD = np.clip(np.floor((emb_NxD - starts_D) / steps_D), 0, 255)
    return (codes_NxD - 128).astype(np.int8) if precision == "int8" else codes_NxD.astype(np.uint8)
  packed_NxB = np.packbits(emb_NxD > 0, axis=-1)
  return (packed_NxB.astype(np.int16) - 128).astype(np.int8) if precision == "binary" else packed_NxB


def packed_bits(codes_NxB: np.ndarray, precision: str) -> np.ndarray:
  """uint8 [N, B]: the packed sign bits of binary / ubinary codes (binary's -128 undone)."""
  codes_NxB = np.asarray(codes_NxB)
  return codes_NxB.view(np.uint8) ^ np.uint8(0x80) if precision == "binary" else codes_NxB.view(np.uint8)


def unpack(codes_NxB: np.ndarray, precision: str, dim: int) -> np.ndarray:
  """uint8 [N, dim] of 0 / 1: the bits of binary / ubinary codes, the byte padding dropped."""
  return np.unpackbits(packed_bits(codes_NxB, precision), axis=-1, count=dim)


def dequantize(codes_NxD: np.ndarray, precision: str, ranges_2xD: np.ndarray) -> np.ndarray:
  """float64 [N, D]: int8 / uint8 codes back on the embeddings' scale (min + code * step)."""
  if precision not in SCALAR:
    raise ValueError(f"dequantize takes int8 or uint8 codes, not {precision!r}")
  starts_D, steps_D = _steps(ranges_2xD)
  codes_NxD = np.asarray(codes_NxD).astype(np.float64)
  if precision == "int8":
    codes_NxD += 128
  return codes_NxD * steps_D + starts_D


def hamming(query_codes_QxB: np.ndarray, codes_NxB: np.ndarray, precision: str, dim: int) -> np.ndarray:
  """int64 [Q, N]: the number of bits in which each query's code differs from each document's.

  Computed from the unpacked bits as |q| + |d| - 2 q.d (one float32 matmul, exact below 2^24 bits).
  """
  q_QxD = unpack(query_codes_QxB, precision, dim).astype(np.float32)
  d_NxD = unpack(codes_NxB, precision, dim).astype(np.float32)
  both_QxN = q_QxD @ d_NxD.T
  return (q_QxD.sum(1)[:, None] + d_NxD.sum(1)[None, :] - 2 * both_QxN).astype(np.int64)


def code_scores(query_codes_QxC: np.ndarray, codes_NxC: np.ndarray, precision: str, dim: int) -> np.ndarray:
  """int64 [Q, N], higher is better: minus the Hamming distance (binary / ubinary) or the codes' dot product."""
  if precision in BINARY:
    return -hamming(query_codes_QxC, codes_NxC, precision, dim)
  if precision in SCALAR:
    # float64 products of integers below 2^53 are exact (float32 is not past 2^24: 255 * 255 * 768 > 2^24).
    return (np.asarray(query_codes_QxC, np.float64) @ np.asarray(codes_NxC, np.float64).T).astype(np.int64)
  raise ValueError(f"code_scores takes int8, uint8, binary or ubinary codes, not {precision!r}")


def _top_keys(keys_QxN: np.ndarray, k: int) -> np.ndarray:
  """The k smallest keys of each row, ascending (keys are unique within a row)."""
  k = min(k, keys_QxN.shape[1])
  if k < keys_QxN.shape[1]:
    keys_QxN = np.take_along_axis(keys_QxN, np.argpartition(keys_QxN, k - 1, axis=1)[:, :k], axis=1)
  return np.sort(keys_QxN, axis=1)


def candidates(query_codes_QxC: np.ndarray, codes_NxC: Any, k: int, precision: str, dim: int, *,
               block_size: int = 16384) -> tuple[np.ndarray, np.ndarray]:
  """(int64 scores [Q, K], int64 indices [Q, K]), K = min(k, N): the top k by `code_scores`, ties to the lower
  index, the corpus codes read `block_size` rows at a time (a memory-mapped file is never read whole)."""
  n = len(codes_NxC)
  q = len(query_codes_QxC)
  running_QxK = np.zeros((q, 0), np.int64)
  for start in range(0, n, block_size):
    block = np.asarray(codes_NxC[start:start + block_size])
    scores_QxN = code_scores(query_codes_QxC, block, precision, dim)
    index_N = np.arange(start, start + len(block), dtype=np.int64)
    keys_QxN = -scores_QxN * (1 << _INDEX_BITS) + index_N[None, :]
    running_QxK = _top_keys(np.concatenate([running_QxK, keys_QxN], axis=1), k)
  indices_QxK = running_QxK % (1 << _INDEX_BITS)
  return -(running_QxK // (1 << _INDEX_BITS)), indices_QxK


def rescore(queries_QxD: np.ndarray, codes_NxC: Any, indices_QxM: np.ndarray, precision: str, dim: int,
            ranges: np.ndarray | None, *, max_bytes: int = 1 << 26) -> np.ndarray:
  """float64 [Q, M]: the float queries against their candidates' bits (0 / 1) or dequantized values, as
  sentence-transformers' rescoring (float64: its einsum of float32 queries and integer candidates). The
  candidates' values are made for a few queries at a time (at most `max_bytes`)."""
  unique_U, inverse = np.unique(indices_QxM, return_inverse=True)  # each candidate row read once, in order
  rows_UxC = np.asarray(codes_NxC[unique_U])
  inverse_QxM = inverse.reshape(indices_QxM.shape)
  step = max(1, max_bytes // (8 * indices_QxM.shape[1] * dim))
  out_QxM = np.zeros(indices_QxM.shape, np.float64)
  for start in range(0, len(queries_QxD), step):
    cand_BxMxC = rows_UxC[inverse_QxM[start:start + step]]
    if precision in BINARY:
      values_BxMxD = unpack(cand_BxMxC, precision, dim).astype(np.float64)
    else:
      values_BxMxD = dequantize(cand_BxMxC, precision, ranges)
    # A sum over each row alone (not einsum's blocked products): equal candidates get bit-equal scores, so their
    # tie goes to the lower index.
    q_Bx1xD = queries_QxD[start:start + step].astype(np.float64)[:, None, :]
    out_QxM[start:start + step] = (values_BxMxD * q_Bx1xD).sum(axis=-1)
  return out_QxM


def search(queries_QxD: np.ndarray, codes_NxC: Any, k: int, *, precision: str, dim: int | None = None,
           ranges: np.ndarray | None = None, rescore_multiplier: int = DEFAULT_RESCORE_MULTIPLIER,
           block_size: int = 16384, query_block_size: int = 1024) -> tuple[np.ndarray, np.ndarray]:
  """(float32 scores [Q, K], int64 indices [Q, K]), K = min(k, N): exact search of float queries over `precision`
  codes of a corpus (see the module docstring). `ranges`: the [2, D] the int8 / uint8 corpus was quantized
  with (required for them). `dim`: the embeddings' D (default: from the queries). The first pass scores
  `query_block_size` queries against `block_size` documents at a time."""
  if precision not in SCALAR + BINARY:
    raise ValueError(f"search over quantized codes takes one of {', '.join(SCALAR + BINARY)}, got {precision!r}")
  if k < 1:
    raise ValueError(f"k must be >= 1, got {k}")
  if not isinstance(rescore_multiplier, int) or rescore_multiplier < 0:
    raise ValueError(f"rescore_multiplier must be an int >= 0 (0: no rescoring), got {rescore_multiplier!r}")
  queries_QxD = np.asarray(queries_QxD, np.float32)
  dim = queries_QxD.shape[1] if dim is None else dim
  if queries_QxD.ndim != 2 or queries_QxD.shape[1] != dim:
    raise ValueError(f"queries have shape {queries_QxD.shape}; the corpus codes are of {dim}-dimensional embeddings")
  width = code_width(precision, dim)
  if codes_NxC.ndim != 2 or codes_NxC.shape[1] != width or codes_NxC.dtype != code_dtype(precision):
    raise ValueError(f"{precision} codes of {dim}-dimensional embeddings are {code_dtype(precision)} "
                     f"[N, {width}]; got {codes_NxC.dtype} {codes_NxC.shape}")
  if precision in SCALAR and ranges is None:
    raise ValueError(f"{precision} search needs the ranges the corpus was quantized with")
  n = len(codes_NxC)
  k = min(k, n)
  if k == 0 or len(queries_QxD) == 0:
    return np.zeros((len(queries_QxD), k), np.float32), np.zeros((len(queries_QxD), k), np.int64)
  query_codes = quantize_embeddings(queries_QxD, precision, ranges=ranges)
  first = k * rescore_multiplier if rescore_multiplier else k
  parts = [candidates(query_codes[start:start + query_block_size], codes_NxC, first, precision, dim,
                      block_size=block_size) for start in range(0, len(query_codes), query_block_size)]
  scores_QxM, indices_QxM = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
  if not rescore_multiplier:
    return scores_QxM.astype(np.float32), indices_QxM
  rescored_QxM = rescore(queries_QxD, codes_NxC, indices_QxM, precision, dim, ranges)
  order_QxM = np.lexsort((indices_QxM, -rescored_QxM), axis=-1)[:, :k]  # higher score first, then lower index
  return (np.take_along_axis(rescored_QxM, order_QxM, axis=1).astype(np.float32),
          np.take_along_axis(indices_QxM, order_QxM, axis=1))
