"""seqio Tasks for ConSERT, registered on import (standard seqio: FunctionDataSource,
`tokenize` + `append_eos_after_trim`).

  consert_sts_sentences      The unlabelled sentences of STS12-16, STS-B (train/dev/test) and
                             SICK-R (train/trial/test): ConSERT's *transductive* unsupervised
                             protocol -- it trains on the text of the evaluation sets (never
                             their scores). Feature `inputs`. Splits:
                               train   every sentence of every pair, duplicates kept, STS15/16
                                       pairs without a gold score included: 89,192, the
                                       paper's count (its data_utils.py reads all input lines);
                               unique  the 47,408 distinct sentences of `train`.
                             Official text (sts12-16/original, stsb/original,
                             sick/brmson_semeval2014), whitespace-normalised like the
                             evaluation readers, so training and evaluation see the same strings.
  consert_snli_devtest_pairs SNLI pairs with labels, from nli/snli_senteval_devtest (the public
                             SNLI here): train = dev (9,842), validation = test (9,824), all.
  consert_snli_mnli_pairs    SNLI + MultiNLI train pairs (the paper's supervised data) from
                             nli/snli_1.0/snli_1.0_train.jsonl and
                             nli/multinli_1.0/multinli_1.0_train.jsonl under the data folder
                             (`st5 data prepare --datasets snli_full,mnli_full`); pairs
                             without a gold label are dropped.

NLI features: `inputs` (premise), `targets` (hypothesis), `label` (int32: contradiction 0,
entailment 1, neutral 2 -- the official main.py's label2int). The data folder is
resolved when a dataset is built (gin `st5_jax.data.options.data_dir`, else $ST5_DATA_DIR).
"""

from __future__ import annotations

import functools
import os
from typing import Iterator

import seqio
import tensorflow as tf

from st5_jax import paths
from st5_jax.data import builders, config
from st5_jax.data.rows import RowStats
from st5_jax.data.vocabulary import get_vocabulary
from st5_jax.errors import InputFileError
from st5_jax.evaluation import readers  # light: the evaluation sets' readers, not the harness

STS_SENTENCES = "consert_sts_sentences"
SNLI_DEVTEST_PAIRS = "consert_snli_devtest_pairs"
SNLI_MNLI_PAIRS = "consert_snli_mnli_pairs"
LABEL2INT = {"contradiction": 0, "entailment": 1, "neutral": 2}
SNLI_TRAIN = "nli/snli_1.0/snli_1.0_train.jsonl"
MNLI_TRAIN = "nli/multinli_1.0/multinli_1.0_train.jsonl"

PREPROCESSORS = (
    functools.partial(seqio.preprocessors.tokenize, copy_pretokenized=False),
    seqio.preprocessors.append_eos_after_trim,
)


# ------------------------------------------------------------------------ sentences


def _file_lines(path) -> list[str]:
  if not os.path.isfile(path):
    raise InputFileError(f"Input file {path} does not exist; the data folder should be in {paths.LAYOUT_HINT}.")
  with open(path, encoding="utf-8", newline="") as f:
    text = f.read()
  return [line.rstrip("\r") for line in text.split("\n")][: -1 if text.endswith("\n") else None]


def sts_sentences(data_dir: str) -> list[str]:
  """Both sentences of every STS12-16 input line (scored or not), STS-B and SICK pair, in order."""
  out = []
  for year, subsets in readers.STS_SUBSETS.items():
    folder = os.path.join(data_dir, "sts12-16", "original", f"STS{year % 100}-en-test")
    prefix = "STS2016" if year == 2016 else "STS"
    for subset in subsets:
      for line in _file_lines(os.path.join(folder, f"{prefix}.input.{subset}.txt")):
        fields = line.split("\t")  # STS16 originals carry two extra source columns
        if len(fields) < 2:
          raise InputFileError(f"{folder}/{prefix}.input.{subset}.txt: a line without two tab-separated sentences")
        out += [readers.clean(fields[0]), readers.clean(fields[1])]
  for split in ("train", "dev", "test"):
    pairs = readers.read_stsb(data_dir, split=split)
    out += [s for pair in zip(pairs.sents1, pairs.sents2) for s in pair]
  for split in ("train", "trial", "test"):
    pairs = readers.read_sick(data_dir, split=split)
    out += [s for pair in zip(pairs.sents1, pairs.sents2) for s in pair]
  return out


