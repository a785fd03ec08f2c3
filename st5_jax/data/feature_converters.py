"""Dual-encoder feature converter: task features -> left/right encoder token arrays.

Feature names follow t5x_retrieval: `inputs` -> `left_encoder_input_tokens`,
`targets` -> `right_encoder_input_tokens`, `negative_targets` ->
`right_negative_encoder_input_tokens`. Every feature is padded with 0 to its fixed
length; packing is refused (in-batch softmax needs one sentence per row).
"""

from __future__ import annotations

from typing import Mapping

import seqio
import tensorflow as tf

from st5_jax.features import MODEL_FEATURE_NAMES  # noqa: F401  (re-exported)


def complete_feature_lengths(feature_lengths: Mapping[str, int], *, negatives: bool) -> dict[str, int]:
  """Adds `negative_targets` (= targets length) for hard-negative tasks; validates keys."""
  lengths = {k: int(v) for k, v in feature_lengths.items()}
  for key in ("inputs", "targets"):
    if key not in lengths:
      raise ValueError(f"feature_lengths needs {key!r}; got {sorted(lengths)}.")
  if negatives:
    lengths.setdefault("negative_targets", lengths["targets"])
  else:
    lengths.pop("negative_targets", None)
  for key, value in lengths.items():
    if value < 2:
      raise ValueError(f"feature_lengths[{key!r}]={value}: need room for at least one token and EOS.")
  return lengths


class DualEncoderFeatureConverter(seqio.FeatureConverter):
  """Pads `inputs`/`targets`[/`negative_targets`] and renames them for the dual encoder."""

  def __init__(self, *, negatives: bool = False, pack: bool = False, **kwargs):
    if pack:
      raise ValueError("Dual-encoder examples cannot be packed: each row must hold one sentence.")
    self.negatives = negatives
    names = ("inputs", "targets") + (("negative_targets",) if negatives else ())
    spec = seqio.FeatureConverter.FeatureSpec(dtype=tf.int32)
    self.TASK_FEATURES = {name: spec for name in names}  # pylint: disable=invalid-name
    self.MODEL_FEATURES = {MODEL_FEATURE_NAMES[name]: spec for name in names}  # pylint: disable=invalid-name
    self.PACKING_FEATURE_DTYPES = None  # pylint: disable=invalid-name
    super().__init__(pack=False, **kwargs)

  def _convert_features(self, ds: tf.data.Dataset, task_feature_lengths: Mapping[str, int]) -> tf.data.Dataset:
    ds = self._pack_or_pad(ds, task_feature_lengths)
    names = list(self.TASK_FEATURES)

    def rename(features):
      return {MODEL_FEATURE_NAMES[name]: features[name] for name in names}

    return ds.map(rename, num_parallel_calls=tf.data.AUTOTUNE)

  def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> Mapping[str, int]:
    return {MODEL_FEATURE_NAMES[name]: task_feature_lengths[name] for name in self.TASK_FEATURES}
