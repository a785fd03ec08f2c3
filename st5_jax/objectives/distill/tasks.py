"""The seqio task of a teacher cache: each example's texts, tokenised, and the teacher's vectors of them.

    DataConfig.task = @st5_jax.objectives.distill.distill_task()
    st5_jax.objectives.distill.distill_task.num_negatives = 1      # K, as Distill.num_negatives
    st5_jax.objectives.distill.distill_task.cache_dir = 'distill/minilm'   # or $ST5_DISTILL_CACHE
    TASK_FEATURE_LENGTHS = {'inputs': 32, 'targets': 32, 'negative_targets': 32, 'teacher_inputs': 384,
                            'teacher_targets': 384, 'teacher_negative_targets': 384}

Features: the texts (`inputs`, `targets`, `negative_targets`, ... tokenised with the T5 vocabulary,
EOS appended, as every st5 task) and, for each, `teacher_<feature>`: the teacher's float32 vector of
that text from the cache (st5_jax.objectives.distill.cache), whose length in TASK_FEATURE_LENGTHS must
be the teacher's dimension (checked when the data is read). The examples are the cache's (already
decontaminated); the split is `train`. They run through seqio's pipeline (shuffling, sharding by
example, resumable like any task). DataConfig.dedup compares token rows and would compare the
teacher's vectors as integers: leave it off (the default) with this task.
"""

from __future__ import annotations

import os
from typing import Callable

import gin
import numpy as np
import seqio
import tensorflow as tf

from st5_jax.data import registry, vocabulary
from st5_jax.objectives.distill import cache as cache_lib
from st5_jax.objectives.distill.objective import TEACHER_PREFIX, teacher_feature

DISTILL_TASK = "st5_distill"
CACHE_ENV = "ST5_DISTILL_CACHE"
SPLIT = "train"
_CHUNK = 512


class TeacherCacheSource(seqio.DataSource):
  """A teacher cache's examples: texts (tf.string) and the teacher's vectors (float32 [E]) per text feature.

  The folder is resolved when data is read; shard i of n is examples i, i + n, ...
  """

  def __init__(self, resolve: Callable[[], str], *, num_negatives: int):
    self._resolve = resolve
    self.keys = cache_lib.text_keys(num_negatives)
    self._opened: tuple[cache_lib.TeacherCache, np.ndarray] | None = None  # read once, not every epoch
    super().__init__(splits=(SPLIT,), caching_permitted=False)

  @property
  def supports_arbitrary_sharding(self) -> bool:
    return True

  def open(self) -> cache_lib.TeacherCache:
    """The cache, refused with the reason when its examples are not this task's."""
    folder = self._resolve()
    if self._opened is not None and self._opened[0].folder == cache_lib.TeacherCache.resolve(folder):
      return self._opened[0]
    cache = cache_lib.TeacherCache.open(folder)
    if cache.features != self.keys:
      raise ValueError(f"the teacher cache {cache.folder} holds examples with {len(cache.features) - 2} hard negatives "
                       f"({', '.join(cache.features)}); the task reads {len(self.keys) - 2}: set "
                       f"st5_jax.objectives.distill.distill_task.num_negatives and Distill.num_negatives to "
                       f"{len(cache.features) - 2}")
    self._opened = (cache, np.asarray(cache.texts, dtype=object))
    return cache

  def get_dataset(self, split: str = SPLIT, shuffle: bool = True, seed: int | None = None,
                  shard_info: seqio.ShardInfo | None = None, *, sequence_length=None, use_cached=False,
                  num_epochs=1) -> tf.data.Dataset:
    del shuffle, seed, sequence_length, use_cached, num_epochs  # seqio's Task shuffles after the source
    if split != SPLIT:
      raise ValueError(f"a teacher cache has one split, {SPLIT!r}; set DataConfig.split = {SPLIT!r} (got {split!r})")
    cache = self.open()
    texts = self._opened[1]
    index, count = (shard_info.index, shard_info.num_shards) if shard_info else (0, 1)
    rows = np.arange(index, len(cache), count)
    keys = self.keys

    def chunks():
      for start in range(0, len(rows), _CHUNK):
        ids_nxS = cache.examples_NxS[rows[start:start + _CHUNK]]
        out = {k: texts[ids_nxS[:, s]] for s, k in enumerate(keys)}
        out.update({teacher_feature(k): cache.vectors(ids_nxS[:, s]) for s, k in enumerate(keys)})
        yield out

    signature = {k: tf.TensorSpec([None], tf.string) for k in keys}
    signature.update({teacher_feature(k): tf.TensorSpec([None, cache.dim], tf.float32) for k in keys})
    return tf.data.Dataset.from_generator(chunks, output_signature=signature).unbatch()

  def list_shards(self, split: str) -> list[str]:
    return [self._resolve()]


def check_teacher_lengths(dataset: tf.data.Dataset, sequence_length=None) -> tf.data.Dataset:
  """Refuses lengths that would cut or pad the teacher's vectors (seqio trims every feature to its length)."""
  for key, spec in dataset.element_spec.items():
    want = (sequence_length or {}).get(key)
    if key.startswith(TEACHER_PREFIX) and want is not None and spec.shape[-1] != want:
      raise ValueError(f"the teacher cache holds {spec.shape[-1]}-d vectors but DataConfig.feature_lengths gives "
                       f"{key!r}: {want}; give every teacher_* feature the length {spec.shape[-1]} (the TEACHER_DIM "
                       "macro of distill_tiny_cpu.gin)")
  return dataset


def register_distill_task(name: str, cache_dir: str | Callable[[], str], *, num_negatives: int) -> seqio.Task:
  """Registers (or replaces) the task over a teacher cache with K = `num_negatives` hard negatives an example."""
  resolve = cache_dir if callable(cache_dir) else (lambda: cache_dir)
  source = TeacherCacheSource(resolve, num_negatives=num_negatives)
  vocab = vocabulary.get_vocabulary()
  features = {k: seqio.Feature(vocabulary=vocab, add_eos=True, required=True) for k in source.keys}
  features.update({teacher_feature(k): seqio.Feature(vocabulary=seqio.PassThroughVocabulary(0), add_eos=False,
                                                     dtype=tf.float32, required=True) for k in source.keys})
  if name in seqio.TaskRegistry.names():
    seqio.TaskRegistry.remove(name)
  return seqio.TaskRegistry.add(name, source=source, preprocessors=[check_teacher_lengths, *registry.PREPROCESSORS],
                                output_features=features, shuffle_buffer_size=10_000)


@gin.configurable(module="st5_jax.objectives.distill")
def distill_task(name: str = DISTILL_TASK, *, cache_dir: str | None = None, num_negatives: int = 0) -> str:
  """Registers the task of a teacher cache and returns its name: `DataConfig.task = @...distill_task()`.

  K (`num_negatives`) sets the task's features, so the task is registered when gin builds the run;
  the cache is read when data is: `cache_dir`, else $ST5_DISTILL_CACHE.
  """

  def resolve() -> str:
    folder = cache_dir or os.environ.get(CACHE_ENV)
    if not folder:
      raise ValueError(f"Task {name} has no teacher cache: bind st5_jax.objectives.distill.distill_task.cache_dir in "
                       f"gin or set {CACHE_ENV}=DIR (the folder `st5 distill-cache --out DIR` writes)")
    return folder

  register_distill_task(name, resolve, num_negatives=num_negatives)
  return name
