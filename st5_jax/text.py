"""Text rules shared by the training builders (st5_jax/data/builders.py) and the evaluation sets.

Sentence splitting for ReQA-style SQuAD pairs and the clean-up of the SemEval-2016 CSVs'
quoting artefacts. Training pairs and the retrieval evaluation sets cut and clean text the
same way, so a sentence is the same string on both sides (decontamination compares them).
The ground floor: imports nothing of the package.
"""

from __future__ import annotations

import re


def squash(text: str | None) -> str:
  """Runs of whitespace as one space, stripped; None as ''."""
  return " ".join((text or "").split())


_ABBREVIATIONS = frozenset("""
mr mrs ms dr prof sr jr st mt ft vs etc e.g i.e cf al inc ltd co corp no nos fig figs vol
jan feb mar apr jun jul aug sep sept oct nov dec gen gov sen rep col lt sgt capt cmdr adm rev
hon pres approx ca est dept univ assn bros op pp ed eds u.s u.k u.n a.m p.m b.c a.d d.c
""".split())
# Sentence end, closing quotes/brackets, Wikipedia citation marks ("[3]", ":245"), then a capital.
_BOUNDARY = re.compile(r"""[.!?]+['"\u2019\u201d)\]]*(?:\[\d+\])*(?::\d+(?:[-\u2013]\d+)?)?"""
                       r"""(?=\s+['"\u2018\u201c(\[]?[A-Z0-9])""")


def split_sentences(text: str) -> list[tuple[int, int]]:
  """Character spans of the sentences of `text` (rule-based, abbreviation aware)."""
  spans = []
  start = 0
  for m in _BOUNDARY.finditer(text):
    end = m.end()
    token = text[start:m.start() + 1].split()[-1] if text[start:m.start() + 1].split() else ""
    word = token.lower().rstrip(".!?").lstrip("'\"(\u201c[")
    if text[m.start()] == "." and (word in _ABBREVIATIONS or len(word) == 1 or "." in word):
      continue  # "Dr. Who", "J. K. Rowling", "U.S. Army": not a boundary
    spans.append((start, end))
    start = end
    while start < len(text) and text[start].isspace():
      start += 1
  if start < len(text) and text[start:].strip():
    spans.append((start, len(text.rstrip())))
  return spans


def clean_cqa_text(text: str) -> str:
  """Undoes the quoting artefacts of the cleaned 2016 CSVs ('""text"""', a stray leading '"')."""
  text = squash(text)
  while '""' in text:
    text = text.replace('""', '"')
  if text.count('"') == 2 and text.startswith('"') and text.endswith('"'):
    text = text[1:-1].strip()
  elif text.count('"') % 2 == 1:
    if text.endswith('"'):
      text = text[:-1].strip()
    elif text.startswith('"'):
      text = text[1:].strip()
  return text