def _sentences_dataset(split: str, shuffle_files: bool = False, seed: int | None = None) -> tf.data.Dataset:
  del shuffle_files, seed  # one in-memory list; the training pipeline shuffles examples
  sents = sts_sentences(config.data_dir())
  if split == "unique":
    sents = list(dict.fromkeys(sents))
  elif split != "train":
    raise ValueError(f"{STS_SENTENCES} has splits 'train' and 'unique', not {split!r}")
  return tf.data.Dataset.from_tensor_slices({"inputs": tf.constant(sents, tf.string)})


# ---------------------------------------------------------------------------- NLI


def _nli_rows(paths: list[str], stats: RowStats, strict: bool) -> Iterator[tuple[str, str, int]]:
  for path in paths:
    for premise, hypothesis, label, _ in builders.iter_nli_file(path, stats=stats, strict=strict):
      yield premise, hypothesis, LABEL2INT[label]


def _pairs_dataset(paths: list[str]) -> tf.data.Dataset:
  rows = list(_nli_rows(paths, RowStats(), config.strict()))
  if not rows:
    raise InputFileError(f"No labelled NLI pairs in {', '.join(paths)}")
  premises, hypotheses, labels = zip(*rows)
  return tf.data.Dataset.from_tensor_slices({"inputs": tf.constant(premises, tf.string),
                                             "targets": tf.constant(hypotheses, tf.string),
                                             "label": tf.constant(labels, tf.int32)})


def _snli_devtest_dataset(split: str, shuffle_files: bool = False, seed: int | None = None) -> tf.data.Dataset:
  del shuffle_files, seed
  parts = {"train": ["dev"], "validation": ["test"], "all": ["dev", "test"]}
  if split not in parts:
    raise ValueError(f"{SNLI_DEVTEST_PAIRS} has splits {sorted(parts)}, not {split!r}")
  folder = os.path.join(config.data_dir(), builders.SNLI_SENTEVAL_DIR)
  return _pairs_dataset([os.path.join(folder, f"s1.{p}") for p in parts[split]])


def _snli_mnli_dataset(split: str, shuffle_files: bool = False, seed: int | None = None) -> tf.data.Dataset:
  del shuffle_files, seed
  if split != "train":
    raise ValueError(f"{SNLI_MNLI_PAIRS} has split 'train' only, not {split!r}")
  paths = [os.path.join(config.data_dir(), p) for p in (SNLI_TRAIN, MNLI_TRAIN)]
  missing = [p for p in paths if not os.path.isfile(p)]
  if missing:
    raise InputFileError(f"{SNLI_MNLI_PAIRS} needs {', '.join(missing)} (SNLI 1.0 and MultiNLI 1.0 train jsonl; "
                         "`st5 data prepare --datasets snli_full,mnli_full` downloads them). The public SNLI dev/test "
                         f"pairs here are task {SNLI_DEVTEST_PAIRS}.")
  return _pairs_dataset(paths)


# ---------------------------------------------------------------------- registration


def _text_feature() -> seqio.Feature:
  return seqio.Feature(vocabulary=get_vocabulary(), add_eos=True, required=True)


def _add(name: str, source: seqio.DataSource, features: dict[str, seqio.Feature]) -> seqio.Task:
  if name in seqio.TaskRegistry.names():
    seqio.TaskRegistry.remove(name)
  return seqio.TaskRegistry.add(name, source=source, preprocessors=list(PREPROCESSORS), output_features=features)


def register() -> None:
  """(Re-)registers the ConSERT tasks; runs on import."""
  nli_features = {"inputs": _text_feature(), "targets": _text_feature(),
                  "label": seqio.ContinuousFeature(dtype=tf.int32, rank=0, required=True)}
  _add(STS_SENTENCES, seqio.FunctionDataSource(_sentences_dataset, splits=("train", "unique"),
                                               num_input_examples={"train": 89_192, "unique": 47_408}),
       {"inputs": _text_feature()})
  _add(SNLI_DEVTEST_PAIRS, seqio.FunctionDataSource(_snli_devtest_dataset, splits=("train", "validation", "all"),
                                                    num_input_examples={"train": 9_842, "validation": 9_824,
                                                                        "all": 19_666}), nli_features)
  _add(SNLI_MNLI_PAIRS, seqio.FunctionDataSource(_snli_mnli_dataset, splits=("train",)), nli_features)


register()
