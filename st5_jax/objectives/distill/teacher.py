"""Teachers for distillation: any model `SentenceEncoder.load` reads, or any sentence-transformers folder.

    teacher = load_teacher("path/to/model")          # backend "auto"
    vecs_NxE = teacher.encode(["A sentence.", ...])   # float32, what the model's own encode returns
    teacher.describe()                                # backend, path, dim, fingerprint of its weights

Backends: "st5" is st5_jax.encoder.SentenceEncoder (work dirs, exported folders, Hugging Face T5,
sentence-transformers folders of a T5 tower, T5X, SavedModels); "sentence-transformers" is
sentence_transformers.SentenceTransformer(path), imported only here and only when used (BERT,
MPNet, MiniLM, ... folders on disk). "auto" takes "st5" unless the path is a sentence-transformers
folder that SentenceEncoder cannot express as a Sentence-T5 tower (the reader says why; logged).

The fingerprint (sha256 of the parameters, or of a SavedModel's files, with the settings the vectors
depend on) is what the teacher cache checks before it resumes: another teacher is another cache.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import Any, Protocol, Sequence

import numpy as np

from st5_jax import paths

log = logging.getLogger(__name__)

BACKENDS = ("auto", "st5", "sentence-transformers")


class Teacher(Protocol):
  """What the teacher cache needs of a teacher."""

  dim: int

  def encode(self, texts: Sequence[str]) -> np.ndarray:
    """float32 [len(texts), dim]."""

  def describe(self) -> dict[str, Any]:
    """JSON: backend, path, dim, fingerprint and the settings the vectors depend on."""


def _sha256(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


def _folder_sha256(path: str) -> str:
  """sha256 over a folder's files (names and bytes, names sorted)."""
  h = hashlib.sha256()
  for rel, p in sorted(paths.walk_files(path), key=lambda item: item[0]):
    h.update(f"{rel}\n".encode())
    h.update(_sha256(p.read_bytes()).encode())
  return h.hexdigest()


class St5Teacher:
  """A model st5_jax.encoder.SentenceEncoder loads (any format it reads)."""

  backend = "st5"

  def __init__(self, path: str, *, batch_size: int = 64, max_length: int | None = None, checkpoint: str = "auto"):
    from st5_jax.encoder import SentenceEncoder  # pylint: disable=g-import-not-at-top

    self.path = os.fspath(paths.path(path))
    self.batch_size = batch_size
    self.encoder = SentenceEncoder.load(self.path, max_length=max_length, batch_size=batch_size,
                                        checkpoint=checkpoint)
    _refuse_asymmetric(self.path, getattr(getattr(self.encoder, "config", None), "asymmetric", False))
    self.dim = int(self.encoder.dim)

  def encode(self, texts: Sequence[str]) -> np.ndarray:
    return np.asarray(self.encoder.encode(list(texts), batch_size=self.batch_size), np.float32)

  def describe(self) -> dict[str, Any]:
    params = getattr(self.encoder, "params", None)
    if params is None:  # a SavedModel: its files are the model
      fingerprint = _folder_sha256(self.encoder.source.partition(":")[2] or self.path)
      config = {}
    else:
      import jax  # pylint: disable=g-import-not-at-top

      from st5_jax.retrieval.index import params_sha256  # pylint: disable=g-import-not-at-top
      config = self.encoder.config.to_dict()
      vocab = _sha256(paths.read_bytes(self.encoder.tokenizer.path))
      fingerprint = _sha256(f"{params_sha256(jax.device_get(params))}\n{json.dumps(config, sort_keys=True)}\n"
                            f"{vocab}".encode())
    return {"backend": self.backend, "path": self.path, "source": self.encoder.source, "dim": self.dim,
            "fingerprint": fingerprint, "config": config}


def _refuse_asymmetric(path: str, asymmetric: bool) -> None:
  # The cache holds one vector per distinct text, whichever feature it came from: one tower encodes them all.
  if asymmetric:
    raise ValueError(f"teacher {path} has separate query and document towers (asymmetric / a Router); the teacher "
                     "cache encodes every text with one encoder: use a teacher with one tower")


class SentenceTransformersTeacher:
  """A sentence-transformers model folder, run by sentence_transformers.SentenceTransformer."""

  backend = "sentence-transformers"

  def __init__(self, path: str, *, batch_size: int = 64, max_length: int | None = None, device: str | None = None):
    try:
      from sentence_transformers import SentenceTransformer  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise ImportError("a sentence-transformers teacher needs the package: pip install sentence-transformers") from e
    self.path = os.fspath(paths.path(path))
    self.batch_size = batch_size
    self.model = SentenceTransformer(paths.local_dir(self.path), device=device)
    _refuse_asymmetric(self.path, any(type(m).__name__ in ("Router", "Asym") for m in self.model))
    if max_length is not None:
      self.model.max_seq_length = max_length
    # sentence-transformers 6 renamed get_sentence_embedding_dimension (still there, deprecated).
    dimension = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
    self.dim = int(dimension())

  def encode(self, texts: Sequence[str]) -> np.ndarray:
    out = self.model.encode(list(texts), batch_size=self.batch_size, convert_to_numpy=True, show_progress_bar=False)
    return np.asarray(out, np.float32).reshape(len(texts), self.dim)

  def describe(self) -> dict[str, Any]:
    h = hashlib.sha256()
    for name, tensor in sorted(self.model.state_dict().items()):
      t = tensor.detach().cpu().contiguous()
      if str(t.dtype) == "torch.bfloat16":  # NumPy has no bfloat16; float32 holds it exactly
        t = t.float()
      h.update(f"{name}:{t.dtype}:{tuple(t.shape)}\n".encode())
      h.update(t.numpy().tobytes())
    modules = [type(m).__name__ for m in self.model]
    return {"backend": self.backend, "path": self.path, "dim": self.dim, "fingerprint": h.hexdigest(),
            "config": {"modules": modules, "max_seq_length": self.model.max_seq_length}}


def load_teacher(path: str, *, backend: str = "auto", batch_size: int = 64, max_length: int | None = None,
                 checkpoint: str = "auto", device: str | None = None) -> Teacher:
  """The teacher at `path` (module docstring: backends and "auto")."""
  if backend not in BACKENDS:
    raise ValueError(f"teacher backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  if backend == "sentence-transformers":
    return SentenceTransformersTeacher(path, batch_size=batch_size, max_length=max_length, device=device)
  if backend == "st5":
    return St5Teacher(path, batch_size=batch_size, max_length=max_length, checkpoint=checkpoint)
  from st5_jax.checkpoints import loader, native  # pylint: disable=g-import-not-at-top

  fmt = loader.detect_format(native.choose_checkpoint(path, checkpoint))
  if fmt != "sentence_transformers":
    return St5Teacher(path, batch_size=batch_size, max_length=max_length, checkpoint=checkpoint)
  try:
    return St5Teacher(path, batch_size=batch_size, max_length=max_length, checkpoint=checkpoint)
  except ValueError as e:  # the reader's reason: not a T5 tower, a module it cannot express
    log.info("Teacher %s runs on sentence-transformers (%s)", path, e)
    return SentenceTransformersTeacher(path, batch_size=batch_size, max_length=max_length, device=device)
