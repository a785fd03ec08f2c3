"""The T5 SentencePiece vocabulary: tokenising sentences the way T5X/seqio does.

pad=0, eos=1, unk=2; 32000 pieces padded to 32128 embeddings. Sentences are
tokenised, truncated to `max_length - 1` and given EOS (seqio's
`append_eos_after_trim`), so the EOS is never cut off.
"""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np
import sentencepiece as spm

from st5_jax import paths

PAD_ID = 0
EOS_ID = 1
UNK_ID = 2
DECODER_START_ID = 0
EXTRA_IDS = 100


@functools.lru_cache(maxsize=8)
def _processor(path: str) -> spm.SentencePieceProcessor:
  return spm.SentencePieceProcessor(model_proto=paths.read_bytes(path))  # local or gs://


class Tokenizer:
  """Batch tokeniser over a SentencePiece model file."""

  def __init__(self, path: str):
    self.path = path
    self.sp = _processor(path)
    if self.sp.pad_id() != PAD_ID or self.sp.eos_id() != EOS_ID:
      raise ValueError(f"{path} is not a T5 vocabulary: pad={self.sp.pad_id()} eos={self.sp.eos_id()}, "
                       f"expected pad={PAD_ID} eos={EOS_ID}.")

  @classmethod
  def from_config(cls, explicit=None, *, model_dir=None) -> "Tokenizer":
    return cls(paths.vocab_path(explicit, model_dir=model_dir))

  def encode(self, texts: Sequence[str], *, max_length: int) -> list[list[int]]:
    """Token ids with EOS, at most `max_length` ids each."""
    if max_length < 1:
      raise ValueError(f"max_length must be >= 1, got {max_length}")
    ids = self.sp.encode(list(texts), out_type=int)
    return [row[: max_length - 1] + [EOS_ID] for row in ids]

  def decode(self, ids: Sequence[int]) -> str:
    return self.sp.decode([int(i) for i in ids if i not in (PAD_ID, EOS_ID)])


def pad_batch(rows: Sequence[Sequence[int]], length: int) -> np.ndarray:
  """Right-pads token rows with PAD_ID into an int32 [len(rows), length] array."""
  out = np.zeros((len(rows), length), np.int32)
  for i, row in enumerate(rows):
    n = min(len(row), length)
    out[i, :n] = row[:n]
  return out
