"""Export trained towers: TF SavedModel (strings in, embeddings out) and sentence-transformers.

Submodules import TensorFlow / JAX / safetensors only when used:

  savedmodel.export(...)             TF SavedModel with in-graph tokenisation (TF Hub interface)
  sentence_transformers.export(...)  sentence-transformers folder (encoder-only poolings)
  model_card.collect / render        README.md of an export
  source.load_source(path, ...)      config, float32 T5X-named arrays and vocabulary of any model
  export_model(...)                  all of the above, as `st5 export` runs it
"""

from __future__ import annotations

from st5_jax.export.formats import FORMATS


def export_model(*args, **kwargs):
  from st5_jax.export.api import export_model as _export_model
  return _export_model(*args, **kwargs)


__all__ = ["FORMATS", "export_model"]
