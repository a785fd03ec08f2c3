"""From a task's output features to batch features: the layout, and tokenising text in NumPy.

A `BatchLayout` says, for every task output feature that goes into a batch, its model
feature name, and either its fixed token length (rank-1 features: token ids, padded
with 0, EOS kept when truncated) or that it is one scalar per example (rank-0 features,
e.g. an int class label, passed through). It is derived from the tasks' seqio
`output_features` and the feature lengths, so any task's features map to batch
features; today's Sentence-T5 names (st5_jax.features) are the default model names:

    inputs -> left_encoder_input_tokens [B, L]      targets -> right_encoder_input_tokens [B, L]
    negative_targets -> right_negative_encoder_input_tokens [B, L]
    negative_targets_{i} -> right_negative_encoder_input_tokens_{i} [B, L]   (K hard negatives: i = 1..K-1)
    any other feature -> the same name, or what `model_feature_names` maps it to

Both data paths produce rows in this layout: seqio's pipeline through
DualEncoderFeatureConverter (feature_converters.py), and the NumPy path below, which
tokenises whole blocks of text with SentencePiece from Python.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Mapping, Sequence

import numpy as np
import seqio

from st5_jax import features as features_lib
from st5_jax.batch_geometry import DataConfigError
from st5_jax.data import prompts as prompts_lib


@dataclasses.dataclass(frozen=True)
class BatchFeature:
  task_key: str
  model_key: str
  length: int | None  # tokens per row; None: one scalar per example
  dtype: str  # NumPy dtype name
  add_eos: bool = False

  @property
  def is_tokens(self) -> bool:
    return self.length is not None


@dataclasses.dataclass(frozen=True)
class BatchLayout:
  """Which batch features a task or mixture yields, in task-feature order."""
  features: tuple[BatchFeature, ...]

  @property
  def task_feature_lengths(self) -> dict[str, int | None]:
    """seqio's `sequence_length` / `task_feature_lengths` (None for scalars)."""
    return {f.task_key: f.length for f in self.features}

  @property
  def token_lengths(self) -> dict[str, int]:
    return {f.task_key: f.length for f in self.features if f.is_tokens}

  @property
  def model_feature_lengths(self) -> dict[str, int | None]:
    return {f.model_key: f.length for f in self.features}

  @property
  def token_model_keys(self) -> list[str]:
    return [f.model_key for f in self.features if f.is_tokens]

  def shape(self, feature: BatchFeature, batch_size: int) -> tuple[int, ...]:
    return (batch_size, feature.length) if feature.is_tokens else (batch_size,)

  def zeros(self, batch_size: int) -> dict[str, np.ndarray]:
    return {f.model_key: np.zeros(self.shape(f, batch_size), f.dtype) for f in self.features}

  def dedup_keys(self) -> tuple[str | None, list[str]]:
    """(left, rights): `inputs` (else the first token feature) and the other token features."""
    tokens = [f for f in self.features if f.is_tokens]
    if not tokens:
      return None, []
    left = next((f for f in tokens if f.task_key == "inputs"), tokens[0])
    return left.model_key, [f.model_key for f in tokens if f is not left]


def _feature_kind(task: seqio.Task, name: str, feature: seqio.Feature) -> tuple[bool, str]:
  """(is_tokens, numpy dtype) of an output feature; rank > 1 is not a batch feature we can make."""
  dtype = np.dtype(feature.dtype.as_numpy_dtype).name
  if feature.rank == 1:
    return True, dtype
  if feature.rank == 0:
    return False, dtype
  raise DataConfigError(f"Task {task.name} feature {name!r} has rank {feature.rank}; batches hold token "
                        "sequences (rank 1) and scalars (rank 0).")


def batch_layout(tasks: Sequence[seqio.Task], feature_lengths: Mapping[str, int], *,
                 model_feature_names: Mapping[str, str] | None = None) -> BatchLayout:
  """The batch features of `tasks` (one task, or every task of a mixture).

  Token features (rank 1) need a length in `feature_lengths`; a missing
  `negative_targets` length defaults to the `targets` length, a missing
  `negative_targets_{i}` length (K hard negatives) to the `negative_targets` one, and optional
  (required=False) token features without a length are left out. Scalar features
  (rank 0) need none. Lengths of features the tasks do not have are ignored, so one
  TASK_FEATURE_LENGTHS can serve pair and triple tasks. All tasks of a mixture must
  yield the same features.
  """
  names = {**features_lib.MODEL_FEATURE_NAMES, **dict(model_feature_names or {})}
  lengths = {k: int(v) for k, v in feature_lengths.items() if v is not None}
  if "negative_targets" not in lengths and "targets" in lengths:
    lengths["negative_targets"] = lengths["targets"]
  if "negative_targets" in lengths:  # the further hard negatives negative_targets_{i} take the first one's length
    for key, _ in features_lib.negative_features(features_lib.MAX_NEGATIVES)[1:]:
      lengths.setdefault(key, lengths["negative_targets"])
  layouts = {}
  for task in tasks:
    out = []
    for key, feature in task.output_features.items():
      is_tokens, dtype = _feature_kind(task, key, feature)
      if is_tokens and key not in lengths:
        if feature.required:
          raise DataConfigError(f"Task {task.name} has the token feature {key!r} but feature_lengths "
                                f"{dict(feature_lengths)} gives no length for it.")
        continue
      length = lengths[key] if is_tokens else None
      add_eos = bool(getattr(feature, "add_eos", False)) and is_tokens
      if is_tokens and length < (2 if add_eos else 1):
        raise DataConfigError(f"feature_lengths[{key!r}]={length}: need room for at least one token"
                              f"{' and EOS' if add_eos else ''}.")
      out.append(BatchFeature(key, names.get(key, key), length, dtype, add_eos))
    layouts[task.name] = BatchLayout(tuple(out))
  distinct = set(layouts.values())
  if len(distinct) != 1:
    detail = "; ".join(f"{name}: {[(f.task_key, f.dtype, f.length) for f in lay.features]}"
                       for name, lay in layouts.items())
    raise DataConfigError(f"The tasks of a mixture must yield the same batch features; got {detail}.")
  layout = distinct.pop()
  model_keys = [f.model_key for f in layout.features]
  if len(set(model_keys)) != len(model_keys):
    raise DataConfigError(f"Two task features map to the same model feature: {model_keys}.")
  if not layout.features:
    raise DataConfigError(f"Tasks {[t.name for t in tasks]} yield no batch features with {dict(feature_lengths)}.")
  return layout


