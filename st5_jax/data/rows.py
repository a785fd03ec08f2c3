"""Rows of text from TSV, CSV, JSON-lines and TFRecord files, with bad rows counted.

Every reader yields plain Python dicts of stripped, non-empty strings. A row that
cannot be used (wrong number of fields, empty text, bytes that are not UTF-8, a label
outside its range, invalid JSON, a corrupt record) is skipped and recorded in a
`RowStats` as `file:line: reason`; with `strict=True` the first one raises
`BadRowError` instead. A missing or empty input file always raises `InputFileError`
naming it, because that is a configuration mistake rather than a bad row.

Files are local paths or gs:// URLs, read through st5_jax.paths (TFRecord framing is
parsed here, so remote TFRecords need no TensorFlow filesystem); TensorFlow is only
imported to parse tf.train.Example records.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import json
import logging
import re
import struct
from typing import Any, Iterable, Iterator, Mapping, Sequence

import google_crc32c

from st5_jax import paths
# Defined on the ground floor (evaluation readers raise them too); re-exported here for the data modules.
from st5_jax.errors import BadRowError, InputFileError

logger = logging.getLogger("st5_jax.data")

FORMATS = ("tsv", "csv", "jsonl", "tfrecord")
_EXTENSIONS = {
    ".tsv": "tsv", ".txt": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl",
    ".tfrecord": "tfrecord", ".tfrecords": "tfrecord", ".tfr": "tfrecord",
}
# Lone surrogates are what `surrogateescape` turns undecodable bytes into.
_SURROGATE = re.compile("[\udc80-\udcff]")
_BOM = "\ufeff"
# A TFRecord claiming more than this is corrupt (protects memory from a bad length).
MAX_RECORD_BYTES = 1 << 30


@dataclasses.dataclass
class RowStats:
  """Counts of rows read and skipped, with the first few skipped rows for the log.

  Counting is per distinct row: re-reading a file in a later epoch does not count
  its rows again (rows are identified by file and line, and files are always read
  front to back).
  """
  max_reported: int = 5
  rows_read: int = 0
  rows_skipped: int = 0
  rows_filtered: int = 0
  skipped_by_reason: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  filtered_by_reason: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  first_skipped: list = dataclasses.field(default_factory=list)
  _counted_upto: dict = dataclasses.field(default_factory=dict)
  _logged: int = 0
  _said_more: bool = False

  def is_new(self, path: str, line: int) -> bool:
    """True the first time row `line` of `path` is seen; marks it seen."""
    if line <= self._counted_upto.get(path, 0):
      return False
    self._counted_upto[path] = line
    return True

  def skip(self, where: str, reason: str, *, kind: str | None = None) -> None:
    self.rows_skipped += 1
    self.skipped_by_reason[kind or reason] += 1
    if len(self.first_skipped) < self.max_reported:
      self.first_skipped.append(f"{where}: {reason}")

  def log_new(self, prefix: str = "") -> None:
    """Logs reports not logged yet.

    Call from the consuming thread only: readers run inside tf.data threads, where
    taking the logging locks can deadlock with garbage-collected tf.data iterators.
    """
    for line in self.first_skipped[self._logged:]:
      logger.warning("%sskipped bad row %s", prefix, line)
    self._logged = len(self.first_skipped)
    if self.rows_skipped > self._logged == self.max_reported and not self._said_more:
      logger.warning("%smore bad rows are skipped and counted; see the iterator's stats", prefix)
      self._said_more = True

  def filter(self, kind: str) -> None:
    """A valid row that is not an example (e.g. a negative label); not an error."""
    self.rows_filtered += 1
    self.filtered_by_reason[kind] += 1

  def merge(self, other: "RowStats") -> None:
    self.rows_read += other.rows_read
    self.rows_skipped += other.rows_skipped
    self.rows_filtered += other.rows_filtered
    self.skipped_by_reason.update(other.skipped_by_reason)
    self.filtered_by_reason.update(other.filtered_by_reason)
    room = self.max_reported - len(self.first_skipped)
    self.first_skipped.extend(other.first_skipped[:max(room, 0)])

  def as_dict(self) -> dict[str, Any]:
    return {
        "rows_read": self.rows_read,
        "rows_skipped": self.rows_skipped,
        "rows_filtered": self.rows_filtered,
        "skipped_by_reason": dict(self.skipped_by_reason),
        "filtered_by_reason": dict(self.filtered_by_reason),
        "first_skipped": list(self.first_skipped),
    }


@dataclasses.dataclass(frozen=True)
class RowFormat:
  """How to turn one file row into an example.

  Attributes:
    format: one of FORMATS.
    columns: feature name -> column (header name or 0-based index for TSV/CSV,
      key for JSON lines, feature name for tf.Example).
    header: TSV/CSV only; None means "has a header iff some column is a name".
    num_fields: TSV/CSV without header: the expected field count (default: the
      field count of the file's first row).
    label_column: optional column holding a label.
    label_values: labels that are valid; any other value is a bad row.
    keep_labels: labels whose rows are examples; other valid labels are filtered
      out (counted, not reported as errors). None keeps every valid label.
    delimiter: CSV only.
  """
  format: str
  columns: Mapping[str, str | int]
  header: bool | None = None
  num_fields: int | None = None
  label_column: str | int | None = None
  label_values: tuple[str, ...] | None = None
  keep_labels: tuple[str, ...] | None = None
  delimiter: str = ","

  def __post_init__(self):
    if self.format not in FORMATS:
      raise ValueError(f"format must be one of {FORMATS}, got {self.format!r}")
    if not self.columns:
      raise ValueError("columns must map at least one feature to a column")

  @property
  def has_header(self) -> bool:
    if self.format not in ("tsv", "csv"):
      return False
    if self.header is not None:
      return self.header
    cols = list(self.columns.values()) + ([self.label_column] if self.label_column is not None else [])
    return any(isinstance(c, str) for c in cols)


def infer_format(path: str) -> str:
  """Format from a file name: .tsv/.txt, .csv, .jsonl/.json, .tfrecord*."""
  name = path.split("?")[0]
  if name.endswith(".gz"):
    name = name[:-3]
  for ext, fmt in _EXTENSIONS.items():
    if name.endswith(ext) or f"{ext}-" in name:  # e.g. data.tfrecord-00001-of-00010
      return fmt
  raise ValueError(f"Cannot infer the format of {path}; pass format= one of {FORMATS}.")


def open_binary(path: str):
  return paths.open_file(path, "rb")


def file_size(path: str) -> int:
  return paths.size(path)


def list_files(patterns: str | Sequence[str]) -> list[str]:
  """Expands globs (local or gs://), sorted; a pattern matching nothing or an empty file is an error."""
  if isinstance(patterns, str):
    patterns = [p for p in patterns.split(",") if p]
  files = []
  for pattern in patterns:
    matched = paths.glob(pattern)
    if not matched:
      raise InputFileError(f"Input file {pattern} does not exist (no file matches this pattern).")
    files.extend(m for m in matched if not paths.is_dir(m))
  files = sorted(set(files))
  for path in files:
    if file_size(path) == 0:
      raise InputFileError(f"Input file {path} is empty.")
  return files


# ----------------------------------------------------------------------------
# Raw records: (line, fields) or (line, error). Lines are 1-based; for TFRecords
# "line" is the record number.


def _decode_line(raw: bytes, first: bool) -> str:
  text = raw.decode("utf-8")
  if first and text.startswith(_BOM):
    text = text[1:]
  return text.rstrip("\r\n")


def iter_tsv_records(path: str) -> Iterator[tuple[int, list[str] | str]]:
  """Tab-separated lines, no quoting (GLUE/SentEval style)."""
  with open_binary(path) as f:
    for line, raw in enumerate(f, 1):
      try:
        text = _decode_line(raw, line == 1)
      except UnicodeDecodeError as e:
        yield line, f"undecodable bytes (not UTF-8) at byte {e.start}"
        continue
      yield line, text.split("\t")


def iter_lines(path: str) -> Iterator[tuple[int, str | None, str | None]]:
  """(line, text, error) for each line of a UTF-8 text file."""
  with open_binary(path) as f:
    for line, raw in enumerate(f, 1):
      try:
        yield line, _decode_line(raw, line == 1), None
      except UnicodeDecodeError as e:
        yield line, None, f"undecodable bytes (not UTF-8) at byte {e.start}"


def iter_csv_records(path: str, *, delimiter: str = ",") -> Iterator[tuple[int, list[str] | str]]:
  """RFC-4180 CSV records (quoted fields may span lines); the line is where a record starts."""
  with open_binary(path) as fb:
    # Lines keep their line ends, so quoted fields spanning lines parse; undecodable
    # bytes become lone surrogates and are reported per record below.
    text = (raw.decode("utf-8", "surrogateescape") for raw in fb)
    reader = csv.reader(text, delimiter=delimiter)
    start = 1
    first = True
    while True:
      try:
        fields = next(reader)
      except StopIteration:
        return
      except csv.Error as e:
        yield start, f"malformed CSV ({e})"
        start = reader.line_num + 1
        continue
      line, start = start, reader.line_num + 1
      if first and fields and fields[0].startswith(_BOM):
        fields[0] = fields[0][1:]
      first = False
      bad = next((i for i, v in enumerate(fields) if _SURROGATE.search(v)), None)
      if bad is not None:
        yield line, f"undecodable bytes (not UTF-8) in field {bad}"
        continue
      yield line, fields


def iter_jsonl_records(path: str) -> Iterator[tuple[int, dict | str]]:
  for line, text, error in iter_lines(path):
    if error:
      yield line, error
      continue
    if not text.strip():
      yield line, "blank line"
      continue
    try:
      obj = json.loads(text)
    except json.JSONDecodeError as e:
      yield line, f"invalid JSON ({e.msg} at column {e.colno})"
      continue
    if not isinstance(obj, dict):
      yield line, "not a JSON object"
      continue
    yield line, obj


def _masked_crc(data: bytes) -> int:
  crc = google_crc32c.value(data)
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def iter_tfrecord_payloads(f) -> Iterator[bytes | str]:
  """Record payloads of a TFRecord stream, checksums verified; a str is the error that ends it.

  TFRecord framing: uint64 length, uint32 masked crc32c(length), data, uint32 masked
  crc32c(data), little-endian. Parsed here so remote files need no TF filesystem.
  """
  while True:
    header = f.read(12)
    if not header:
      return
    if len(header) < 12:
      yield "truncated record header"
      return
    length, length_crc = struct.unpack("<QI", header)
    if _masked_crc(header[:8]) != length_crc:
      yield "corrupt record length (checksum mismatch)"
      return
    if length > MAX_RECORD_BYTES:
      yield f"record of {length} bytes exceeds the {MAX_RECORD_BYTES}-byte limit"
      return
    data = f.read(length)
    footer = f.read(4)
    if len(data) < length or len(footer) < 4:
      yield "truncated record"
      return
    if _masked_crc(data) != struct.unpack("<I", footer)[0]:
      yield "corrupt record data (checksum mismatch)"
      return
    yield data


def iter_tfrecord_records(path: str, feature_names: Iterable[str]) -> Iterator[tuple[int, dict | str]]:
  """tf.Example records; a corrupt record ends the file (TFRecords cannot resync)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top  (tf.train.Example only)
  names = list(feature_names)
  with open_binary(path) as f:
    for line, serialized in enumerate(iter_tfrecord_payloads(f), start=1):
      if isinstance(serialized, str):
        yield line, f"{serialized}, rest of file skipped"
        return
      try:
        example = tf.train.Example.FromString(serialized)
      except Exception:  # pylint: disable=broad-except
        yield line, "record is not a tf.train.Example"
        continue
      out = {}
      for name in names:
        feature = example.features.feature.get(name)
        if feature is None or not feature.bytes_list.value:
          continue
        value = feature.bytes_list.value[0]
        try:
          out[name] = value.decode("utf-8")
        except UnicodeDecodeError as e:
          out = f"undecodable bytes (not UTF-8) in feature '{name}' at byte {e.start}"
          break
      yield line, out


# ----------------------------------------------------------------------------


def clean_text(text: Any) -> str:
  """Strips surrounding whitespace; non-strings become ''."""
  return text.strip() if isinstance(text, str) else ""


HARD_NEGATIVE_KEYS = ("query", "pos", "neg")  # FlagEmbedding's and Tevatron's training JSON lines


def _text_list(record: dict, key: str) -> list[str] | str:
  """The non-empty stripped strings of a JSON list field, or a reason."""
  if key not in record:
    return f"missing field {key!r}"
  value = record[key]
  if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
    return f"field {key!r} is not a list of strings"
  return [t for t in map(clean_text, value) if t]


def hard_negative_values(record: dict, keys: Sequence[str] = HARD_NEGATIVE_KEYS, *,
                         need_negatives: bool = True) -> tuple[str, list[str], list[str]] | str:
  """(query, positives, negatives) of a `{query, pos: [...], neg: [...]}` JSON object, or a reason.

  Empty strings in the lists are dropped. A row without a usable positive is bad; a row whose
  negatives are all gone is returned with an empty list (the caller decides). With
  `need_negatives=False` (the pairs `st5 data mine` reads) `neg` is not read and `pos` may
  also be a single string.
  """
  query_key, pos_key, neg_key = keys
  if query_key not in record:
    return f"missing field {query_key!r}"
  if not isinstance(record[query_key], str):
    return f"field {query_key!r} is not a string"
  query = clean_text(record[query_key])
  if not query:
    return f"empty text in field {query_key!r}"
  if isinstance(record.get(pos_key), str) and not need_negatives:
    positives = [t for t in [clean_text(record[pos_key])] if t]
  else:
    positives = _text_list(record, pos_key)
    if isinstance(positives, str):
      return positives
  if not positives:
    return f"no positive in field {pos_key!r}"
  negatives = _text_list(record, neg_key) if need_negatives else []
  if isinstance(negatives, str):
    return negatives
  return query, positives, negatives


class RowReader:
  """Reads examples from files of one format, sharded and with bad rows counted."""

  def __init__(self, file_patterns: str | Sequence[str], row_format: RowFormat, *, strict: bool = False,
               name: str = ""):
    self.file_patterns = file_patterns
    self.row_format = row_format
    self.strict = strict
    self.name = name
    self._files: list[str] | None = None

  def files(self) -> list[str]:
    if self._files is None:
      self._files = list_files(self.file_patterns)
    return self._files

  @property
  def features(self) -> tuple[str, ...]:
    return tuple(self.row_format.columns)

  def _bad(self, stats: RowStats, where: str, reason: str, kind: str | None = None) -> None:
    if self.strict:
      raise BadRowError(f"{where}: {reason} (strict mode; set strict=False to skip and count bad rows)")
    stats.skip(where, reason, kind=kind)

  def iter_examples(self, *, shard_index: int = 0, num_shards: int = 1, file_order: Sequence[int] | None = None,
                    stats: RowStats | None = None) -> Iterator[dict[str, str]]:
    """Yields examples of this shard.

    With at least `num_shards` files each shard reads whole files (files[i::n]);
    otherwise every shard reads every file and keeps records i with i % n == shard.
    `file_order` permutes this shard's files (for shuffling between epochs).
    """
    stats = stats if stats is not None else RowStats()
    files = self.files()
    if len(files) >= num_shards:
      mine = files[shard_index::num_shards]
      record_shard = None
    else:
      mine = files
      record_shard = (shard_index, num_shards)
    if file_order is not None:
      mine = [mine[i] for i in file_order]
    record_index = -1
    for path in mine:
      for line, record in self._records(path):
        record_index += 1
        if record_shard and record_index % record_shard[1] != record_shard[0]:
          continue
        example = self._to_example(path, line, record, stats)
        if example is not None:
          yield example

  def num_files(self) -> int:
    return len(self.files())

  def _records(self, path: str) -> Iterator[tuple[int, Any]]:
    fmt = self.row_format
    if fmt.format == "tsv":
      records = iter_tsv_records(path)
    elif fmt.format == "csv":
      records = iter_csv_records(path, delimiter=fmt.delimiter)
    elif fmt.format == "jsonl":
      records = iter_jsonl_records(path)
    else:
      names = list(fmt.columns.values()) + ([fmt.label_column] if fmt.label_column is not None else [])
      records = iter_tfrecord_records(path, names)
    if not fmt.has_header:
      yield from records
      return
    header = None
    for line, record in records:
      if header is None:
        if isinstance(record, str):
          raise InputFileError(f"{path}:{line}: cannot read the header row ({record}).")
        header = [h.strip() for h in record]
        missing = [c for c in self._named_columns() if c not in header]
        if missing:
          raise InputFileError(f"{path}:{line}: header {header} lacks column(s) {missing}.")
        self._header_index = {h: i for i, h in enumerate(header)}
        self._num_header_fields = len(header)
        continue
      yield line, record
    if header is None:
      raise InputFileError(f"Input file {path} has no rows (not even a header).")

  def _named_columns(self) -> list[str]:
    fmt = self.row_format
    cols = list(fmt.columns.values()) + ([fmt.label_column] if fmt.label_column is not None else [])
    return [c for c in cols if isinstance(c, str)]

  def _to_example(self, path: str, line: int, record: Any, stats: RowStats) -> dict[str, str] | None:
    """Validates one record; returns the example or None (skipped/filtered)."""
    if not stats.is_new(path, line):
      return self._to_example_quiet(record)
    stats.rows_read += 1
    where = f"{path}:{line}"
    if isinstance(record, str):
      self._bad(stats, where, record, kind=record.split(" (")[0])
      return None
    fmt = self.row_format
    values = self._values(record)
    if isinstance(values, str):
      self._bad(stats, where, values, kind=values.split(" (")[0].split(":")[0])
      return None
    if fmt.label_column is not None:
      label = values.pop("__label__")
      if fmt.label_values is not None and label not in fmt.label_values:
        self._bad(stats, where, f"label {label!r} outside {sorted(fmt.label_values)}", kind="label out of range")
        return None
      if fmt.keep_labels is not None and label not in fmt.keep_labels:
        stats.filter(f"label {label}")
        return None
    for feature, text in values.items():
      if not text:
        self._bad(stats, where, f"empty text in column {fmt.columns[feature]!r}", kind="empty text")
        return None
    return values

  def _to_example_quiet(self, record: Any) -> dict[str, str] | None:
    # A row already counted in an earlier pass: same decision, no second count.
    if isinstance(record, str):
      return None
    values = self._values(record)
    if isinstance(values, str):
      return None
    fmt = self.row_format
    if fmt.label_column is not None:
      label = values.pop("__label__")
      if (fmt.label_values is not None and label not in fmt.label_values) or (
          fmt.keep_labels is not None and label not in fmt.keep_labels):
        return None
    if not all(values.values()):
      return None
    return values

  def _values(self, record: Any) -> dict[str, str] | str:
    """Column values of a parsed record, or a reason string."""
    fmt = self.row_format
    wanted = dict(fmt.columns)
    if fmt.label_column is not None:
      wanted["__label__"] = fmt.label_column
    if fmt.format in ("tsv", "csv"):
      fields = record
      if fmt.has_header:
        expected = self._num_header_fields
      else:
        expected = fmt.num_fields or getattr(self, "_first_num_fields", None)
        if expected is None:
          expected = self._first_num_fields = len(fields)
      if len(fields) != expected:
        return f"wrong number of fields: {len(fields)}, expected {expected}"
      out = {}
      for feature, col in wanted.items():
        index = self._header_index[col] if isinstance(col, str) else col
        if index >= len(fields):
          return f"wrong number of fields: {len(fields)}, column {col} missing"
        out[feature] = clean_text(fields[index])
      return out
    out = {}
    for feature, key in wanted.items():
      if key not in record:
        return f"missing field {key!r}"
      value = record[key]
      if isinstance(value, (int, float)) and not isinstance(value, bool) and feature == "__label__":
        value = str(value)
      if not isinstance(value, str):
        return f"field {key!r} is not a string"
      out[feature] = clean_text(value)
    return out
