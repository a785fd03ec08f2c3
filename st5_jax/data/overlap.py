"""Overlap between training data and evaluation sets: what counts, and keeping public tasks clear of it.

Texts are compared after normalisation: NFKC, lower case, and only letters and digits
kept ("A man is running ." == "a man is running."), so tokenisation and spacing
variants of the same sentence match. The evaluation texts of a set are every text its
evaluation encodes (st5_jax.evaluation.sets: STS pairs, SentEval and SentGLUE
sentences, classifier training parts included); a set added there is decontaminated
against here too.

* The public tasks are decontaminated when they are built: an example with any text
  that occurs in an evaluation set is dropped and counted (`rows_filtered`, reason
  "text in evaluation set <name>"); the TFDS-backed tasks do the same in TF
  (`decontaminate_tf`). Users' tasks are left as they are: check them with the command.
* `st5 data overlap --tasks ... --eval ...` reports, per training task and evaluation
  set, how many distinct evaluation texts occur in the training task (exit status 1
  when any do): st5_jax.data.offline.overlap_report, built on this module.

This module is part of the runtime pipeline (st5_jax.data.sources and tfds_tasks call it
while building a task) and imports no task source; of the evaluation package only the
light st5_jax.evaluation.sets (no scikit-learn, no harness).
"""
from __future__ import annotations

import functools
import logging
import re
import unicodedata
from typing import Mapping, Sequence

import tensorflow as tf
import tensorflow_text as tf_text

from st5_jax.data import builders
from st5_jax.evaluation import sets as eval_sets

log = logging.getLogger("st5_jax.data")
# Bump when what counts as overlap changes (prepared files are then rebuilt).
DECONTAMINATION_VERSION = 4  # 2: the retrieval sets joined the index; 3: ALSO_CHECKED texts; 4: SemEval2016-B self-pairs out
_WORD = re.compile(r"[^\W_]+")


def normalize(text: str) -> str:
  """NFKC, lower case, letters and digits only."""
  return "".join(_WORD.findall(unicodedata.normalize("NFKC", text).lower()))


def evaluation_sets(names: str | Sequence[str] = "all") -> list[str]:
  """Evaluation task names (suites and aliases as `st5 eval --tasks`; 'all' includes STS-B dev)."""
  if names == "all" or names == ["all"]:
    return list(eval_sets.SETS)
  return eval_sets.resolve_tasks(names)


@functools.lru_cache(maxsize=4)
def _evaluation_texts(data_dir: str, names: tuple[str, ...]) -> tuple[dict[str, frozenset[str]], tuple[str, ...]]:
  out, missing = {}, []
  for name in names:
    try:
      texts = eval_sets.texts(name, data_dir)
    except FileNotFoundError as e:
      missing.append(f"{name} ({e})")
      continue
    out[name] = frozenset(n for n in map(normalize, texts) if n)
  return out, tuple(missing)


def evaluation_texts(data_dir: str, names: str | Sequence[str] = "all", *,
                     require: bool = False) -> dict[str, frozenset[str]]:
  """{evaluation set: its normalised texts}; sets whose files are missing are skipped (or raise)."""
  texts, missing = _evaluation_texts(str(data_dir), tuple(evaluation_sets(names)))
  if missing and require:
    raise FileNotFoundError(f"Evaluation sets missing under {data_dir}: {'; '.join(missing)}")
  return texts


def missing_evaluation_sets(data_dir: str, names: str | Sequence[str] = "all") -> tuple[str, ...]:
  return _evaluation_texts(str(data_dir), tuple(evaluation_sets(names)))[1]


# ----------------------------------------------------------------------------- decontamination


@functools.lru_cache(maxsize=2)
def evaluation_index(data_dir: str) -> dict[str, str]:
  """{normalised evaluation text: the first evaluation set (order of st5_jax.evaluation.sets.SETS) that holds it}."""
  index: dict[str, str] = {}
  for name, texts in evaluation_texts(data_dir).items():
    for t in texts:
      index.setdefault(t, name)
  return index


def first_hit(index: Mapping[str, str], texts: Sequence[str]) -> str | None:
  """The evaluation set of the first text (in feature order) found in `index`, else None."""
  return next((index[n] for n in map(normalize, texts) if n in index), None)


# An example's texts checked too though no feature holds them alone (st5_jax.data.builders: a forum
# question's body, when the example's question is subject + body and SemEval-2016 B holds the body).
ALSO_CHECKED = builders.DECONTAMINATION_TEXTS


def decontaminate(examples: list[dict[str, str]], features: Sequence[str], *, data_dir: str,
                  stats) -> tuple[list[dict[str, str]], tuple[str, ...]]:
  """Drops examples with a text in any evaluation set found under `data_dir`; counts them in
  `stats` by set. Returns the kept examples and the evaluation sets whose files are missing.

  The texts checked are the example's `features` and its ALSO_CHECKED list, if it has one."""
  index = evaluation_index(str(data_dir))
  missing = missing_evaluation_sets(data_dir)
  kept = []
  for ex in examples:
    hit = first_hit(index, [ex[f] for f in features] + list(ex.get(ALSO_CHECKED, ())))
    if hit is None:
      kept.append(ex)
    else:
      stats.filter(f"text in evaluation set {hit}")
  return kept, missing


def warn_missing(task: str, data_dir: str, missing: Sequence[str]) -> None:
  if missing:
    log.warning("Task %s is not decontaminated against %d evaluation sets missing under %s: %s. "
                "`st5 data prepare` puts them there; `st5 data overlap` reports overlaps.", task, len(missing),
                data_dir, ", ".join(m.split(" (")[0] for m in missing))


def decontaminate_tf(ds, features: Sequence[str], *, data_dir: str):
  """tf.data version for the TFDS-backed tasks: drops examples with a text in an evaluation set.

  Normalises in TF (NFKC, UTF-8 lower case, letters and digits), which equals `normalize`
  for all but rare characters whose lower case differs between Python and ICU.
  """
  table = _tf_table(str(data_dir))
  if table is None:
    return ds

  def clean(ex):
    hits = [table.lookup(_normalize_tf(ex[f])) for f in features]
    return tf.logical_not(tf.reduce_any(tf.stack(hits)))

  return ds.filter(clean)


def _normalize_tf(text):
  text = tf.strings.lower(tf_text.normalize_utf8(text, "NFKC"), encoding="utf-8")
  return tf.strings.regex_replace(text, r"[^\p{L}\p{N}]", "")


@functools.lru_cache(maxsize=2)
def _tf_table(data_dir: str):
  sets = evaluation_texts(data_dir)
  warn_missing("(TFDS-backed)", data_dir, missing_evaluation_sets(data_dir))
  keys = sorted(set().union(*sets.values()))
  if not keys:
    return None
  init = tf.lookup.KeyValueTensorInitializer(tf.constant(keys, tf.string), tf.ones(len(keys), tf.bool))
  return tf.lookup.StaticHashTable(init, default_value=False)
