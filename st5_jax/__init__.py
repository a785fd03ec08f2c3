"""Sentence-T5 sentence encoders in JAX/Flax."""

# The path layer first: it derives every GCS client's settings (e.g. from an emulator's
# STORAGE_EMULATOR_HOST) before any of those clients is imported.
from st5_jax import paths as _paths  # noqa: F401

__version__ = "0.1.0"


def __getattr__(name):
  # Lazy so that `import st5_jax` (and `st5 --help`) does not import JAX.
  if name == "SentenceEncoder":
    from st5_jax.encoder import SentenceEncoder
    return SentenceEncoder
  raise AttributeError(name)


__all__ = ["SentenceEncoder"]
