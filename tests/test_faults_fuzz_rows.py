"""Faults: fuzzed user files (TSV/CSV/JSONL/TFRecord) never crash the row reader; every row is
accounted for (read = examples + filtered + skipped) and bad rows are reported as file:line: reason."""

import json
import re
import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from st5_jax.data import rows
from tensorflow.core.example import example_pb2, feature_pb2  # noqa: E402  (imported here: not in a strategy)

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# Pieces of lines: valid rows, the usual suspects, and arbitrary text and bytes.
_GOOD_TSV_ROWS = (b"a b\tc d\t1", b"x\ty\t0", b"\xc3\xa9t\xc3\xa9\tsummer\t1")
_GOOD_JSONL_ROWS = (b'{"q": "a", "p": "b", "l": 1}', b'{"q": "x", "p": "y", "l": "0"}')
_GOOD_TSV = st.sampled_from(_GOOD_TSV_ROWS)
_GOOD_JSONL = st.sampled_from(_GOOD_JSONL_ROWS)
_NASTY = st.sampled_from([b"", b"\x00\x00", b"\xef\xbb\xbf", b"\xff\xfe", b"\r", b"\t\t\t\t", b'"', b'"a,"b"',
                          b'{"q": ', b"[1, 2]", b"null", b'{"q": 1, "p": "b", "l": 1}', b"\xe9t\xe9",
                          b"a\tb", b"a\tb\tc\td\te", b"x" * 100_000, b'"unterminated\n,quote'])
_TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=40).map(lambda s: s.encode("utf-8", "surrogatepass"))
_LINE = st.one_of(_NASTY, _TEXT, st.binary(max_size=40))


def _lines(good):
  return st.lists(st.one_of(good, good, _LINE), min_size=0, max_size=25)


def _join(lines, crlf, bom):
  data = (b"\r\n" if crlf else b"\n").join(lines)
  return (b"\xef\xbb\xbf" if bom else b"") + data


def _read(path, row_format):
  reader = rows.RowReader(str(path), row_format)
  stats = rows.RowStats()
  try:
    examples = list(reader.iter_examples(stats=stats))
  except rows.InputFileError as e:  # a clear file-level error (e.g. no rows, bad header) is allowed
    assert str(path) in str(e)
    return None, stats
  assert stats.rows_read == len(examples) + stats.rows_filtered + stats.rows_skipped, stats.as_dict()
  for report in stats.first_skipped:
    assert re.match(rf"{re.escape(str(path))}:\d+: \S", report), report
  assert len(stats.first_skipped) == min(stats.rows_skipped, stats.max_reported)
  for ex in examples:
    assert all(isinstance(v, str) and v for v in ex.values())
  return examples, stats


def _physical_lines(data):
  return len(data.split(b"\n")) - (1 if data.endswith(b"\n") or not data else 0)


@SETTINGS
@given(lines=_lines(_GOOD_TSV), crlf=st.booleans(), bom=st.booleans())
def test_tsv(tmp_path_factory, lines, crlf, bom):
  path = tmp_path_factory.mktemp("tsv") / "pairs.tsv"
  data = _join(lines, crlf, bom)
  path.write_bytes(data)
  fmt = rows.RowFormat("tsv", {"left": 0, "right": 1}, num_fields=3, label_column=2, label_values=("0", "1"),
                       keep_labels=("1",))
  examples, stats = _read(path, fmt)
  assert stats.rows_read == _physical_lines(data)  # one row per line, none lost or doubled
  # And the clean lines parse: each "a\tb\t1" line is an example (TSV has no quoting, so a
  # neighbouring bad line cannot swallow it); the others may only add examples.
  clean = [line.decode("utf-8").split("\t")[:2] for line in lines if line in _GOOD_TSV_ROWS and line.endswith(b"\t1")]
  got = [[ex["left"], ex["right"]] for ex in examples or []]
  assert _is_subsequence(clean, got), (clean, got)


@SETTINGS
@given(lines=_lines(_GOOD_TSV.map(lambda b: b.replace(b"\t", b","))), crlf=st.booleans(), bom=st.booleans(),
       header=st.booleans())
def test_csv(tmp_path_factory, lines, crlf, bom, header):
  path = tmp_path_factory.mktemp("csv") / "pairs.csv"
  if header:
    path.write_bytes(_join([b"q,p,l", *lines], crlf, bom))
    fmt = rows.RowFormat("csv", {"left": "q", "right": "p"}, label_column="l", label_values=("0", "1"))
  else:
    path.write_bytes(_join(lines, crlf, bom))
    fmt = rows.RowFormat("csv", {"left": 0, "right": 1}, num_fields=3)
  _read(path, fmt)


