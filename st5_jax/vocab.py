"""The T5 SentencePiece vocabulary: tokenising sentences the way T5X/seqio does.

pad=0, eos=1, unk=2; 32000 pieces padded to 32128 embeddings. Sentences are
tokenised, truncated to `max_length - 1` and given EOS (seqio's
`append_eos_after_trim`), so the EOS is never cut off.

The vocabulary is a SentencePiece `spiece.model`, or a Hugging Face `tokenizer.json`
holding a Unigram model (what transformers 5 and `SentenceTransformer.save` write, with
no spiece.model): `model_proto` rebuilds the SentencePiece ModelProto from its pieces,
scores and precompiled normalisation map, so tokenisation (and the SavedModel's
in-graph tokenizer) is the same as with the original spiece.model.
"""

from __future__ import annotations

import base64
import functools
import json
from typing import Any, Sequence

import numpy as np
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as pb

from st5_jax import paths

PAD_ID = 0
EOS_ID = 1
UNK_ID = 2
DECODER_START_ID = 0
EXTRA_IDS = 100


TOKENIZER_JSON = "tokenizer.json"


def is_tokenizer_json(path: paths.PathLike) -> bool:
  return str(path).endswith(".json")


def _normalizer_parts(normalizer: dict[str, Any] | None, where: str) -> tuple[bytes, bool]:
  """(precompiled charsmap, remove_extra_whitespaces) of a tokenizer.json normalizer."""
  if normalizer is None:
    return b"", False
  steps = normalizer["normalizers"] if normalizer.get("type") == "Sequence" else [normalizer]
  charsmap, collapse = b"", False
  for step in steps:
    kind = step.get("type")
    if kind == "Precompiled":
      charsmap = base64.b64decode(step.get("precompiled_charsmap") or "")
    elif kind == "Replace" and step.get("pattern", {}).get("Regex") == " {2,}" and step.get("content") == " ":
      collapse = True  # transformers' spelling of SentencePiece's remove_extra_whitespaces
    elif kind == "Strip":
      continue  # SentencePiece strips as part of remove_extra_whitespaces
    else:
      raise ValueError(f"{where}: normalizer step {kind!r} has no SentencePiece equivalent; pass the "
                       "model's spiece.model as vocab= instead.")
  return charsmap, collapse


def _pre_tokenizer_parts(pre: dict[str, Any] | None, where: str) -> tuple[bool, bool]:
  """(add_dummy_prefix, remove_extra_whitespaces) of a tokenizer.json pre-tokenizer."""
  steps = [] if pre is None else pre["pretokenizers"] if pre.get("type") == "Sequence" else [pre]
  dummy, collapse, metaspace = False, False, False
  for step in steps:
    kind = step.get("type")
    if kind == "WhitespaceSplit":
      collapse = True  # splitting on runs of whitespace drops extra and edge spaces
    elif kind == "Metaspace":
      metaspace = True
      if step.get("replacement", "\u2581") != "\u2581":
        raise ValueError(f"{where}: Metaspace replacement {step.get('replacement')!r} is not SentencePiece's")
      dummy = step.get("prepend_scheme", "always" if step.get("add_prefix_space", True) else "never") != "never"
    else:
      raise ValueError(f"{where}: pre-tokenizer {kind!r} has no SentencePiece equivalent; pass the model's "
                       "spiece.model as vocab= instead.")
  if not metaspace:
    raise ValueError(f"{where}: no Metaspace pre-tokenizer, so this is not a SentencePiece tokenizer")
  return dummy, collapse


