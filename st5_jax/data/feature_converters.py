"""The dual-encoder seqio FeatureConverter: task features -> batch features of a BatchLayout.

Token features (rank 1) are padded with 0 to their fixed lengths and scalar features
(rank 0, e.g. an int label) are passed through; names follow the layout (default
t5x_retrieval's: `inputs` -> `left_encoder_input_tokens`, `targets` ->
`right_encoder_input_tokens`, `negative_targets` -> `right_negative_encoder_input_tokens`,
other features keep their names). Packing is refused: each row is one sentence.

    converter = DualEncoderFeatureConverter.for_task("st5_snli_devtest_triples", {"inputs": 64, "targets": 64})
    ds = seqio.get_dataset("st5_snli_devtest_triples", task_feature_lengths=converter.task_feature_lengths,
                           feature_converter=converter, shuffle=False)
"""

from __future__ import annotations

from typing import Mapping

import seqio
import tensorflow as tf

from st5_jax.data import convert
from st5_jax.batch_geometry import DataConfigError
from st5_jax.features import MODEL_FEATURE_NAMES  # noqa: F401  (re-exported)


def complete_feature_lengths(feature_lengths: Mapping[str, int], *, negatives: bool) -> dict[str, int]:
  """The Sentence-T5 pair/triple lengths: `negative_targets` defaults to the targets length."""
  layout = convert.batch_layout([_standard_task(negatives)], feature_lengths)
  return layout.token_lengths


class DualEncoderFeatureConverter(seqio.FeatureConverter):
  """Pads token features, passes scalars through and renames them as the layout says."""

  def __init__(self, *, negatives: bool = False, layout: convert.BatchLayout | None = None, pack: bool = False,
               **kwargs):
    if pack:
      raise ValueError("Dual-encoder examples cannot be packed: each row must hold one sentence.")
    self.layout = layout or convert.standard_layout(negatives=negatives)
    spec = lambda f: seqio.FeatureConverter.FeatureSpec(dtype=tf.as_dtype(f.dtype), rank=1 if f.is_tokens else 0)  # noqa: E731
    self.TASK_FEATURES = {f.task_key: spec(f) for f in self.layout.features}  # pylint: disable=invalid-name
    self.MODEL_FEATURES = {f.model_key: spec(f) for f in self.layout.features}  # pylint: disable=invalid-name
    self.PACKING_FEATURE_DTYPES = None  # pylint: disable=invalid-name
    super().__init__(pack=False, **kwargs)

  @classmethod
  def for_task(cls, mixture_or_task: str | seqio.DatasetProviderBase, feature_lengths: Mapping[str, int], *,
               model_feature_names: Mapping[str, str] | None = None) -> "DualEncoderFeatureConverter":
    """The converter for a task's (or mixture's) output features and these lengths."""
    provider = (seqio.get_mixture_or_task(mixture_or_task) if isinstance(mixture_or_task, str)
                else mixture_or_task)
    tasks = list(provider.tasks) if isinstance(provider, seqio.Mixture) else [provider]
    return cls(layout=convert.batch_layout(tasks, feature_lengths, model_feature_names=model_feature_names))

  @property
  def task_feature_lengths(self) -> dict[str, int | None]:
    """What to pass as seqio's `task_feature_lengths` (None for scalar features)."""
    lengths = self.layout.task_feature_lengths
    if any(v == 0 for v in lengths.values()):
      raise DataConfigError("This converter was made without lengths; use DualEncoderFeatureConverter.for_task.")
    return lengths

  def _convert_features(self, ds: tf.data.Dataset, task_feature_lengths: Mapping[str, int]) -> tf.data.Dataset:
    token_lengths = {f.task_key: task_feature_lengths[f.task_key] for f in self.layout.features if f.is_tokens}
    ds = seqio.utils.trim_and_pad_dataset(ds, token_lengths)
    pairs = [(f.model_key, f.task_key) for f in self.layout.features]

    def rename(features):
      return {model_key: features[task_key] for model_key, task_key in pairs}

    return ds.map(rename, num_parallel_calls=tf.data.AUTOTUNE)

  def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> Mapping[str, int]:
    return {f.model_key: task_feature_lengths[f.task_key] for f in self.layout.features}


class _StandardFeatures:
  """Stand-in task with the Sentence-T5 pair/triple output features (for complete_feature_lengths)."""

  def __init__(self, negatives: bool):
    self.name = "st5 triples" if negatives else "st5 pairs"
    keys = ("inputs", "targets") + (("negative_targets",) if negatives else ())
    self.output_features = {k: seqio.Feature(vocabulary=seqio.PassThroughVocabulary(1), add_eos=True) for k in keys}


def _standard_task(negatives: bool) -> _StandardFeatures:
  return _StandardFeatures(negatives)
