"""Sentence-T5 input pipeline: seqio tasks, dataset preparation, sharded batches for the mesh.

    from st5_jax.data import make_train_iterator   # registers the st5_* tasks on first use

Submodules, along the data flow: config (data options), rows (file readers, bad-row
accounting), builders (public datasets), overlap (decontamination against the evaluation
sets), sources/registry/tasks/tfds_tasks (seqio tasks), vocabulary, convert +
feature_converters (task features -> batch features), streams (one task's epochs:
seqio's pipeline or the NumPy path), mixing, dedup, iterator (batches, state; how a
batch splits over mesh and processes is st5_jax.batch_geometry, shared with
st5_jax.partitioning), cache + cache_stream (the token cache's format, its reader and
the training stream of it). Offline preparation (`st5 data prepare`, `st5 data list`,
`st5 data overlap`, `st5 data cache`: catalogue, download, derived datasets, TFDS
builders, overlap report, the token cache's in-memory and Beam writers) is the
subpackage st5_jax.data.offline, which nothing here imports. Attributes below are imported lazily
so that `import st5_jax.data.rows` does not pull in JAX or TensorFlow.
"""

import importlib

_EXPORTS = {
    "make_train_iterator": "st5_jax.data.iterator",
    "make_local_iterator": "st5_jax.data.iterator",
    "BatchIterator": "st5_jax.data.iterator",
    "DataConfigError": "st5_jax.batch_geometry",
    "batch_layout": "st5_jax.data.convert",
    "BatchLayout": "st5_jax.data.convert",
    "register_user_task": "st5_jax.data.registry",
    "register_hard_negatives_task": "st5_jax.data.registry",
    "register_mixture": "st5_jax.data.registry",
    "DualEncoderFeatureConverter": "st5_jax.data.feature_converters",
    "T5Vocabulary": "st5_jax.data.vocabulary",
    "get_vocabulary": "st5_jax.data.vocabulary",
    "BadRowError": "st5_jax.errors",
    "InputFileError": "st5_jax.errors",
    "RowStats": "st5_jax.data.rows",
}


def __getattr__(name):
  if name in _EXPORTS:
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
  raise AttributeError(name)


__all__ = sorted(_EXPORTS)