def model_proto_from_tokenizer_json(data: dict[str, Any] | str | bytes, *, where: str = TOKENIZER_JSON) -> bytes:
  """A serialised SentencePiece ModelProto equivalent to a Unigram tokenizer.json.

  Pieces and scores come from `model.vocab` in id order; `<pad>`, `</s>` are CONTROL
  pieces and the model's unk_id UNKNOWN, as in T5's spiece.model; transformers'
  `<extra_id_N>` tokens appended after the SentencePiece pieces are left out (T5X adds
  them on top of the vocabulary too). Normalisation: the precompiled charsmap, the
  dummy prefix and whitespace collapsing of the Metaspace / WhitespaceSplit steps.
  """
  if not isinstance(data, dict):
    data = json.loads(data)
  model = data.get("model") or {}
  if model.get("type") != "Unigram":
    raise ValueError(f"{where}: a {model.get('type')!r} tokenizer model; only Unigram (SentencePiece, as T5's) "
                     "can be used. Pass the model's spiece.model as vocab= instead.")
  vocab = [(str(p), float(s)) for p, s in model["vocab"]]
  n = len(vocab)
  while n and vocab[n - 1][0].startswith("<extra_id_") and vocab[n - 1][0].endswith(">"):
    n -= 1
  vocab = vocab[:n]
  unk_id = model.get("unk_id")
  special = {t["content"]: t["id"] for t in data.get("added_tokens", []) if t.get("special")}
  pad_id, eos_id = special.get("<pad>", -1), special.get("</s>", -1)
  if unk_id is None or not 0 <= unk_id < n:
    raise ValueError(f"{where}: Unigram model without a valid unk_id ({unk_id})")
  charsmap, collapse_n = _normalizer_parts(data.get("normalizer"), where)
  dummy, collapse_p = _pre_tokenizer_parts(data.get("pre_tokenizer"), where)

  proto = pb.ModelProto()
  for i, (piece, score) in enumerate(vocab):
    sp = proto.pieces.add()
    sp.piece, sp.score = piece, score
    if i == unk_id:
      sp.type = pb.ModelProto.SentencePiece.UNKNOWN
    elif i in (pad_id, eos_id) or (piece in special and special[piece] == i):
      sp.type = pb.ModelProto.SentencePiece.CONTROL
    else:
      sp.type = pb.ModelProto.SentencePiece.NORMAL
  ts = proto.trainer_spec
  ts.model_type = pb.TrainerSpec.UNIGRAM
  ts.vocab_size = n
  ts.unk_id, ts.pad_id, ts.eos_id, ts.bos_id = unk_id, pad_id, eos_id, special.get("<s>", -1)
  ts.unk_piece = vocab[unk_id][0]
  if pad_id >= 0:
    ts.pad_piece = vocab[pad_id][0]
  if eos_id >= 0:
    ts.eos_piece = vocab[eos_id][0]
  ts.byte_fallback = bool(model.get("byte_fallback", False))
  ns = proto.normalizer_spec
  ns.name = "nmt_nfkc" if charsmap else "identity"
  ns.precompiled_charsmap = charsmap
  ns.add_dummy_prefix = dummy
  ns.remove_extra_whitespaces = collapse_n or collapse_p
  ns.escape_whitespaces = True
  return proto.SerializeToString()


def model_proto(path: paths.PathLike) -> bytes:
  """The serialised SentencePiece model of a vocabulary file (spiece.model or tokenizer.json)."""
  raw = paths.read_bytes(path)  # local or gs://
  if is_tokenizer_json(path):
    return model_proto_from_tokenizer_json(raw, where=str(path))
  # Parsed before anything copies it into an export: a model folder's spiece.model that is
  # something else (e.g. a symlink to a file outside the folder) is refused, never shipped.
  try:
    spm.SentencePieceProcessor(model_proto=raw)
  except Exception as e:  # noqa: BLE001  (sentencepiece raises RuntimeError/OSError on garbage)
    raise ValueError(f"{path} is not a SentencePiece model ({type(e).__name__}: {str(e)[:200]}); "
                     "pass the model's spiece.model with vocab=PATH") from e
  return raw


def check_t5(sp: spm.SentencePieceProcessor, *, where: str, vocab_size: int | None = None) -> None:
  """Refuses a SentencePiece model that is not T5's (pad 0, EOS 1) or has ids past `vocab_size`."""
  if sp.pad_id() != PAD_ID or sp.eos_id() != EOS_ID:
    raise ValueError(f"{where} is not a T5 vocabulary: pad={sp.pad_id()} eos={sp.eos_id()}, "
                     f"expected pad={PAD_ID} eos={EOS_ID}.")
  if vocab_size is not None and sp.get_piece_size() > vocab_size:
    raise ValueError(f"{where} has {sp.get_piece_size()} pieces but the model embeds only {vocab_size} ids")


@functools.lru_cache(maxsize=8)
def _processor(path: str) -> spm.SentencePieceProcessor:
  return spm.SentencePieceProcessor(model_proto=model_proto(path))


class Tokenizer:
  """Batch tokeniser over a SentencePiece model file."""

  def __init__(self, path: str):
    self.path = path
    self.sp = _processor(path)
    check_t5(self.sp, where=path)

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
