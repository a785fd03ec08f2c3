"""Which of the model's prompts each evaluation task encodes with (`st5 eval --prompt`, TrainConfig.eval_prompts).

A rule is `KEY=NAME`: KEY a task, a suite or `all` (as `--tasks` names them), NAME one of the model's
prompts (`st5_model.prompts`, sentence-transformers' `prompts`) or `none` (no prompt):

    sts=query               every STS task encodes its sentences with the "query" prompt
    STSBenchmark=none       ... but STS-B with none (a task's rule beats its suite's, a suite's beats `all`)
    retrieval.query=q2      the query side of the retrieval sets (`.document`: their corpora)
    TREC-QA=none            a plain rule on a retrieval set sets both of its sides

Without a rule a task keeps its default: the model's default prompt (`encode`) for the sentence tasks,
the "query" / "document" prompts (`encode_query` / `encode_document`) for the two sides of a retrieval set.
`plan` turns rules into {task: {side: prompt text}} with side "encode" (sentence tasks) or "query" /
"document" (retrieval sets), holding only what a rule chose.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

from st5_jax.evaluation import sets

NONE = "none"
SIDES = ("query", "document")
ENCODE = "encode"


@dataclasses.dataclass(frozen=True)
class Rule:
  key: str  # task, suite or "all", as written
  side: str | None  # None, "query" or "document"
  name: str  # a prompt name of the model, or NONE

  def __str__(self) -> str:
    return f"{self.key}{'.' + self.side if self.side else ''}={self.name}"


def parse(rules: Sequence[str] | Mapping[str, str] | None, where: str = "--prompt") -> list[Rule]:
  """`KEY[.query|.document]=NAME` strings (or a {KEY[.side]: NAME} mapping) as Rules; one-line ValueErrors."""
  if not rules:
    return []
  items = list(rules.items()) if isinstance(rules, Mapping) else []
  if not isinstance(rules, Mapping):
    for rule in rules:
      key, sep, name = str(rule).rpartition("=")
      if not sep or not key.strip() or not name.strip():
        raise ValueError(f"{where} {rule!r}: write TASK_OR_SUITE=PROMPT_NAME (e.g. sts=query, retrieval.query=q, "
                         f"STSBenchmark={NONE})")
      items.append((key, name))
  out = []
  for key, name in items:
    if not isinstance(key, str) or not isinstance(name, str) or not key.strip() or not name.strip():
      raise ValueError(f"{where}: {key!r}: {name!r} is not TASK_OR_SUITE=PROMPT_NAME (both strings)")
    key, name, side = key.strip(), name.strip(), None
    head, dot, tail = key.rpartition(".")
    if dot and tail in SIDES:
      key, side = head, tail
    out.append(Rule(key, side, name))
  return out


def _level(key: str) -> tuple[int, list[str]]:
  """(specificity: 0 task, 1 suite, 2 all; the task names it covers) of a rule's key."""
  low = key.lower()
  if low == "all":
    return 2, list(sets.SETS)  # every set, dev included, and any BEIR folder (matched by kind below)
  if low in sets.SUITES:
    return 1, list(sets.SUITES[low])
  return 0, sets.resolve_tasks(key)  # a task, an alias or beir:FOLDER; an unknown name fails here


def plan(rules: Sequence[Rule], tasks: Sequence[str], prompts: Mapping[str, str], *, where: str = "--prompt"
         ) -> dict[str, dict[str, str]]:
  """{task: {side: prompt text}} of the rules over `tasks` (resolved task names) and the model's `prompts`."""
  chosen: dict[str, dict[str, tuple[tuple[int, int], str]]] = {}
  for rule in rules:
    if rule.name != NONE and rule.name not in prompts:
      known = ", ".join(repr(n) for n in prompts) or "none"
      raise ValueError(f"{where} {rule}: the model has no prompt {rule.name!r} (its prompts: {known}; or {NONE!r})")
    level, names = _level(rule.key)
    hit = [t for t in tasks if t in names or (level == 2 and t.startswith(sets.BEIR_PREFIX))]
    retrieval = [t for t in hit if sets.get_set(t).kind == "retrieval"]
    if rule.side and not retrieval:
      raise ValueError(f"{where} {rule}: {rule.key} names no retrieval set of the evaluated tasks; a .{rule.side} "
                       f"rule sets a side of retrieval sets (write {rule.key}={rule.name} for sentence tasks)")
    if not hit:
      raise ValueError(f"{where} {rule}: {rule.key} names none of the evaluated tasks ({', '.join(tasks)})")
    text = "" if rule.name == NONE else prompts[rule.name]
    rank = (level, 0 if rule.side else 1)  # a task's rule beats its suite's; at one level a side's beats a plain
    for t in hit:
      is_retrieval = t in retrieval
      sides = ([rule.side] if rule.side else list(SIDES)) if is_retrieval else ([] if rule.side else [ENCODE])
      for side in sides:
        old = chosen.setdefault(t, {}).get(side)
        if old is None or rank <= old[0]:
          chosen[t][side] = (rank, text)
  return {t: {side: text for side, (_, text) in by_side.items()} for t, by_side in chosen.items() if by_side}