@SETTINGS
@given(lines=_lines(_GOOD_JSONL), crlf=st.booleans(), bom=st.booleans())
def test_jsonl(tmp_path_factory, lines, crlf, bom):
  path = tmp_path_factory.mktemp("jsonl") / "pairs.jsonl"
  data = _join(lines, crlf, bom)
  path.write_bytes(data)
  fmt = rows.RowFormat("jsonl", {"left": "q", "right": "p"}, label_column="l", label_values=("0", "1"))
  examples, stats = _read(path, fmt)
  assert stats.rows_read == _physical_lines(data)
  clean = [[json.loads(line)["q"], json.loads(line)["p"]] for line in lines if line in _GOOD_JSONL_ROWS]
  got = [[ex["left"], ex["right"]] for ex in examples or []]
  assert _is_subsequence(clean, got), (clean, got)


def _frame(payload):
  length = struct.pack("<Q", len(payload))
  return (length + struct.pack("<I", rows._masked_crc(length)) + payload
          + struct.pack("<I", rows._masked_crc(payload)))


def _example(q, p):
  feats = {k: feature_pb2.Feature(bytes_list=feature_pb2.BytesList(value=[v])) for k, v in (("q", q), ("p", p))}
  return example_pb2.Example(features=feature_pb2.Features(feature=feats)).SerializeToString()


_WORD = st.text(alphabet="abcxyz019", min_size=1, max_size=8).map(str.encode)
_RECORD = st.one_of(st.tuples(st.binary(max_size=12), st.binary(max_size=12)).map(lambda qp: _example(*qp)),
                    st.tuples(_WORD, _WORD).map(lambda qp: _example(*qp)),  # clean: must be read
                    st.binary(max_size=30))


@SETTINGS
@given(records=st.lists(_RECORD, max_size=12), cut=st.one_of(st.just(0), st.integers(0, 10_000)),
       flip=st.one_of(st.just(-1), st.integers(0, 10_000)))
def test_tfrecord(tmp_path_factory, records, cut, flip):
  path = tmp_path_factory.mktemp("tfr") / "pairs.tfrecord"
  data = bytearray(b"".join(_frame(r) for r in records))
  intact = flip < 0 and cut % (len(data) + 1) == 0
  if data and 0 <= flip:
    data[flip % len(data)] ^= 0x5A
  if data:
    data = data[:len(data) - cut % (len(data) + 1)]
  path.write_bytes(bytes(data))
  examples, stats = _read(path, rows.RowFormat("tfrecord", {"left": "q", "right": "p"}))
  assert stats.rows_read <= len(records) + 1
  if intact:
    # Untouched framing: every record that is an example of two plain ASCII texts is read, in order.
    want = []
    for r in records:
      try:
        f = example_pb2.Example.FromString(r).features.feature
      except Exception:  # noqa: BLE001  (random bytes)
        continue
      texts = [f[k].bytes_list.value[0] if k in f and f[k].bytes_list.value else b"" for k in ("q", "p")]
      if all(t.isascii() and t.isalnum() for t in texts):
        want.append([t.decode() for t in texts])
    got = [[ex["left"], ex["right"]] for ex in examples or []]
    assert _is_subsequence(want, got), (want, got)


def test_clean_files_parse_in_every_format(tmp_path):
  """No noise: every row of every format is an example with the expected texts (so a reader that
  rejected everything could not pass the fuzzed tests above)."""
  want = [["a b", "c d"], ["été", "summer"]]
  (tmp_path / "p.tsv").write_bytes(b"a b\tc d\t1\n\xc3\xa9t\xc3\xa9\tsummer\t1\n")
  (tmp_path / "p.jsonl").write_text("\n".join(json.dumps({"q": q, "p": p, "l": 1}) for q, p in want) + "\n")
  (tmp_path / "p.tfrecord").write_bytes(b"".join(_frame(_example(q.encode(), p.encode())) for q, p in want))
  (tmp_path / "p.csv").write_text('q,p,l\n"a b","c d",1\nété,summer,0\n', encoding="utf-8")
  fmts = {"p.tsv": rows.RowFormat("tsv", {"left": 0, "right": 1}, num_fields=3, label_column=2,
                                  label_values=("0", "1"), keep_labels=("1",)),
          "p.jsonl": rows.RowFormat("jsonl", {"left": "q", "right": "p"}, label_column="l", label_values=("0", "1")),
          "p.tfrecord": rows.RowFormat("tfrecord", {"left": "q", "right": "p"}),
          "p.csv": rows.RowFormat("csv", {"left": "q", "right": "p"}, label_column="l", label_values=("0", "1"))}
  for name, fmt in fmts.items():
    examples, stats = _read(tmp_path / name, fmt)
    assert [[ex["left"], ex["right"]] for ex in examples] == want, name
    assert (stats.rows_read, stats.rows_skipped) == (2, 0), name


def _is_subsequence(small, big):
  it = iter(big)
  return all(any(x == y for y in it) for x in small)
