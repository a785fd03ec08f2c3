"""The T5 vocabulary as a seqio.SentencePieceVocabulary whose file is found on first use.

Tasks are registered at import time, before gin or the environment may point at the
vocabulary, so the path is resolved lazily (argument, gin `st5_jax.data.options.vocab`,
$ST5_VOCAB, $ST5_DATA_DIR/t5_spiece/spiece.model). A missing file raises
st5_jax.paths.MissingFileError saying what to set.
"""

from __future__ import annotations

import seqio

from st5_jax import paths
from st5_jax.data import config
from st5_jax.vocab import EXTRA_IDS


class T5Vocabulary(seqio.SentencePieceVocabulary):
  """cc_all.32000 SentencePiece with 100 extra ids; the file path comes from configuration."""

  def __init__(self, path: str | None = None, *, extra_ids: int = EXTRA_IDS):
    self._explicit_path = path
    super().__init__(sentencepiece_model_file="", extra_ids=extra_ids)

  @property
  def _sentencepiece_model_file(self) -> str:  # read by seqio when the model loads
    resolved = paths.vocab_path(self._explicit_path) if self._explicit_path else config.vocab_path()
    # seqio reads it with tf.io.gfile, which cannot reach an emulated (or any non-TF) gs://.
    return paths.local_file(resolved)

  @_sentencepiece_model_file.setter
  def _sentencepiece_model_file(self, unused_value):
    pass  # seqio's __init__ assigns it; the path is resolved on use instead.


_DEFAULT = T5Vocabulary()


def get_vocabulary() -> T5Vocabulary:
  """The shared vocabulary object used by every registered task."""
  return _DEFAULT
