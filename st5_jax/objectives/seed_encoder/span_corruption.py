"""T5 span corruption as seqio preprocessors, with the uncorrupted segment kept for SEED-Encoder.

The `t5` package's `t5.data.preprocessors.span_corruption` (Raffel et al. 2019) is the
reference: mean noise span length 3, noise density 0.15, each noise span replaced in the
inputs by a sentinel (vocabulary.vocab_size - 1, -2, ... : <extra_id_0>, <extra_id_1>,
...) and the targets the noise spans, each after its sentinel. The `t5` package cannot
be installed beside this project's pins (t5 0.9.4 requires seqio-nightly, tfds-nightly
and mesh-tensorflow, which install over seqio 0.0.20 and tensorflow-datasets), and
seqio does not ship span corruption, so the functions below re-implement t5 0.9.4's
(`random_spans_helper`, `select_random_chunk`, `reduce_concat_tokens`, `split_tokens`,
`denoise`, `random_spans_noise_mask`, `noise_span_to_unique_sentinel`) op for op: the
same stateless random ops drawing from the same seqio map seeds, so that a seqio Task
using them produces t5's examples. tests/test_seed_encoder.py checks them against a
NumPy re-derivation and against outputs recorded from t5 0.9.4 itself
(tests/golden/make_t5_span_corruption.py).

`span_corruption(..., uncorrupted_feature_key="uncorrupted")` also outputs the segment
before corruption (the weak decoder's reconstruction target); inputs and targets are
the same as without it (the copy draws no seeds).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import seqio
import tensorflow as tf

AUTOTUNE = tf.data.AUTOTUNE
# t5's documents are chunked to at most this many tokens before concatenation/splitting.
MAX_CHUNK_TOKENS = 65536


def random_spans_helper(*, inputs_length: int, noise_density: float, mean_noise_span_length: float,
                        extra_tokens_per_span_inputs: int = 1,
                        extra_tokens_per_span_targets: int = 1) -> tuple[int, int]:
  """(tokens_length, targets_length): raw tokens per segment so the corrupted inputs (EOS
  included) fill `inputs_length`, and the length of the targets (EOS included)."""

  def lengths(tokens_length: int) -> tuple[int, int]:
    num_noise_tokens = int(round(tokens_length * noise_density))
    num_nonnoise_tokens = tokens_length - num_noise_tokens
    num_noise_spans = int(round(num_noise_tokens / mean_noise_span_length))
    return (num_nonnoise_tokens + num_noise_spans * extra_tokens_per_span_inputs + 1,
            num_noise_tokens + num_noise_spans * extra_tokens_per_span_targets + 1)

  tokens_length = inputs_length - 1
  while lengths(tokens_length + 1)[0] <= inputs_length:
    tokens_length += 1
  _, targets_length = lengths(tokens_length)
  # t5's adjustment so that targets are no longer than inputs at density 0.5.
  if noise_density == 0.5 and targets_length > inputs_length:
    tokens_length -= 1
    targets_length -= 1
  return tokens_length, targets_length


def feature_lengths(inputs_length: int, *, noise_density: float = 0.15, mean_noise_span_length: float = 3.0,
                    uncorrupted_feature_key: str = "uncorrupted") -> dict[str, int]:
  """Task feature lengths for span corruption with `inputs_length` (EOS included in each)."""
  tokens_length, targets_length = random_spans_helper(
      inputs_length=inputs_length, noise_density=noise_density, mean_noise_span_length=mean_noise_span_length)
  return {"inputs": inputs_length, "targets": targets_length, uncorrupted_feature_key: tokens_length + 1}


def random_spans_noise_mask(length, noise_density: float, seeds, *, mean_noise_span_length: float = 3.0):
  """bool [length]: alternating non-noise / noise spans, starting with non-noise.

  round(length * noise_density) noise tokens (at least 1, at most length - 1) in
  round(noise tokens / mean_noise_span_length) spans (at least 1); the span lengths are
  random partitions drawn with `seeds` ([2, 2] int32).
  """
  if noise_density == 0.0:
    return tf.zeros(length, tf.bool)
  orig_length = length
  length = tf.maximum(length, 2)  # avoid degeneracy
  num_noise_tokens = tf.cast(tf.round(tf.cast(length, tf.float32) * noise_density), tf.int32)
  num_noise_tokens = tf.minimum(tf.maximum(num_noise_tokens, 1), length - 1)
  num_noise_spans = tf.cast(tf.round(tf.cast(num_noise_tokens, tf.float32) / mean_noise_span_length), tf.int32)
  num_noise_spans = tf.maximum(num_noise_spans, 1)
  num_nonnoise_tokens = length - num_noise_tokens

  def random_segmentation(num_items, num_segments, seed):
    # Positive segment lengths summing to num_items: num_segments - 1 random cut points.
    first_in_segment = tf.pad(
        seqio.stateless_shuffle(tf.cast(tf.range(num_items - 1) < num_segments - 1, tf.int32), seed), [[1, 0]])
    segment_id = tf.cumsum(first_in_segment)
    return tf.math.segment_sum(tf.ones_like(segment_id), segment_id)

  noise_span_lengths = random_segmentation(num_noise_tokens, num_noise_spans, seeds[0])
  nonnoise_span_lengths = random_segmentation(num_nonnoise_tokens, num_noise_spans, seeds[1])
  interleaved = tf.reshape(tf.stack([nonnoise_span_lengths, noise_span_lengths], axis=1), [num_noise_spans * 2])
  span_starts = tf.cumsum(interleaved)[:-1]
  span_start_indicator = tf.math.unsorted_segment_sum(tf.ones_like(span_starts), span_starts, length)
  span_num = tf.cumsum(span_start_indicator)
  is_noise = tf.equal(span_num % 2, 1)
  return is_noise[:orig_length]


def sentinel_id(vocabulary) -> int:
  """The first sentinel: the last id of the vocabulary (<extra_id_0> = 32099 for T5's)."""
  return vocabulary.vocab_size - 1


def noise_span_to_unique_sentinel(tokens, noise_mask, vocabulary):
  """Each run of noise tokens -> one sentinel, decreasing from `sentinel_id` along the sequence."""
  prev_token_is_noise = tf.pad(noise_mask[:-1], [[1, 0]])
  first_noise_tokens = tf.logical_and(noise_mask, tf.logical_not(prev_token_is_noise))
  subsequent_noise_tokens = tf.logical_and(noise_mask, prev_token_is_noise)
  sentinel = sentinel_id(vocabulary) + 1 - tf.cumsum(tf.cast(first_noise_tokens, tokens.dtype))
  tokens = tf.where(first_noise_tokens, sentinel, tokens)
  return tf.boolean_mask(tokens, tf.logical_not(subsequent_noise_tokens))


def nonnoise_span_to_unique_sentinel(tokens, noise_mask, vocabulary):
  """The targets: each run of kept tokens -> one sentinel, the noise tokens kept."""
  return noise_span_to_unique_sentinel(tokens, tf.logical_not(noise_mask), vocabulary)


def _non_empty(feature_key: str):
  def keep(x):
    return tf.not_equal(tf.size(x[feature_key]), 0)

  return keep


def select_random_chunk(dataset: tf.data.Dataset, *, max_length: int, feature_key: str = "targets",
                        passthrough_feature_keys: Sequence[str] | None = None) -> tf.data.Dataset:
  """One random chunk of at most `max_length` tokens per (non-empty) example (t5's, one seed per example)."""

  @seqio.map_over_dataset(num_seeds=1)
  def chunk(features, seed):
    seeds = tf.unstack(tf.random.experimental.stateless_split(seed))
    tokens = features[feature_key]
    n_tokens = tf.shape(tokens)[0]
    num_segments = tf.cast(tf.math.ceil(tf.cast(n_tokens, tf.float32) / tf.cast(max_length, tf.float32)),
                           tf.int32)
    start = max_length * tf.random.stateless_uniform([], maxval=num_segments, dtype=tf.int32, seed=seeds[1])
    end = tf.minimum(start + max_length, n_tokens)
    out = {feature_key: tokens[start:end]}
    for k in passthrough_feature_keys or ():
      out[k] = features[k]
    return out

  return chunk(dataset.filter(_non_empty(feature_key)))


def reduce_concat_tokens(dataset: tf.data.Dataset, *, feature_key: str = "targets",
                         batch_size: int = 128) -> tf.data.Dataset:
  """Concatenates `batch_size` consecutive documents (padding stripped) into one."""

  def only_key(x):
    return {feature_key: x[feature_key]}

  dataset = dataset.map(only_key, num_parallel_calls=AUTOTUNE)
  dataset = dataset.padded_batch(batch_size, padded_shapes={feature_key: [-1]})

  def concat(x):
    tokens = tf.reshape(x[feature_key], [-1])
    return {feature_key: tf.boolean_mask(tokens, tf.cast(tokens, tf.bool))}

  return dataset.map(concat, num_parallel_calls=AUTOTUNE)


def split_tokens(dataset: tf.data.Dataset, *, max_tokens_per_segment: int, feature_key: str = "targets",
                 passthrough_feature_keys: Sequence[str] | None = None) -> tf.data.Dataset:
  """Splits each example into segments of `max_tokens_per_segment` tokens (the last may be shorter)."""

  @seqio.map_over_dataset(num_seeds=1)
  def split(x, seed):
    del seed  # t5 draws it (and so advances the map seeds) but only uses it for random lengths.
    tokens = x[feature_key]
    n_tokens = tf.shape(tokens)[0]
    length = max_tokens_per_segment
    num_segments = tf.cast(tf.math.ceil(tf.cast(n_tokens, tf.float32) / tf.cast(length, tf.float32)), tf.int32)
    padding = num_segments * length - n_tokens
    padded = tf.pad(tokens, [[0, padding]])
    orig_lengths = {feature_key: tf.concat([tf.repeat(length, num_segments - 1), [length - padding]], axis=0)}
    outputs = {feature_key: tf.reshape(padded, [-1, length])}
    outputs_ds = tf.data.Dataset.from_tensor_slices(outputs)
    orig_lengths_ds = tf.data.Dataset.from_tensor_slices(orig_lengths)
    if passthrough_feature_keys:
      # Repeated by tf.data rather than materialised once per segment.
      passthrough = {k: v for k, v in x.items() if k in passthrough_feature_keys}
      passthrough_ds = tf.data.Dataset.from_tensors(passthrough).repeat(tf.cast(num_segments, tf.int64))
      return tf.data.Dataset.zip((outputs_ds, orig_lengths_ds, passthrough_ds))
    return tf.data.Dataset.zip((outputs_ds, orig_lengths_ds))

  def strip(inputs, orig_lengths, passthrough=None):
    out = {k: v[:orig_lengths[k]] for k, v in inputs.items()}
    out.update(passthrough or {})
    return out

  def identity(segments):
    return segments

  return split(dataset.filter(_non_empty(feature_key))).flat_map(identity).map(strip, num_parallel_calls=AUTOTUNE)


def denoise(dataset: tf.data.Dataset, *, output_features: Mapping[str, seqio.Feature], noise_density: float,
            mean_noise_span_length: float, input_feature_key: str = "inputs",
            passthrough_feature_keys: Sequence[str] | None = None) -> tf.data.Dataset:
  """`targets` -> noised `inputs` (unique sentinels) and `targets` (the noise spans), one seed per example."""
  passthrough = tuple(passthrough_feature_keys or ())
  if input_feature_key in passthrough or "targets" in passthrough:
    raise ValueError(f"passthrough keys cannot contain {input_feature_key!r} or 'targets'")
  vocabulary = output_features["targets"].vocabulary
  if input_feature_key in output_features and vocabulary != output_features[input_feature_key].vocabulary:
    raise ValueError("span corruption builds inputs from tokenized targets: inputs and targets need the same "
                     "vocabulary.")

  @seqio.map_over_dataset(num_seeds=1)
  def noise(features, seed):
    # Six seeds as in t5 (mask, inputs, targets pairs); the sentinel functions use none.
    seeds = tf.unstack(tf.random.experimental.stateless_split(seed, 6))
    tokens = features["targets"]
    noise_mask = random_spans_noise_mask(tf.size(tokens), noise_density, seeds[:2],
                                         mean_noise_span_length=mean_noise_span_length)
    return {input_feature_key: noise_span_to_unique_sentinel(tokens, noise_mask, vocabulary),
            "targets": nonnoise_span_to_unique_sentinel(tokens, noise_mask, vocabulary),
            **{k: features[k] for k in features if k in passthrough}}

  return noise(dataset)


def span_corruption(dataset: tf.data.Dataset, *, sequence_length: Mapping[str, int],
                    output_features: Mapping[str, seqio.Feature], mean_noise_span_length: float = 3.0,
                    noise_density: float = 0.15, input_feature_key: str = "inputs",
                    merge_examples_to_reduce_padding: bool = True, reserved_for_packing: int | None = None,
                    passthrough_feature_keys: Sequence[str] | None = None,
                    uncorrupted_feature_key: str | None = None) -> tf.data.Dataset:
  """T5's span-corruption objective on the tokenized `targets` feature (a seqio preprocessor).

  Documents are chunked (at most 65,536 tokens), optionally concatenated 128 at a time
  (`merge_examples_to_reduce_padding`, t5's default; False keeps one text per example,
  as sentence-level pre-training wants), split into segments sized so that the
  corrupted inputs fill `sequence_length[input_feature_key]` with EOS, and corrupted.
  EOS is appended later (seqio's append_eos_after_trim). With `uncorrupted_feature_key`
  the segment before corruption is kept under that key (its sequence length must hold
  the segment and EOS: see `feature_lengths`).
  """
  inputs_length = sequence_length[input_feature_key] - (reserved_for_packing or 0)
  tokens_length, targets_length = random_spans_helper(
      inputs_length=inputs_length, noise_density=noise_density, mean_noise_span_length=mean_noise_span_length)
  if sequence_length["targets"] < targets_length:
    raise ValueError(f"Expected targets length for span corruption ({targets_length}) is greater than configured "
                     f"targets length ({sequence_length['targets']})")
  passthrough = list(passthrough_feature_keys or ())
  if uncorrupted_feature_key is not None:
    have = sequence_length.get(uncorrupted_feature_key)
    if have is not None and have < tokens_length + 1:
      raise ValueError(f"sequence_length[{uncorrupted_feature_key!r}] = {have} cannot hold the {tokens_length}-token "
                       f"segments behind {inputs_length} corrupted input tokens plus EOS; use {tokens_length + 1} "
                       f"(span_corruption.feature_lengths({inputs_length}) gives all three lengths).")
    if uncorrupted_feature_key in (input_feature_key, "targets") or uncorrupted_feature_key in passthrough:
      raise ValueError(f"uncorrupted_feature_key {uncorrupted_feature_key!r} collides with another feature")
  if merge_examples_to_reduce_padding and passthrough:
    raise ValueError(f"passthrough_feature_keys not supported with merge_examples_to_reduce_padding=True. "
                     f"Got: {passthrough}")
  ds = select_random_chunk(dataset, max_length=MAX_CHUNK_TOKENS, feature_key="targets",
                           passthrough_feature_keys=passthrough)
  if merge_examples_to_reduce_padding:
    ds = reduce_concat_tokens(ds, feature_key="targets", batch_size=128)
  ds = split_tokens(ds, max_tokens_per_segment=tokens_length, feature_key="targets",
                    passthrough_feature_keys=passthrough)
  if uncorrupted_feature_key is not None:
    def keep_uncorrupted(x):
      return {**x, uncorrupted_feature_key: x["targets"]}

    ds = ds.map(keep_uncorrupted, num_parallel_calls=AUTOTUNE)
    passthrough = passthrough + [uncorrupted_feature_key]
  return denoise(ds, output_features=output_features, noise_density=noise_density,
                 mean_noise_span_length=mean_noise_span_length, input_feature_key=input_feature_key,
                 passthrough_feature_keys=passthrough)
