"""Derived datasets: the recipes `st5 data prepare` runs to make a dataset from its sources' files.

A derived dataset names its Recipe in the catalogue (st5_jax.data.offline.catalog): the
datasets it reads and the function here. `derive` runs it on the sources' files in the
data folder (already sha256-verified by prepare), writes the result into a scratch folder
beside them, checks every file against the catalogue's sha256 and only then moves the files
to their final names, so a wrong or half-written derived file never looks like a good one.
"""

from __future__ import annotations

import csv
import os
import tempfile
from typing import Callable

from st5_jax.data import builders
from st5_jax.data.offline import catalog
from st5_jax.data.offline.download import FetchResult, sha256_of
from st5_jax.data.rows import RowStats


class DeriveError(RuntimeError):
  """A recipe failed or made bytes other than the catalogue's; the message says which file and why."""


def snli_devtest_triples(data_dir: str, out_dir: str) -> None:
  """nli/snli_devtest_triples_derived.csv: `st5 data nli-triples --mode per_entailment` on SNLI dev, then test.

  SimCSE's columns sent0,sent1,hard_neg plus `split` (dev/test), which the
  st5_snli_devtest_triples task's splits select on.
  """
  path = os.path.join(out_dir, builders.SNLI_TRIPLES_FILE)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", encoding="utf-8", newline="") as f:
    writer = csv.writer(f)  # the excel dialect: \r\n line ends, quoting as SimCSE's file
    writer.writerow(["sent0", "sent1", "hard_neg", "split"])
    for split in ("dev", "test"):
      s1 = os.path.join(data_dir, builders.SNLI_SENTEVAL_DIR, f"s1.{split}")
      # strict: the sources are checksummed, so a bad row means a changed reader, not a bad file.
      for t in builders.build_nli_triples([s1], stats=RowStats(), strict=True, mode="per_entailment"):
        writer.writerow([t["inputs"], t["targets"], t["negative_targets"], split])


# Recipe name (catalog.Recipe.name) -> fn(data folder with the sources' files, folder to write the files into).
RECIPES: dict[str, Callable[[str, str], None]] = {
    "snli_devtest_triples": snli_devtest_triples,
}


def derive(dataset: catalog.Dataset, out_dir: str) -> list[FetchResult]:
  """Makes `dataset`'s files under `out_dir` from its sources' files there; all checked, or none written."""
  recipe = dataset.derived
  if recipe is None:
    raise ValueError(f"{dataset.name} is not a derived dataset.")
  if recipe.name not in RECIPES:
    raise DeriveError(f"{dataset.name}: unknown recipe {recipe.name!r}; known: {sorted(RECIPES)}.")
  where = f"derived from {', '.join(recipe.sources)} by recipe {recipe.name} ({recipe.command})"
  with tempfile.TemporaryDirectory(prefix=".derive-", dir=out_dir) as scratch:
    try:
      RECIPES[recipe.name](out_dir, scratch)
    except (OSError, ValueError) as e:  # BadRowError and InputFileError included
      raise DeriveError(f"Cannot derive {dataset.name} ({where}): {e}") from e
    results = []
    for f in dataset.files:
      built = os.path.join(scratch, f.relpath)
      if not os.path.exists(built):
        raise DeriveError(f"Cannot derive {f.relpath}: recipe {recipe.name} did not write it.")
      digest = sha256_of(built)
      if f.sha256 is not None and digest != f.sha256:
        raise DeriveError(
            f"Derived {f.relpath} has sha256 {digest}, the catalogue lists {f.sha256} ({where}). Its sources are "
            "verified, so the recipe or a builder it uses changed its output: fix that change, or if it is meant, "
            "update the checksum in st5_jax/data/offline/catalog.py.")
      results.append(FetchResult(f.relpath, "derived", digest, where, verified=f.sha256 is not None))
    for f in dataset.files:
      dest = os.path.join(out_dir, f.relpath)
      os.makedirs(os.path.dirname(dest), exist_ok=True)
      os.replace(os.path.join(scratch, f.relpath), dest)
  return results
