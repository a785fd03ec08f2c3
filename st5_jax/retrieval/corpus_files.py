"""Reading corpus and query files for `st5 index` / `st5 search`: ids and texts, streamed, local or gs://.

Formats (told by the extension, else by the first non-blank line):

  jsonl   .jsonl / .json: one JSON object a line. BEIR's corpus.jsonl (`_id`, `title`, `text`) and queries.jsonl
          (`_id`, `text`), or `id` / `text`. A `title` is joined as BEIR and sentence-transformers do:
          `(title + " " + text).strip()` when the row has a title key, else `text.strip()`.
  tsv     .tsv: `id<TAB>text` (MS MARCO's collection.tsv and queries.*.tsv). A first line whose first column is
          an id column name (id, _id, docid, doc_id, pid, qid, query_id, query-id, corpus-id) is a header, and
          then its columns are found by name: id, text (or passage / query / sentence), optional title (DPR's
          psgs_w100.tsv: `id  text  title`).
  text    .txt and anything else whose first line is neither: one document a line, its id the line number
          counted from 0.

A `.gz` suffix is decompressed (the format is that of the name without it). Lines end at "\\n" only (as
`wc -l` and trec_eval count); a trailing "\\r" is dropped. Blank lines are skipped in every format (plain text
keeps counting them, so ids stay line numbers). Ids must be non-empty and hold no whitespace (TREC run files
are whitespace-separated) and be unique over all the files. A bad row is one line: `file:line: what is wrong;
what to do` (BadRowError, exit 2 from the CLI).

The corpus is streamed twice by `st5 index`: `scan` reads every row once (validation, counts, a fingerprint of
the content, so a bad row stops every process before any encoding) and `iter_shards` reads again, parsing only
the rows of the shards asked for; no pass holds the corpus in memory.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
from typing import Iterable, Iterator, Sequence

import numpy as np

from st5_jax import paths
from st5_jax.errors import BadRowError, InputFileError

FORMATS = ("jsonl", "tsv", "text")
ID_COLUMNS = ("id", "_id", "docid", "doc_id", "pid", "qid", "query_id", "query-id", "corpus-id")
TEXT_COLUMNS = ("text", "passage", "query", "sentence")
_EXTENSIONS = {".jsonl": "jsonl", ".json": "jsonl", ".tsv": "tsv", ".txt": "text"}


def expand(values: str | Sequence[str]) -> list[str]:
  """Files from repeated and/or comma-separated flags, globs expanded (sorted); a BEIR folder is its corpus.jsonl."""
  items = [values] if isinstance(values, str) else list(values)
  out = []
  for item in items:
    for part in (p.strip() for p in item.split(",")):
      if not part:
        continue
      if any(c in part for c in "*?["):
        matches = paths.glob(part)
        if not matches:
          raise InputFileError(f"{part}: no file matches this pattern")
        out.extend(matches)
      else:
        out.append(part)
  if not out:
    raise InputFileError("no corpus or query file given")
  return out


def _resolve(path: str, folder_file: str) -> str:
  path = os.fspath(paths.path(path))  # absolute when local
  if paths.is_dir(path):
    inner = paths.join(path, folder_file)
    if paths.is_file(inner):
      return inner
    raise InputFileError(f"{path} is a folder without {folder_file}; pass the file itself")
  if not paths.exists(path):
    raise InputFileError(f"{path} does not exist")
  return path


def _lines(path: str) -> Iterator[tuple[int, bytes]]:
  """(1-based line number, raw line without its "\\n"), every line of the file."""
  with paths.open_file(path, "rb") as raw:
    f = gzip.GzipFile(fileobj=raw) if path.endswith(".gz") else raw
    for number, line in enumerate(f, 1):
      yield number, line[:-1] if line.endswith(b"\n") else line


def _decode(path: str, number: int, line: bytes) -> str:
  try:
    text = line.decode("utf-8")
  except UnicodeDecodeError as e:
    raise BadRowError(f"{path}:{number}: not UTF-8 ({e.reason} at byte {e.start}); re-encode the file as UTF-8") \
        from None
  if number == 1:
    text = text.lstrip("\ufeff")  # a byte-order mark
  return text[:-1] if text.endswith("\r") else text


def detect_format(path: str) -> str:
  """jsonl, tsv or text: by extension (.gz stripped), else by the first non-blank line."""
  name = path[:-3] if path.endswith(".gz") else path
  ext = os.path.splitext(name)[1].lower()
  if ext in _EXTENSIONS:
    return _EXTENSIONS[ext]
  for number, line in _lines(path):
    text = _decode(path, number, line).strip()
    if not text:
      continue
    if text.startswith("{"):
      try:
        if isinstance(json.loads(text), dict):
          return "jsonl"
      except json.JSONDecodeError:
        pass
    return "tsv" if "\t" in text else "text"
  return "text"


@dataclasses.dataclass(frozen=True)
class _Layout:
  """How a file's rows are read: its format and, for TSV, the columns (header or not)."""

  fmt: str
  header_line: int = 0  # the TSV header's line number (0: none)
  id_col: int = 0
  text_col: int = 1
  title_col: int | None = None
  columns: int = 2


