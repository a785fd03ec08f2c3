"""seqio Tasks over the public TFDS catalogue (snli, multi_nli, squad) and the TF preprocessors
that build Sentence-T5's training examples from them, as the paper's data is built:

  st5_tfds_snli_triples        TFDS `snli` train pairs -> (premise, entailment, contradiction)
  st5_tfds_multi_nli_triples   TFDS `multi_nli` train pairs -> the same
  st5_tfds_nli_triples         mixture of the two, rates = their pair counts (SimCSE's SNLI+MNLI data)
  st5_tfds_reqa_squad          TFDS `squad/v1.1` train -> (question, sentence holding the answer), ReQA

Examples sharing a text with an evaluation set are dropped (st5_jax.data.overlap; the
evaluation sets are read from the data folder, $ST5_DATA_DIR). A TPU VM reads these from the public TFDS bucket: bind the TFDS data folder with gin
`st5_jax.data.options.tfds_data_dir = 'gs://tfds-data/datasets'` (or $TFDS_DATA_DIR;
default TFDS's own). seqio reads TFDS through TensorFlow's filesystem, which reaches real
GCS but not this project's GCS emulator (st5_jax.paths). Only `train` splits are
registered: SQuAD dev is where GLUE QNLI dev (SentGLUE-QNLI) comes from.

Preprocessors are pure TF (no Python inside tf.data):
* `nli_triples`: one triple per premise that has an entailment and a contradiction,
  the entailment and contradiction with the smallest fingerprint (the `per_premise` mode
  of st5_jax.data.builders, with "first" made independent of the read order, so every
  epoch and every file order gives the same ~275K triples for SNLI+MNLI train).
* `reqa_sentences`: the sentence of the paragraph containing the first answer's start,
  with builders.split_sentences' rules re-expressed as RE2 rewrites (tested equal to it
  on every question of SQuAD dev); questions whose answer crosses a sentence end, or
  whose answer text is not at its offset, are dropped.
"""

from __future__ import annotations

import functools
import os

import seqio
import tensorflow as tf

from st5_jax.data import builders, config, overlap, vocabulary

SNLI_TRIPLES = "st5_tfds_snli_triples"
MULTI_NLI_TRIPLES = "st5_tfds_multi_nli_triples"
NLI_TRIPLES_MIXTURE = "st5_tfds_nli_triples"
REQA_SQUAD = "st5_tfds_reqa_squad"
TFDS_NAMES = {SNLI_TRIPLES: "snli:1.1.0", MULTI_NLI_TRIPLES: "multi_nli:1.1.0", REQA_SQUAD: "squad/v1.1:3.0.0"}
TFDS_DATA_DIR_ENV = "TFDS_DATA_DIR"
# ClassLabel ids of TFDS snli / multi_nli: names=['entailment', 'neutral', 'contradiction'].
ENTAILMENT, CONTRADICTION = 0, 2


# ----------------------------------------------------------------------------
# NLI pairs -> triples.


def _fingerprint(text: tf.Tensor) -> tf.Tensor:
  return tf.strings.to_hash_bucket_fast(text, 2**62)


def nli_triples(ds: tf.data.Dataset, *, premise: str = "premise", hypothesis: str = "hypothesis",
                label: str = "label") -> tf.data.Dataset:
  """(premise, hypothesis, label) pairs -> {"inputs", "targets", "negative_targets"}, one per premise.

  Groups the whole dataset by premise (tf.data group_by_reducer); keeps, per premise,
  the entailment and the contradiction with the smallest fingerprint.
  """
  ds = ds.filter(lambda ex: tf.logical_or(tf.equal(ex[label], ENTAILMENT), tf.equal(ex[label], CONTRADICTION)))
  none = tf.constant(2**62, tf.int64)

  def init(key):
    del key
    return (tf.constant(""), tf.constant(""), none, tf.constant(""), none)

  def reduce(state, ex):
    text, entail, entail_fp, contra, contra_fp = state
    fp = _fingerprint(ex[hypothesis])
    is_entail = tf.equal(ex[label], ENTAILMENT)
    take_e = tf.logical_and(is_entail, fp < entail_fp)
    take_c = tf.logical_and(tf.logical_not(is_entail), fp < contra_fp)
    return (ex[premise], tf.where(take_e, ex[hypothesis], entail), tf.where(take_e, fp, entail_fp),
            tf.where(take_c, ex[hypothesis], contra), tf.where(take_c, fp, contra_fp))

  def finalize(text, entail, entail_fp, contra, contra_fp):
    return {"inputs": text, "targets": entail, "negative_targets": contra,
            "complete": tf.logical_and(entail_fp < none, contra_fp < none)}

  reducer = tf.data.experimental.Reducer(init, reduce, finalize)
  ds = ds.apply(tf.data.experimental.group_by_reducer(lambda ex: _fingerprint(ex[premise]), reducer))
  ds = ds.filter(lambda ex: ex["complete"])
  return ds.map(lambda ex: {k: ex[k] for k in ("inputs", "targets", "negative_targets")},
                num_parallel_calls=tf.data.AUTOTUNE)


