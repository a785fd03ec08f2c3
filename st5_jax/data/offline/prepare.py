"""`st5 data prepare`: get every known dataset and write what the tasks read.

From an empty folder it writes every file the README's main job (`st5 train --gin_file
st5_tiny_cpu.gin`) and `st5 eval` read: downloaded files, and derived ones (the demo's NLI
triples) made here from their downloaded sources by the catalogue's recipe (derive.py),
checked against the same sha256 as a download. Local-only datasets are taken when a copy
is at hand (OUT or --source) and otherwise skipped: nothing those commands read is one
(the SQuAD dev reconstruction is read only by tests and, as a fallback of the official
file, by the retrieval suite's SQuAD sets).

Output layout (OUT):
  OUT/<raw files at catalog relpaths: stsb/, glue/...> copied, downloaded or derived, sha256-verified
  OUT/prepared/<task>/<split>.jsonl                 one example per line: inputs, targets,
                                                    [negative_targets], source (file:line)
  OUT/prepared/MANIFEST.json                        checksums, row counts, skipped rows
  OUT/tfds/st5_{qa_pairs,nli_triples}/<task>/1.0.0  with --tfds: the same examples as TFDS datasets

Running it again only redoes what changed: files already present with the right
checksum are kept, and a task split is rebuilt only when the checksums of its input
files (or the prepared format) changed.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import sys
from typing import Sequence

import seqio
from tqdm import tqdm

from st5_jax.data import builders as builders_lib
from st5_jax.data.offline import catalog
from st5_jax.data import overlap
from st5_jax.data.offline import derive as derive_lib
from st5_jax.data.offline import download as download_lib
from st5_jax.data import sources as sources_lib
from st5_jax.errors import BadRowError

MANIFEST = "MANIFEST.json"


class PrepareError(RuntimeError):
  """Some datasets or tasks could not be prepared; the message lists each problem."""


@dataclasses.dataclass
class DatasetReport:
  name: str
  files: list = dataclasses.field(default_factory=list)
  errors: list = dataclasses.field(default_factory=list)
  lines: int = 0

  def counts(self) -> dict[str, int]:
    out = {}
    for f in self.files:
      out[f.status] = out.get(f.status, 0) + 1
    return out


@dataclasses.dataclass
class TaskReport:
  task: str
  split: str
  status: str  # built | up to date | error
  path: str = ""
  stats: dict = dataclasses.field(default_factory=dict)
  written: int = 0
  error: str = ""


@dataclasses.dataclass
class PrepareReport:
  out_dir: str
  datasets: list
  tasks: list
  tfds: list = dataclasses.field(default_factory=list)  # (task, TFDS name, directory, status)
  skipped: list = dataclasses.field(default_factory=list)  # local-only datasets without a copy at hand

  @property
  def errors(self) -> list[str]:
    out = [e for d in self.datasets for e in d.errors]
    out += [f"{t.task} ({t.split}): {t.error}" for t in self.tasks if t.status == "error"]
    return out

  @property
  def ok(self) -> bool:
    return not self.errors

  def summary(self) -> str:
    lines = [f"Data folder: {self.out_dir}", "",
             f"{'dataset':26} {'files':>5}  {'present':>7} {'copied':>6} {'downloaded':>10} {'derived':>7}  "
             f"{'lines':>9}  status"]
    for d in self.datasets:
      c = d.counts()
      status = "ok" if not d.errors else f"{len(d.errors)} file(s) missing"
      lines.append(f"{d.name:26} {len(d.files) + len(d.errors):>5}  {c.get('present', 0):>7} {c.get('copied', 0):>6} "
                   f"{c.get('downloaded', 0):>10} {c.get('derived', 0):>7}  {d.lines:>9}  {status}")
    for name in self.skipped:  # what a first run needs is never local-only (catalog.py)
      lines.append(f"{name:26} skipped: local-only (no public copy) and no copy in the output or --source folder")
    lines += ["", f"{'prepared task (split)':46} {'rows read':>9} {'written':>8} {'skipped':>8} {'filtered':>8}  status"]
    for t in self.tasks:
      s = t.stats
      lines.append(f"{t.task + ' (' + t.split + ')':46} {s.get('rows_read', 0):>9} {t.written:>8} "
                   f"{s.get('rows_skipped', 0):>8} {s.get('rows_filtered', 0):>8}  {t.status}")
      for bad in s.get("first_skipped", [])[:3]:
        lines.append(f"    skipped {bad}")
      if s.get("evaluation_sets_missing"):
        lines.append(f"    not decontaminated against {len(s['evaluation_sets_missing'])} evaluation sets whose files "
                     "are missing: " + ", ".join(m.split(" (")[0] for m in s["evaluation_sets_missing"]))
    if self.tfds:
      lines += ["", f"{'TFDS dataset':46} status"]
      lines += [f"{name:46} {status}  ({directory})" for _, name, directory, status in self.tfds]
    if self.errors:
      lines += ["", "Problems:"] + [f"  {e}" for e in self.errors]
    return "\n".join(lines)


def _count_lines(path: str) -> int:
  n = 0
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      n += block.count(b"\n")
  return n


def _load_manifest(prepared: str) -> dict:
  path = os.path.join(prepared, MANIFEST)
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      manifest = json.load(f)
    if manifest.get("format_version") == sources_lib.PREPARED_FORMAT_VERSION:
      return manifest
  return {"format_version": sources_lib.PREPARED_FORMAT_VERSION, "datasets": {}, "tasks": {}}


def _write_json_atomic(path: str, obj) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(obj, f, indent=1, sort_keys=True)
    f.write("\n")
  os.replace(tmp, path)


def _at_hand(d: catalog.Dataset, out_dir: str, source_dir: str | None) -> bool:
  return all(any(os.path.exists(os.path.join(root, f.relpath)) for root in (out_dir, source_dir) if root)
             for f in d.files)


def _with_sources(names: Sequence[str]) -> list[str]:
  """`names` with every derived dataset's sources before it (a recipe reads their verified files)."""
  out: list[str] = []

  def add(name: str) -> None:
    if name in out:
      return
    recipe = catalog.DATASETS[name].derived
    for source in recipe.sources if recipe else ():
      add(source)
    out.append(name)

  for name in names:
    add(name)
  return out