def _layout(path: str, fmt: str | None) -> _Layout:
  fmt = fmt or detect_format(path)
  if fmt not in FORMATS:
    raise ValueError(f"{path}: unknown corpus format {fmt!r}; known: {', '.join(FORMATS)}")
  if fmt != "tsv":
    return _Layout(fmt)
  for number, line in _lines(path):
    text = _decode(path, number, line)
    if not text.strip():
      continue
    cols = [c.strip().lower() for c in text.split("\t")]
    if cols[0] not in ID_COLUMNS:
      return _Layout(fmt)
    text_col = next((i for i, c in enumerate(cols) if c in TEXT_COLUMNS), None)
    if text_col is None:
      raise BadRowError(f"{path}:{number}: a header without a text column (one of {', '.join(TEXT_COLUMNS)}); "
                        "name it, or drop the header for plain id<TAB>text rows")
    title_col = cols.index("title") if "title" in cols else None
    return _Layout(fmt, header_line=number, id_col=0, text_col=text_col, title_col=title_col, columns=len(cols))
  return _Layout(fmt)


def _check_id(path: str, number: int, doc_id: str) -> str:
  if not doc_id:
    raise BadRowError(f"{path}:{number}: empty id; every row needs an id")
  if any(c.isspace() for c in doc_id):
    raise BadRowError(f"{path}:{number}: id {doc_id!r} holds whitespace, which TREC run files cannot carry; "
                      "replace it (e.g. with '_')")
  return doc_id


def _parse(path: str, number: int, text: str, layout: _Layout) -> tuple[str, str]:
  """(id, text) of one non-blank, non-header line."""
  if layout.fmt == "text":
    return str(number - 1), text.strip()
  if layout.fmt == "tsv":
    cols = text.split("\t")
    if len(cols) != layout.columns:
      want = "the header's" if layout.header_line else "id<TAB>text:"
      raise BadRowError(f"{path}:{number}: {len(cols)} tab-separated columns, expected {want} {layout.columns}; "
                        "a tab inside a text must be escaped or replaced")
    body = cols[layout.text_col]
    if layout.title_col is not None:
      body = cols[layout.title_col] + " " + body
    return _check_id(path, number, cols[layout.id_col].strip()), body.strip()
  try:
    row = json.loads(text)
  except json.JSONDecodeError as e:
    raise BadRowError(f"{path}:{number}: not JSON ({e.msg} at column {e.colno}); one JSON object a line") from None
  if not isinstance(row, dict):
    raise BadRowError(f"{path}:{number}: a JSON {type(row).__name__}, expected an object with _id (or id) and text")
  key = "_id" if "_id" in row else "id"
  doc_id = row.get(key)
  if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)):
    raise BadRowError(f"{path}:{number}: {'no _id or id' if doc_id is None else f'{key} is not a string'}; "
                      "every row needs a string id (_id as BEIR writes it, or id)")
  body = row.get("text")
  if not isinstance(body, str):
    raise BadRowError(f"{path}:{number}: {'no text' if body is None else 'text is not a string'}; every row "
                      "needs a text (an empty string is allowed)")
  if "title" in row:
    title = row["title"]
    if title is not None and not isinstance(title, str):
      raise BadRowError(f"{path}:{number}: title is not a string")
    body = (title or "") + " " + body
  return _check_id(path, number, str(doc_id).strip()), body.strip()


def _rows(path: str, layout: _Layout) -> Iterator[tuple[int, str]]:
  """(line number, decoded line) of the file's data rows: blank lines and a TSV header left out."""
  for number, line in _lines(path):
    if number == layout.header_line:
      continue
    text = _decode(path, number, line)
    if text.strip():
      yield number, text