# ----------------------------------------------------------------------------
# SQuAD -> ReQA sentence pairs.

# Python's str.split()/isspace() whitespace, which builders.split_sentences uses.
_WS = r"[\s\pZ\x{0b}\x{1c}-\x{1f}\x{85}]"
# builders._BOUNDARY with Python's Unicode \d; its lookahead is consumed (RE2 has none).
_P = r"[.!?]+['\"\x{2019}\x{201d})\]]*(?:\[\p{Nd}+\])*(?::\p{Nd}+(?:[-\x{2013}]\p{Nd}+)?)?"
_LOOKAHEAD = _WS + r"+['\"\x{2018}\x{201c}(\[]?[A-Z0-9]"
_START, _END = "\x01", "\x02"  # around each candidate boundary
_OPENERS = r"['\"(\x{201c}\[]"
_NOT_OPENER = r"[^\s\pZ\x{0b}\x{1c}-\x{1f}\x{85}'\"(\x{201c}\[.!?" + _START + _END + "]"
_NONSPACE = r"[^\s\pZ\x{0b}\x{1c}-\x{1f}\x{85}" + _START + _END + "]"


def _abbreviation_rewrite() -> tuple[str, str]:
  """RE2 (pattern, rewrite) removing the markers of a '.' whose word is an abbreviation, one
  letter, or contains '.', as split_sentences skips them (word = the token ending at the '.',
  lower-cased, trailing .!? and leading '\"(“[ stripped)."""
  abbreviations = "|".join(sorted((a.replace(".", r"\.") for a in builders._ABBREVIATIONS), key=len, reverse=True))  # pylint: disable=protected-access
  word = (r"(?:(?i:" + abbreviations + r")|" + _NOT_OPENER + r"|" + _NOT_OPENER + r"?" + _NONSPACE + r"*\." +
          _NONSPACE + r"*[^\s\pZ\x{0b}\x{1c}-\x{1f}\x{85}.!?" + _START + _END + "])")
  pattern = r"(^|" + _WS + r")(" + _OPENERS + r"*" + word + r"[.!?]*)" + _START + r"(\.[^" + _END + "]*)" + _END
  return pattern, r"\1\2\3"


_ABBREV_PATTERN, _ABBREV_REWRITE = _abbreviation_rewrite()


def _strip(text: tf.Tensor) -> tf.Tensor:
  return tf.strings.regex_replace(text, r"^" + _WS + r"+|" + _WS + r"+$", "")