def standard_layout(*, negatives: bool, lengths: Mapping[str, int] | None = None) -> BatchLayout:
  """The Sentence-T5 pair or triple layout (t5x_retrieval's names)."""
  keys = ("inputs", "targets") + (("negative_targets",) if negatives else ())
  lengths = dict(lengths or {})
  return BatchLayout(tuple(BatchFeature(k, features_lib.MODEL_FEATURE_NAMES[k], lengths.get(k, 0), "int32", True)
                           for k in keys))


# ----------------------------------------------------------------------------
# The NumPy path: what seqio's tokenize + append_eos_after_trim + the converter do.


def _is_tokenize(fn) -> bool:
  fn = getattr(fn, "func", fn)
  return fn is seqio.preprocessors.tokenize


def has_standard_preprocessors(task: seqio.Task) -> bool:
  """True when a task only tokenises and appends EOS, after prepending prompts or not (what TextEncoder
  reproduces: prompts.AddPrompts, the step DataConfig.prompts adds, is prepended in Python)."""
  steps = list(task.preprocessors)
  if steps and isinstance(steps[0], prompts_lib.AddPrompts):
    steps = steps[1:]
  return len(steps) == 2 and _is_tokenize(steps[0]) and steps[1] is seqio.preprocessors.append_eos_after_trim


class TextEncoder:
  """A task's (prompts +) tokenize + append_eos_after_trim + padding, on blocks of text examples.

  Equals seqio's pipeline with DualEncoderFeatureConverter (tests/test_tasks.py checks
  it on real data) but calls SentencePiece on whole blocks from Python, which releases
  the GIL while it encodes.
  """

  def __init__(self, task: seqio.Task, layout: BatchLayout):
    if not has_standard_preprocessors(task):
      raise DataConfigError(f"Task {task.name} has preprocessors {list(task.preprocessors)}; the NumPy path runs "
                            "only tokenize + append_eos_after_trim (other tasks go through seqio).")
    self.layout = layout
    self.prompts = prompts_lib.task_prompts(task)
    self._features = []
    for f in layout.features:
      if not f.is_tokens:
        raise DataConfigError(f"Task {task.name}: the NumPy path makes token features only, not {f.task_key!r}.")
      vocab = task.output_features[f.task_key].vocabulary
      self._features.append((f, vocab, vocab.eos_id if f.add_eos else None))

  def __call__(self, examples: Sequence[Mapping[str, str]]) -> dict[str, np.ndarray]:
    out = {}
    for f, vocab, eos in self._features:
      texts = prompts_lib.apply([ex[f.task_key] for ex in examples], self.prompts.get(f.task_key, ""))
      out[f.model_key] = encode_block(texts, vocab.tokenizer, f.length, eos)
    return out


def encode_block(texts: Sequence[str], processor, length: int, eos: int | None) -> np.ndarray:
  """[n, length] int32: SentencePiece ids truncated to length-1 (length without EOS), EOS, 0-padding."""
  n = len(texts)
  keep = length - 1 if eos is not None else length
  ids = [row[:keep] for row in processor.encode(list(texts), out_type=int)]
  lengths_B = np.fromiter(map(len, ids), np.int64, count=n)
  flat = np.fromiter(itertools.chain.from_iterable(ids), np.int32, count=int(lengths_B.sum()))
  starts_B = np.cumsum(lengths_B) - lengths_B
  rows = np.repeat(np.arange(n), lengths_B)
  cols = np.arange(flat.size) - np.repeat(starts_B, lengths_B)
  tokens_BxL = np.zeros((n, length), np.int32)
  tokens_BxL[rows, cols] = flat
  if eos is not None:
    tokens_BxL[np.arange(n), lengths_B] = eos
  return tokens_BxL
