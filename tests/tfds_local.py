"""A local TFDS folder standing in for the public catalogue's snli, multi_nli and squad/v1.1.

TFDS's own builder classes (same names, versions, configs and features as the datasets
in gs://tfds-data) write it, fed from the files of ../shared/data instead of their
download URLs: snli `train` = SNLI dev pairs (SentEval layout), multi_nli `train` =
SNLI test pairs, squad/v1.1 `train` = the reconstructed SQuAD dev. Only the contents
differ from the public datasets: what is read, and how, is what a TPU VM does.
"""

from __future__ import annotations

import os
import pathlib

import tensorflow_datasets as tfds
from tensorflow_datasets.datasets.snli import snli_dataset_builder
from tensorflow_datasets.datasets.squad import squad_dataset_builder
from tensorflow_datasets.text import multi_nli


def _senteval_pairs(data_dir: pathlib.Path, split: str) -> list[tuple[str, str, str]]:
  folder = data_dir / "nli" / "snli_senteval_devtest"
  cols = [(folder / f"{p}.{split}").read_text(encoding="utf-8").split("\n") for p in ("s1", "s2", "labels")]
  return [(a.strip(), b.strip(), c.strip()) for a, b, c in zip(*cols) if c.strip()]


def _write_snli_txt(pairs, path: pathlib.Path) -> None:
  # The SNLI 1.0 .txt layout that TFDS's snli builder parses (csv.DictReader, tab-separated).
  header = ["gold_label", "sentence1_binary_parse", "sentence2_binary_parse", "sentence1_parse", "sentence2_parse",
            "sentence1", "sentence2", "captionID", "pairID"]
  lines = ["\t".join(header)] + ["\t".join([lab, "", "", "", "", s1, s2, "c", "p"]) for s1, s2, lab in pairs]
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _local(cls, name: str, files: dict[str, str]):
  """`cls` writing its splits from local files (its own _generate_examples parses them)."""

  class Local(cls, skip_registration=True):
    code_path = None  # no URL checksums to register (TFDS 4.9.10 needs the importlib_resources backport for them)

    def _split_generators(self, dl_manager):
      del dl_manager
      return [tfds.core.SplitGenerator(name=split, gen_kwargs={"filepath": path}) for split, path in files.items()]

  Local.name = name
  Local.__module__ = cls.__module__  # TFDS reads the builder's metadata (checksums, citations) from its package
  return Local


def build(data_dir: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
  """Writes out/snli/1.1.0, out/multi_nli/1.1.0 and out/squad/v1.1/3.0.0; returns `out`."""
  raw = out / "raw"
  raw.mkdir(parents=True, exist_ok=True)
  _write_snli_txt(_senteval_pairs(data_dir, "dev"), raw / "snli_train.txt")
  _write_snli_txt(_senteval_pairs(data_dir, "test"), raw / "mnli_train.txt")
  squad = str(data_dir / "squad_v1.1_dev" / "dev-v1.1.reconstructed.json")
  config = tfds.download.DownloadConfig(try_download_gcs=False)
  builders = [
      _local(snli_dataset_builder.Builder, "snli", {"train": str(raw / "snli_train.txt")})(data_dir=str(out)),
      _local(multi_nli.MultiNLI, "multi_nli", {"train": str(raw / "mnli_train.txt")})(data_dir=str(out)),
      _local(squad_dataset_builder.Builder, "squad", {"train": squad})(data_dir=str(out), config="v1.1"),
  ]
  for b in builders:
    b.download_and_prepare(download_config=config)
  assert os.path.isdir(out / "squad" / "v1.1" / "3.0.0")
  return out