def sentence_pieces(context: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
  """(pieces, starts, ends): split_sentences' spans of a scalar string, in code points.

  pieces[k] is the text from one boundary to the next; [starts[k], ends[k]) is the
  sentence span split_sentences returns for it (leading whitespace skipped after a
  boundary, the last span right-stripped; a last piece of whitespace only is no span).
  """
  marked = tf.strings.regex_replace(context, "(" + _P + ")(" + _LOOKAHEAD + ")", _START + r"\1" + _END + r"\2")
  marked = tf.strings.regex_replace(marked, _ABBREV_PATTERN, _ABBREV_REWRITE)
  marked = tf.strings.regex_replace(marked, _START, "")
  pieces = tf.strings.split(marked, _END)
  lengths = tf.strings.length(pieces, unit="UTF8_CHAR")
  offsets = tf.concat([[0], tf.cumsum(lengths)], 0)
  lead = lengths - tf.strings.length(tf.strings.regex_replace(pieces, "^" + _WS + "+", ""), unit="UTF8_CHAR")
  lead = tf.tensor_scatter_nd_update(lead, [[0]], [0])  # the first sentence starts at 0
  starts = offsets[:-1] + lead
  ends = offsets[1:]
  n = tf.shape(pieces)[0]
  last = pieces[n - 1]
  last_end = offsets[n - 1] + tf.strings.length(tf.strings.regex_replace(last, _WS + "+$", ""), unit="UTF8_CHAR")
  ends = tf.tensor_scatter_nd_update(ends, [[n - 1]], [last_end])
  keep = tf.concat([tf.ones([n - 1], tf.bool), [tf.strings.length(_strip(last)) > 0]], 0)
  return tf.boolean_mask(pieces, keep), tf.boolean_mask(starts, keep), tf.boolean_mask(ends, keep)


def split_sentences_tf(text: str) -> list[tuple[int, int]]:
  """Eager helper: the spans of `sentence_pieces` (for tests against builders.split_sentences)."""
  _, starts, ends = sentence_pieces(tf.constant(text))
  return list(zip(starts.numpy().tolist(), ends.numpy().tolist()))


def _reqa_example(ex):
  context = ex["context"]
  question = _strip(ex["question"])
  texts, starts = ex["answers"]["text"], ex["answers"]["answer_start"]
  has_answer = tf.size(texts) > 0
  text = tf.cond(has_answer, lambda: texts[0], lambda: tf.constant(""))
  start = tf.cond(has_answer, lambda: tf.cast(starts[0], tf.int32), lambda: tf.constant(-1))
  length = tf.strings.length(text, unit="UTF8_CHAR")
  at_offset = tf.equal(tf.strings.substr(context, tf.maximum(start, 0), length, unit="UTF8_CHAR"), text)
  pieces, s, e = sentence_pieces(context)
  inside = tf.logical_and(s <= start, start < e)
  found = tf.reduce_any(inside)
  k = tf.cast(tf.argmax(tf.cast(inside, tf.int32)), tf.int32)
  fits = tf.logical_and(found, start + length <= tf.gather(e, k))
  ok = tf.logical_and(tf.logical_and(has_answer, length > 0), tf.logical_and(at_offset, fits))
  ok = tf.logical_and(ok, tf.strings.length(question) > 0)
  target = tf.cond(found, lambda: _strip(tf.gather(pieces, k)), lambda: tf.constant(""))
  return {"inputs": question, "targets": target, "ok": ok}


def reqa_sentences(ds: tf.data.Dataset) -> tf.data.Dataset:
  """SQuAD examples -> {"inputs": question, "targets": the sentence holding the first answer}."""
  ds = ds.map(_reqa_example, num_parallel_calls=tf.data.AUTOTUNE)
  ds = ds.filter(lambda ex: ex["ok"])
  return ds.map(lambda ex: {"inputs": ex["inputs"], "targets": ex["targets"]}, num_parallel_calls=tf.data.AUTOTUNE)


# ----------------------------------------------------------------------------
# Sources and registration.


class LazyTfdsDataSource(seqio.TfdsDataSource):
  """A read-only TfdsDataSource whose data folder is resolved on first use, not at import.

  gin `st5_jax.data.options.tfds_data_dir`, else $TFDS_DATA_DIR, else TFDS's default.
  """

  def __init__(self, tfds_name: str, *, splits=("train",)):
    self._lazy_name = tfds_name
    self._lazy_splits = splits
    self._lazy_dir = None
    super().__init__(tfds_name=tfds_name, splits=splits, read_only=True)

  @property
  def tfds_dataset(self):
    data_dir = config.options().tfds_data_dir or os.environ.get(TFDS_DATA_DIR_ENV) or None
    if data_dir != self._lazy_dir:
      self._lazy_dir = data_dir
      self._tfds_dataset = seqio.utils.LazyTfdsLoader(self._lazy_name, data_dir=data_dir,
                                                      split_map={s: s for s in self._lazy_splits}, read_only=True)
    return self._tfds_dataset

  def list_shards(self, split):
    return [str(f.filename) if not isinstance(f, dict) else f["filename"] for f in self.tfds_dataset.files(split)]


def _features(names) -> dict[str, seqio.Feature]:
  vocab = vocabulary.get_vocabulary()
  return {n: seqio.Feature(vocabulary=vocab, add_eos=True, required=True) for n in names}


_STANDARD = [functools.partial(seqio.preprocessors.tokenize, copy_pretokenized=False),
             seqio.preprocessors.append_eos_after_trim]


def decontaminated(features):
  """A preprocessor dropping examples that share a text with an evaluation set (unless switched off)."""

  def preprocess(ds):
    if not config.options().decontaminate:
      return ds
    return overlap.decontaminate_tf(ds, features, data_dir=config.data_dir())

  return preprocess


def _add(name: str, preprocessor, features) -> seqio.Task:
  seqio.TaskRegistry.remove(name)
  return seqio.TaskRegistry.add(name, source=LazyTfdsDataSource(TFDS_NAMES[name]),
                                preprocessors=[preprocessor, decontaminated(features), *_STANDARD],
                                output_features=_features(features), shuffle_buffer_size=10_000)


def register() -> None:
  triples = ("inputs", "targets", "negative_targets")
  _add(SNLI_TRIPLES, nli_triples, triples)
  _add(MULTI_NLI_TRIPLES, nli_triples, triples)
  _add(REQA_SQUAD, reqa_sentences, ("inputs", "targets"))
  seqio.MixtureRegistry.remove(NLI_TRIPLES_MIXTURE)
  seqio.MixtureRegistry.add(NLI_TRIPLES_MIXTURE, [(SNLI_TRIPLES, seqio.mixing_rate_num_examples),
                                                  (MULTI_NLI_TRIPLES, seqio.mixing_rate_num_examples)])
