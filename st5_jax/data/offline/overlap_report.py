"""`st5 data overlap`: report texts shared by training tasks and evaluation sets.

Per training task (mixtures expanded) and evaluation set, how many distinct evaluation
texts occur in the task, with a few examples; texts are compared as
st5_jax.data.overlap normalises them. Offline: the command and the tests call it; the
runtime pipeline decontaminates through st5_jax.data.overlap alone.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Iterator, Mapping, Sequence

import seqio

from st5_jax.data import sources
from st5_jax.data.overlap import evaluation_texts, missing_evaluation_sets, normalize


def task_texts(task_name: str, split: str) -> Iterator[str]:
  """Every text of a task split: raw rows for this project's sources, else seqio's
  preprocessed examples decoded with the task's vocabularies (untruncated)."""
  task = seqio.get_mixture_or_task(task_name)
  if isinstance(task.source, sources.ExampleSource):
    for ex in task.source.iter_examples(split):
      yield from ex.values()
    return
  text_features = {k: f.vocabulary for k, f in task.output_features.items()
                   if f.rank == 1 and not isinstance(f.vocabulary, seqio.PassThroughVocabulary)}
  ds = task.get_dataset(sequence_length=None, split=split, shuffle=False, trim_output_features=False)
  for ex in ds.as_numpy_iterator():
    for k, vocab in text_features.items():
      ids = [int(i) for i in ex[k] if i > 0 and i != vocab.eos_id]
      yield vocab.decode(ids)


@dataclasses.dataclass
class Overlap:
  task: str
  split: str
  evaluation: str
  count: int  # distinct evaluation texts found in the task
  evaluation_size: int
  examples: list  # a few of them, shortest first


def find_overlaps(tasks: Iterable[str], *, data_dir: str, evaluations: str | Sequence[str] = "all",
                  split: str = "train", show: int = 3) -> tuple[list[Overlap], list[str]]:
  """Overlaps of every task (mixtures expanded) with every evaluation set; and the sets not found."""
  sets = evaluation_texts(data_dir, evaluations)
  missing = list(missing_evaluation_sets(data_dir, evaluations))
  names = []
  for name in tasks:
    provider = seqio.get_mixture_or_task(name)
    names += [t.name for t in provider.tasks] if isinstance(provider, seqio.Mixture) else [name]
  found = []
  for task_name in dict.fromkeys(names):
    originals: dict[str, str] = {}
    for text in task_texts(task_name, split):
      originals.setdefault(normalize(text), text)
    originals.pop("", None)
    for evaluation, texts in sets.items():
      common = texts & originals.keys()
      if common:
        sample = sorted(common, key=lambda n: (len(n), n))[:show]
        found.append(Overlap(task_name, split, evaluation, len(common), len(texts),
                             [originals[n] for n in sample]))
  return found, missing


def summary(overlaps: Sequence[Overlap], missing: Sequence[str]) -> str:
  lines = []
  if overlaps:
    lines.append(f"{'task (split)':46} {'evaluation set':20} {'overlap':>8} {'of':>7}  e.g.")
    for o in overlaps:
      lines.append(f"{o.task + ' (' + o.split + ')':46} {o.evaluation:20} {o.count:>8} {o.evaluation_size:>7}  "
                   + " | ".join(e[:50] for e in o.examples))
  else:
    lines.append("No overlap between the training tasks and the evaluation sets.")
  if missing:
    lines += ["", "Evaluation sets not checked (files missing):"] + [f"  {m}" for m in missing]
  return "\n".join(lines)


def as_json(overlaps: Sequence[Overlap], missing: Sequence[str]) -> Mapping:
  return {"overlaps": [dataclasses.asdict(o) for o in overlaps], "missing_evaluation_sets": list(missing)}
