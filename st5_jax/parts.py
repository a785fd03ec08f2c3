"""A folder written in resumable parts: the helpers its writers share.

Mined negatives (st5_jax/data/offline/mine.py), the teacher cache (st5_jax/objectives/distill/cache.py)
and the embedding index (st5_jax/retrieval/index.py) write their output as numbered parts, each a data file
plus a JSON written last (its sha256 and the run's identity), then a manifest. A rerun keeps the parts
whose JSON matches this run and whose bytes match their JSON, and refuses a folder holding another run's
parts. What each writer stores and how it names a mismatch stays with the writer.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Callable

from st5_jax import paths


def sha256(data: bytes | memoryview) -> str:
  return hashlib.sha256(data).hexdigest()


def dumps(obj: Any, *, ensure_ascii: bool = True) -> bytes:
  """Indented, key-sorted JSON with a final newline: the bytes of every part JSON and manifest."""
  return (json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=ensure_ascii) + "\n").encode()


def read_json(path: str) -> dict | None:
  """The JSON at path, or None when it is missing or not (yet) whole JSON."""
  try:
    return json.loads(paths.read_text(path))
  except (FileNotFoundError, ValueError):
    return None


def part_name(s: int, prefix: str = "part") -> str:
  return f"{prefix}-{s:05d}"


def part_finished(out: str, s: int, *, data_suffix: str, matches: Callable[[dict], bool],
                  what: str = "data") -> tuple[bool, str]:
  """(True, "") when part s of `out` is complete and `matches(its JSON)`; else (False, why).

  Complete: PART.json exists and parses, PART<data_suffix> is readable and its sha256 is the JSON's.
  """
  meta = read_json(paths.join(out, part_name(s) + ".json"))
  if meta is None:
    return False, "no part JSON"
  if not matches(meta):
    return False, "its JSON does not match"
  try:
    data = paths.read_bytes(paths.join(out, part_name(s) + data_suffix))
  except (FileNotFoundError, OSError) as e:
    return False, f"unreadable ({type(e).__name__})"
  if sha256(data) != meta.get("sha256"):
    return False, f"its {what} differ from its JSON"
  return True, ""


def folder_records(out: str, manifest: str, pattern: str = "part-*.json") -> list[tuple[str, dict]]:
  """(file name, JSON) of out's manifest and of every part JSON that parses: what a rerun must agree with."""
  found = []
  if paths.exists(paths.join(out, manifest)):
    meta = read_json(paths.join(out, manifest))
    if meta:
      found.append((manifest, meta))
  for f in paths.glob(paths.join(out, pattern)):
    meta = read_json(f)
    if meta:
      found.append((os.path.basename(f), meta))
  return found