def _select(datasets: Sequence[str] | None, out_dir: str, source_dir: str | None) -> tuple[list[str], list[str]]:
  """(datasets to prepare, sources first; local-only core datasets skipped for want of a copy)."""
  if datasets:
    unknown = [d for d in datasets if d not in catalog.DATASETS]
    if unknown:
      raise PrepareError(f"Unknown dataset(s) {unknown}; known: {sorted(catalog.DATASETS)}.")
    return _with_sources(datasets), []
  names, skipped = [], []
  for name, d in catalog.DATASETS.items():
    # Extras, and core datasets nothing can fetch (local-only), are taken when a copy is at hand.
    if (d.optional or d.local_only) and not _at_hand(d, out_dir, source_dir):
      if not d.optional:
        skipped.append(name)
      continue
    names.append(name)
  return _with_sources(names), skipped


def _progress_factory(enabled: bool):
  if not enabled:
    return lambda name: None
  def factory(name):
    bar = {}

    def update(received, total):
      if "bar" not in bar:
        bar["bar"] = tqdm(total=total, unit="B", unit_scale=True, desc=f"download {name}", leave=False,
                          file=sys.stderr)
      b = bar["bar"]
      b.update(received - b.n)
      if total is not None and received >= total:
        b.close()
    return update
  return factory