@dataclasses.dataclass(frozen=True)
class FileInfo:
  path: str
  format: str
  rows: int
  sha256: str  # of the (decompressed) content


@dataclasses.dataclass(frozen=True)
class CorpusScan:
  """What `scan` found: the files in order, the number of rows and a fingerprint of the content."""

  files: tuple[FileInfo, ...]
  layouts: tuple[_Layout, ...]

  @property
  def rows(self) -> int:
    return sum(f.rows for f in self.files)

  @property
  def fingerprint(self) -> str:
    """sha256 over each file's format and content hash, in order (not the paths: a moved corpus is the same)."""
    h = hashlib.sha256()
    for f in self.files:
      h.update(f"{f.format}:{f.sha256}\n".encode())
    return h.hexdigest()

  def to_json(self) -> dict:
    return {"files": [dataclasses.asdict(f) for f in self.files], "fingerprint": self.fingerprint,
            "documents": self.rows}


def _raise_duplicates(files: Sequence[str], layouts: Sequence[_Layout], hashes: np.ndarray) -> None:
  """Checks the ids whose hashes collide; raises on a real duplicate (a hash collision alone passes)."""
  uniq, counts = np.unique(hashes, return_counts=True)
  suspects = set(uniq[counts > 1].tolist())
  if not suspects:
    return
  seen: dict[str, str] = {}
  for path, layout in zip(files, layouts):
    for number, text in _rows(path, layout):
      doc_id, _ = _parse(path, number, text, layout)
      if hash(doc_id) in suspects:
        if doc_id in seen:
          raise BadRowError(f"{path}:{number}: duplicate id {doc_id!r} (first at {seen[doc_id]}); ids must be "
                            "unique over all the files")
        seen[doc_id] = f"{path}:{number}"


def scan(files: Iterable[str], *, folder_file: str = "corpus.jsonl", fmt: str | None = None) -> CorpusScan:
  """Reads every row once: validates it, counts rows, hashes the content, checks ids are unique."""
  files = [_resolve(f, folder_file) for f in files]
  layouts = [_layout(f, fmt) for f in files]
  infos, id_hashes = [], []
  for path, layout in zip(files, layouts):
    digest, rows = hashlib.sha256(), 0
    for number, line in _lines(path):
      digest.update(line + b"\n")
      if number == layout.header_line:
        continue
      text = _decode(path, number, line)
      if not text.strip():
        continue
      doc_id, _ = _parse(path, number, text, layout)
      id_hashes.append(hash(doc_id))
      rows += 1
    infos.append(FileInfo(path=path, format=layout.fmt, rows=rows, sha256=digest.hexdigest()))
  _raise_duplicates(files, layouts, np.asarray(id_hashes, np.int64))
  return CorpusScan(files=tuple(infos), layouts=tuple(layouts))


def iter_shards(corpus: CorpusScan, shard_size: int,
                wanted: Iterable[int]) -> Iterator[tuple[int, list[str], list[str]]]:
  """(shard, ids, texts) of the wanted shards, in order; rows of other shards are counted, not parsed."""
  wanted = sorted(set(wanted))
  if not wanted:
    return
  position, next_i = 0, 0
  ids: list[str] = []
  texts: list[str] = []
  for info, layout in zip(corpus.files, corpus.layouts):
    for number, text in _rows(info.path, layout):
      shard = position // shard_size
      position += 1
      if shard < wanted[next_i]:
        continue
      doc_id, body = _parse(info.path, number, text, layout)
      ids.append(doc_id)
      texts.append(body)
      if position % shard_size == 0 or position == corpus.rows:
        yield shard, ids, texts
        ids, texts = [], []
        next_i += 1
        if next_i == len(wanted):
          return


def read_all(files: Iterable[str], *, folder_file: str = "queries.jsonl",
             fmt: str | None = None) -> tuple[list[str], list[str]]:
  """(ids, texts) of every row of the files (queries: small enough for memory); validated as `scan` does."""
  files = [_resolve(f, folder_file) for f in files]
  ids, texts, where = [], [], {}
  for path in files:
    layout = _layout(path, fmt)
    for number, text in _rows(path, layout):
      row_id, body = _parse(path, number, text, layout)
      if row_id in where:
        raise BadRowError(f"{path}:{number}: duplicate id {row_id!r} (first at {where[row_id]}); ids must be "
                          "unique over all the files")
      where[row_id] = f"{path}:{number}"
      ids.append(row_id)
      texts.append(body)
  return ids, texts
