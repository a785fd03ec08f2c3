"""TFDS datasets of the prepared public training sets (`st5 data prepare --tfds`).

Two GeneratorBasedBuilders, one config per public task, written from the prepared
JSON-lines files (so TFDS holds exactly the examples the tasks train on):

  st5_qa_pairs/<config>      inputs, targets, source     configs: trecqa_positives, wikiqa_positives,
                                                          qatar_living_good_answers, qatar_living_perfect_match,
                                                          reqa_squad_sentences
  st5_nli_triples/<config>   inputs, targets, negative_targets, source
                                                          configs: snli_devtest_triples, simcse_nli_triples

Read them with `tfds.load("st5_qa_pairs/trecqa_positives", data_dir=OUT/tfds)` (the
directory is self-describing: no import of this module is needed to read it) or a
seqio `TfdsDataSource("st5_qa_pairs/trecqa_positives:1.0.0", tfds_data_dir=OUT/tfds)`.
TFDS writes through TensorFlow's filesystem, so OUT is local; copy OUT/tfds to a
bucket as is.
"""

from __future__ import annotations

import json
import os
import shutil

import tensorflow_datasets as tfds

PREFIX = "st5_"
QA_TASKS = ("st5_trecqa_positives", "st5_wikiqa_positives", "st5_qatar_living_good_answers",
            "st5_qatar_living_perfect_match", "st5_reqa_squad_sentences")
NLI_TASKS = ("st5_snli_devtest_triples", "st5_simcse_nli_triples")
_VERSION = "1.0.0"


def config_name(task: str) -> str:
  return task[len(PREFIX):] if task.startswith(PREFIX) else task


class _PreparedBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Examples of one prepared task, every split, from OUT/prepared/<task>/<split>.jsonl."""

  VERSION = tfds.core.Version(_VERSION)
  # Nothing is downloaded, so no URL checksums file (whose lookup in TFDS 4.9.10 needs the
  # `importlib_resources` backport on Python >= 3.9).
  code_path = None
  RELEASE_NOTES = {_VERSION: "Sentence-T5 public training data, as written by `st5 data prepare`."}
  FEATURES: tuple[str, ...] = ()
  TASKS: tuple[str, ...] = ()

  def __init__(self, *, prepared_dir: str | None = None, splits: tuple[str, ...] = (), **kwargs):
    self._prepared_dir = prepared_dir
    self._splits = splits
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    features = {k: tfds.features.Text() for k in self.FEATURES + ("source",)}
    return self.dataset_info_from_configs(features=tfds.features.FeaturesDict(features), supervised_keys=None)

  def _task(self) -> str:
    return PREFIX + self.builder_config.name

  def _split_generators(self, dl_manager):
    del dl_manager
    if not self._prepared_dir:
      raise ValueError(f"{self.name}/{self.builder_config.name} is written by `st5 data prepare --tfds`.")
    return {split: self._generate_examples(os.path.join(self._prepared_dir, self._task(), f"{split}.jsonl"))
            for split in self._splits}

  def _generate_examples(self, path):
    with open(path, encoding="utf-8") as f:
      for i, line in enumerate(f):
        row = json.loads(line)
        yield i, {k: row.get(k, "") for k in self.FEATURES + ("source",)}


class St5QaPairs(_PreparedBuilder):
  """Sentence-T5 public question-answer pairs (stage 1)."""
  name = "st5_qa_pairs"
  FEATURES = ("inputs", "targets")
  BUILDER_CONFIGS = [tfds.core.BuilderConfig(name=config_name(t)) for t in QA_TASKS]


class St5NliTriples(_PreparedBuilder):
  """Sentence-T5 NLI triples: premise, entailment, contradiction (stage 2)."""
  name = "st5_nli_triples"
  FEATURES = ("inputs", "targets", "negative_targets")
  BUILDER_CONFIGS = [tfds.core.BuilderConfig(name=config_name(t)) for t in NLI_TASKS]


def builder_for(task: str):
  for cls in (St5QaPairs, St5NliTriples):
    if task in (PREFIX + c.name for c in cls.BUILDER_CONFIGS):
      return cls
  return None


def tfds_name(task: str) -> str:
  """'st5_qa_pairs/trecqa_positives:1.0.0' for a public task."""
  return f"{builder_for(task).name}/{config_name(task)}:{_VERSION}"


def write(task: str, *, prepared_dir: str, tfds_dir: str, splits: tuple[str, ...], rebuild: bool) -> str:
  """Writes the TFDS dataset of a prepared task (all its splits); returns its directory."""
  cls = builder_for(task)
  builder = cls(config=config_name(task), data_dir=tfds_dir, prepared_dir=prepared_dir, splits=tuple(splits))
  if rebuild and os.path.isdir(builder.data_dir):
    shutil.rmtree(builder.data_dir)
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  return builder.data_dir