def prepare(*, out_dir: str, source_dir: str | None = None, base_url: str | None = None,
            datasets: Sequence[str] | None = None, offline: bool = False, trust_unverified: bool = False,
            strict: bool = False, progress: bool = True, timeout: float = 60.0, tfds: bool = False) -> PrepareReport:
  """Fetches datasets into `out_dir` and writes the prepared task files (and TFDS datasets); see the module doc."""
  out_dir = os.path.abspath(os.path.expanduser(str(out_dir)))
  os.makedirs(out_dir, exist_ok=True)
  if not os.access(out_dir, os.W_OK):
    raise PrepareError(f"Output folder {out_dir} is not writable; pass --out to a writable folder.")
  names, skipped = _select(datasets, out_dir, source_dir)
  prepared = os.path.join(out_dir, "prepared")
  os.makedirs(prepared, exist_ok=True)
  manifest = _load_manifest(prepared)

  fetcher = download_lib.Fetcher(out_dir=out_dir, source_dir=source_dir, base_url=base_url, offline=offline,
                                 trust_unverified=trust_unverified, timeout=timeout,
                                 progress_factory=_progress_factory(progress))
  reports = []
  all_files = [(name, f) for name in names for f in catalog.DATASETS[name].files]
  bar = None
  if progress:
    bar = tqdm(total=len(all_files), desc="files", unit="file", file=sys.stderr)
  try:
    for name in names:
      dataset = catalog.DATASETS[name]
      if dataset.derived:
        report = _derive(dataset, fetcher, out_dir, failed={r.name for r in reports if r.errors})
        if bar is not None:
          bar.update(len(dataset.files))
      else:
        report = DatasetReport(name)
        for f in dataset.files:
          try:
            report.files.append(fetcher.fetch(f))
          except download_lib.FetchError as e:
            report.errors.append(str(e))
          if bar is not None:
            bar.update(1)
      report.lines = sum(_count_lines(os.path.join(out_dir, r.relpath)) for r in report.files
                         if not r.relpath.endswith(".model"))
      if not report.errors:
        manifest["datasets"][name] = {r.relpath: {"sha256": r.sha256, "verified": r.verified} for r in report.files}
      reports.append(report)
  finally:
    fetcher.close()
    if bar is not None:
      bar.close()

  ready = {r.name for r in reports if not r.errors}
  ready |= {n for n in catalog.DATASETS if n in manifest["datasets"] and n not in names and all(
      os.path.exists(os.path.join(out_dir, p)) for p in manifest["datasets"][n])}
  task_reports = _build_tasks(out_dir, prepared, manifest, ready, strict=strict, progress=progress)
  manifest["updated"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
  _write_json_atomic(os.path.join(prepared, MANIFEST), manifest)
  report = PrepareReport(out_dir, reports, task_reports, skipped=skipped)
  if tfds:
    report.tfds = _write_tfds(out_dir, prepared, task_reports, progress=progress)
  return report


def _derive(dataset: catalog.Dataset, fetcher: download_lib.Fetcher, out_dir: str, *,
            failed: set[str]) -> DatasetReport:
  """A derived dataset: its verified copy at hand (OUT or --source), else made from its sources by its recipe."""
  report = DatasetReport(dataset.name)
  try:
    report.files = [fetcher.fetch(f, download_allowed=False) for f in dataset.files]
    return report
  except download_lib.FetchError:
    pass  # not at hand: derive all of its files
  missing = [s for s in dataset.derived.sources if s in failed]
  if missing:
    report.errors = [f"Cannot derive {f.relpath}: its source dataset(s) {', '.join(missing)} could not be got (see "
                     "above)." for f in dataset.files]
    return report
  try:
    report.files = derive_lib.derive(dataset, out_dir)
  except derive_lib.DeriveError as e:
    report.errors = [str(e)]
  return report


def _write_tfds(out_dir: str, prepared: str, task_reports: list[TaskReport], *,
                progress: bool) -> list[tuple[str, str, str, str]]:
  """TFDS datasets of every task whose splits are all prepared; rebuilt when a split was rebuilt."""
  # TFDS (seconds to import) only with --tfds.
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  from st5_jax.data.offline import tfds_builders  # pylint: disable=g-import-not-at-top  (imports TFDS)
  if not progress:
    tfds.disable_progress_bar()
  by_task: dict[str, list[TaskReport]] = {}
  for t in task_reports:
    by_task.setdefault(t.task, []).append(t)
  out = []
  for task, reports in by_task.items():
    if tfds_builders.builder_for(task) is None or any(r.status == "error" for r in reports):
      continue
    rebuild = any(r.status == "built" for r in reports)
    # TFDS reserves the split name "all" for the union of the splits (= st5_snli_devtest_triples' "all").
    directory = tfds_builders.write(task, prepared_dir=prepared, tfds_dir=os.path.join(out_dir, "tfds"),
                                    splits=tuple(r.split for r in reports if r.split != "all"), rebuild=rebuild)
    out.append((task, tfds_builders.tfds_name(task), directory, "built" if rebuild else "up to date"))
  return out


def _fingerprint(manifest: dict, dataset_names: Sequence[str]) -> str:
  inputs = {n: manifest["datasets"].get(n, {}) for n in (*dataset_names, *catalog.EVALUATION_DATASETS)}
  blob = json.dumps({"format": sources_lib.PREPARED_FORMAT_VERSION, "builders": builders_lib.BUILDERS_VERSION,
                     "decontamination": overlap.DECONTAMINATION_VERSION, "inputs": inputs}, sort_keys=True)
  return hashlib.sha256(blob.encode()).hexdigest()


def _build_tasks(out_dir: str, prepared: str, manifest: dict, ready: set[str], *, strict: bool,
                 progress: bool) -> list[TaskReport]:
  # Registered when first needed, as st5_jax.data.iterator does, not when this module is imported.
  from st5_jax.data import tasks as _  # noqa: F401  pylint: disable=g-import-not-at-top
  jobs = []
  for task_name, needed in catalog.TASK_DATASETS.items():
    if not set(needed) <= ready:
      continue
    source = seqio.get_mixture_or_task(task_name).source
    jobs += [(task_name, split, source, needed) for split in source.splits]
  if progress and jobs:
    jobs_iter = tqdm(jobs, desc="prepare tasks", unit="split", file=sys.stderr)
  else:
    jobs_iter = jobs
  reports = []
  for task_name, split, source, needed in jobs_iter:
    rel = os.path.join("prepared", task_name, f"{split}.jsonl")
    path = os.path.join(out_dir, rel)
    fingerprint = _fingerprint(manifest, needed)
    entry = manifest["tasks"].get(task_name, {}).get(split)
    if entry and entry.get("fingerprint") == fingerprint and os.path.exists(path):
      reports.append(TaskReport(task_name, split, "up to date", rel, entry.get("stats", {}), entry.get("examples", 0)))
      continue
    try:
      built = source.build(split, data_dir=out_dir, strict=strict, decontaminate=True)
    except (BadRowError, FileNotFoundError, ValueError) as e:
      reports.append(TaskReport(task_name, split, "error", rel, error=str(e)))
      continue
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    prefix = out_dir.rstrip("/") + "/"
    with open(tmp, "w", encoding="utf-8") as f:
      for ex in built.examples:
        row = {k: ex[k] for k in source.features}
        row["source"] = ex.get("source", "").replace(prefix, "")
        f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    stats = built.stats.as_dict()
    stats["first_skipped"] = [s.replace(prefix, "") for s in stats["first_skipped"]]
    stats["evaluation_sets_missing"] = list(built.evaluation_sets_missing)
    manifest["tasks"].setdefault(task_name, {})[split] = {
        "path": rel, "examples": len(built.examples), "fingerprint": fingerprint, "stats": stats,
        "inputs": sorted(built.inputs)}
    reports.append(TaskReport(task_name, split, "built", rel, stats, len(built.examples)))
  return reports
