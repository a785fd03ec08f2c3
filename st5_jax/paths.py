"""Where public data, the vocabulary and test fixtures live.

Nothing is downloaded implicitly: every location comes from an argument, an
environment variable, or a documented default, and a missing file is an error that
says which variable to set.
"""

from __future__ import annotations

import os
import pathlib

VOCAB_ENV = "ST5_VOCAB"
DATA_DIR_ENV = "ST5_DATA_DIR"
VOCAB_RELPATH = "t5_spiece/spiece.model"
# The file name the T5 vocabulary has in Hugging Face, T5X and our own model folders.
VOCAB_BASENAME = "spiece.model"


class MissingFileError(FileNotFoundError):
  """A required input file is absent; the message says how to provide it."""


def data_dir(explicit: str | os.PathLike | None = None, *, required: bool = True) -> pathlib.Path | None:
  """The folder of public data (layout of ../shared/data or `st5 data prepare --out`)."""
  value = explicit or os.environ.get(DATA_DIR_ENV)
  if not value:
    if required:
      raise MissingFileError(
          f"No data directory given. Pass --data_dir, or set {DATA_DIR_ENV} to a folder "
          "laid out like ../shared/data (for example one written by `st5 data prepare --out DIR`).")
    return None
  path = pathlib.Path(value).expanduser()
  if required and not path.is_dir():
    raise MissingFileError(f"Data directory {path} does not exist (from {'argument' if explicit else DATA_DIR_ENV}).")
  return path


def vocab_path(explicit: str | os.PathLike | None = None, *, model_dir: str | os.PathLike | None = None) -> str:
  """Resolves the SentencePiece model: argument, model folder, $ST5_VOCAB, $ST5_DATA_DIR."""
  tried = []
  candidates = []
  if explicit:
    candidates.append(("argument", str(explicit)))
  if model_dir and not str(model_dir).startswith("gs://"):
    for sub in ("", "assets", "0_Transformer", "0_T5"):
      candidates.append(("model folder", str(pathlib.Path(model_dir) / sub / VOCAB_BASENAME)))
  if os.environ.get(VOCAB_ENV):
    candidates.append((VOCAB_ENV, os.environ[VOCAB_ENV]))
  if os.environ.get(DATA_DIR_ENV):
    candidates.append((DATA_DIR_ENV, str(pathlib.Path(os.environ[DATA_DIR_ENV]) / VOCAB_RELPATH)))
  for source, candidate in candidates:
    if candidate.startswith("gs://") or os.path.isfile(candidate):
      return candidate
    tried.append(f"{candidate} ({source})")
    if source == "argument":
      raise MissingFileError(f"Vocabulary file {candidate} does not exist.")
  raise MissingFileError(
      "No T5 SentencePiece vocabulary found" + (f"; tried: {', '.join(tried)}" if tried else "") +
      f". Pass vocab=PATH, put {VOCAB_BASENAME} in the model folder, or set {VOCAB_ENV} "
      f"(or {DATA_DIR_ENV} with {VOCAB_RELPATH} inside).")
