"""The Beam cache at scale without running it: the job graph's size at 2 x 10^4 files, byte ranges that read every
line once, and the shard count derived from the data and checked against a worker's memory."""

import hashlib
import json
import logging
import os

import pytest

from st5_jax.data import cache, registry, sources
from st5_jax.data.offline import beam_cache, cache_writer
from st5_jax.data.rows import RowFormat, RowReader, RowStats

# The pipeline proto (what a runner is sent) at 2,000 input files stays under this; Dataflow's job-graph limit
# is ~20 MB (apache/beam#14122). With a reader pickled into every element, the same 2,000 paths made a 55 MB
# Create (136 KB an element pickled, 273 MB in all, zlib-compressed in the proto), growing with the square of
# the files.
PROTO_BOUND_AT_2000 = 512 * 1024
UNIT_BOUND = 200  # pickled bytes of one read unit (a file index and its path), whatever the file count


def _plan(tmp_path, name):
  corpus = tmp_path / "corpus"
  corpus.mkdir()
  (corpus / "part-0.jsonl").write_text(json.dumps({"q": "a", "a": "b"}) + "\n")
  registry.register_user_task(name, file_pattern=f"{corpus}/part-*.jsonl", columns={"inputs": "q", "targets": "a"})
  return beam_cache.plan_cache(name, "train", str(tmp_path / "out"), 4, {"inputs": 64, "targets": 64},
                               decontaminate=False)


def test_job_graph_stays_small_and_linear_at_20000_files(tmp_path, data_dir):
  """Pipeline proto and pickled units for 200, 2,000 and 20,000 files (paths only: nothing is opened)."""
  plan = _plan(tmp_path, "test_beam_payload")
  sizes = {}
  for n in (200, 2_000, 20_000):
    # Paths that do not compress away: a hash per file, as a sharded export's names have.
    files = [f"gs://corpus-bucket/cqa/{hashlib.sha1(str(k).encode()).hexdigest()[:16]}/part-{k:05d}-of-20000.jsonl"
             for k in range(n)]
    reader = RowReader("gs://corpus-bucket/cqa/*/*.jsonl", RowFormat("jsonl", {"inputs": "q", "targets": "a"}))
    reader._files = files  # pylint: disable=protected-access  (listed already: nothing is opened)
    plan.units = beam_cache.read_units(sources.FileSplit(reader, description="placeholders"))
    sizes[n] = beam_cache.pipeline_payload(plan)
    assert sizes[n]["element_bytes"] / n < UNIT_BOUND, (n, sizes[n])  # before a bigger n would fill the memory
  print({n: s for n, s in sizes.items()})
  per_unit = {n: s["element_bytes"] / n for n, s in sizes.items()}
  # No unit holds the file list: a unit's bytes do not grow with the files (but for pickle's wider ints).
  assert max(per_unit.values()) - min(per_unit.values()) < 2, per_unit
  assert sizes[2_000]["pipeline_proto_bytes"] < PROTO_BOUND_AT_2000
  # Linear in the files: each file adds the same bytes from 200 to 2,000 as from 2,000 to 20,000.
  growth = [(sizes[b]["pipeline_proto_bytes"] - sizes[a]["pipeline_proto_bytes"]) / (b - a)
            for a, b in ((200, 2_000), (2_000, 20_000))]
  assert all(0 < g < UNIT_BOUND for g in growth) and max(growth) < 1.25 * min(growth), growth


# ----------------------------------------------------------------------------- byte ranges

JSONL_LINES = [
    b'\xef\xbb\xbf{"q": "a row after a byte-order mark", "a": "x"}\r\n',
    b'{"q": "a", "a": "b"}\n',
    b'\n',
    b'{not json\n',
    b'["not", "an object"]\n',
    b'{"q": "\xff\xfe undecodable", "a": "c"}\n',
    b'{"q": "' + b"a line longer than many ranges " * 4 + b'", "a": "d"}\n',
    b'{"q": "", "a": "empty question"}\n',
    b'{"q": "the last row", "a": "has no line end"}',
]
TSV_HEADER_LINES = [b"label\tq\ta\n", b"yes\tone\tuno\n", b"no\ttwo\tdos\n", b"yes\tthree\n", b"maybe\tfour\tcuatro\n",
                    b"yes\tfive\tcinco\n"]
TSV_PLAIN_LINES = [b"one\tuno\t1\n", b"two\tdos\n", b"three\ttres\t3\n", b"\xff\tbad\t0\n", b"four\tcuatro\t4"]
FORMATS = {
    "jsonl": (JSONL_LINES, RowFormat("jsonl", {"inputs": "q", "targets": "a"})),
    "tsv_header": (TSV_HEADER_LINES, RowFormat("tsv", {"inputs": "q", "targets": "a"}, label_column="label",
                                               label_values=("yes", "no"), keep_labels=("yes",))),
    "tsv_plain": (TSV_PLAIN_LINES, RowFormat("tsv", {"inputs": 0, "targets": 1})),
}


@pytest.mark.parametrize("kind", sorted(FORMATS))
def test_byte_ranges_read_every_line_once(tmp_path, kind):
  """Every range size from 1 byte (smaller than any line) to the whole file: the rows, counts and reasons of a
  whole-file read; a row straddling a boundary is read by the range where it starts; bad rows located by byte."""
  lines, row_format = FORMATS[kind]
  path = str(tmp_path / "f.txt")
  with open(path, "wb") as f:
    f.write(b"".join(lines))
  size = os.path.getsize(path)
  line_at = {sum(map(len, lines[:i])): i + 1 for i in range(len(lines))}  # byte offset -> line number
  spec = beam_cache.ReaderSpec(row_format, False, "t")
  *whole_rows, (_, whole) = beam_cache.read_unit(((0, 0), "file", path, None), spec)
  assert whole["rows_skipped"] >= 1
  for step in range(1, size + 2):
    rows, merged = [], RowStats(max_reported=100)
    starts = list(range(0, size, step))
    for start in starts:
      *got, (_, stats) = beam_cache.read_unit(((0, start), "range", path, (start, min(start + step, size))), spec)
      assert [position for _, (position, _) in got] == [((0, start), n) for n in range(len(got))]
      rows += [ex for _, (_, ex) in got]
      merged.merge(RowStats(**{k: v for k, v in stats.items() if k not in ("unit", "examples")}))
    assert rows == [ex for _, (_, ex) in whole_rows], step
    assert (merged.rows_read, merged.rows_skipped, merged.rows_filtered) == (
        whole["rows_read"], whole["rows_skipped"], whole["rows_filtered"]), step
    assert dict(merged.skipped_by_reason) == whole["skipped_by_reason"], step
    assert dict(merged.filtered_by_reason) == whole["filtered_by_reason"], step
    # The same bad rows, located by the byte offset where their line starts.
    by_byte = [(line_at[int(w.split(" at byte ")[1].split(":")[0])], w.split(": ", 1)[1])
               for w in merged.first_skipped]
    assert by_byte == [(int(w.split(":")[1]), w.split(": ", 1)[1]) for w in whole["first_skipped"]], step


def test_only_large_uncompressed_line_files_are_split(tmp_path):
  """JSON lines and TSV over the range size are split; CSV (quoted line breaks), TFRecord and .gz stay whole."""
  names = ["a.jsonl", "b.jsonl", "c.jsonl.gz", "d.tsv", "e.csv", "f.tfrecord"]
  for name in names:
    (tmp_path / name).write_bytes(b"x\n" * 50)
  kinds = {}
  for name in names:
    fmt = "tfrecord" if name.endswith("tfrecord") else "csv" if name.endswith("csv") else (
        "tsv" if name.endswith("tsv") else "jsonl")
    reader = sources.FileSplit(RowReader(str(tmp_path / name), RowFormat(fmt, {"inputs": 0, "targets": 1}
                                                                                 if fmt in ("tsv", "csv") else
                                                                                 {"inputs": "q", "targets": "a"})),
                               description=name)
    sizes = [0 if name == "a.jsonl" else 100]  # a.jsonl: small, whole
    kinds[name] = [(key, kind, byte_range) for key, kind, _, byte_range in beam_cache.read_units(reader, sizes, 40)]
  assert kinds["a.jsonl"] == [((0, 0), "file", None)]
  assert kinds["b.jsonl"] == kinds["d.tsv"] == [((0, 0), "range", (0, 40)), ((0, 40), "range", (40, 80)),
                                                ((0, 80), "range", (80, 100))]
  assert all(kinds[n] == [((0, 0), "file", None)] for n in ("c.jsonl.gz", "e.csv", "f.tfrecord"))


# ----------------------------------------------------------------------------- shard count and worker memory

SPECS_128 = [("inputs", 127, True, 1), ("targets", 127, True, 1)]


def test_shard_count_is_derived_from_the_rows_and_refused_when_a_shard_outgrows_a_worker(caplog):
  sizing = cache_writer.ShardSizing()
  plan = cache_writer.plan_shards((2_000_000_000, False), SPECS_128, num_shards=None, sizing=sizing)
  assert (plan.num_shards, plan.records_per_shard, plan.derived) == (4_000, 500_000, True)
  # A record of lengths 128/128 is at most 829 bytes; a writer holds 500 + 3 x 829 bytes for it (measured rule).
  assert (plan.record_bytes, plan.bytes_per_record) == (829, 2_987)
  cache_writer.check_shard_memory(plan)  # ~1.4 GiB a shard: fits half of a 4 GB worker
  for readers, shards in ((32, 4_000), (48, 4_032), (7, 4_004)):
    got = cache_writer.plan_shards((2_000_000_000, False), SPECS_128, num_shards=None,
                                   sizing=cache_writer.ShardSizing(num_readers=readers)).num_shards
    assert got == shards
  assert cache_writer.plan_shards((10, True), SPECS_128, num_shards=None, sizing=cache_writer.ShardSizing(
      num_readers=4)).num_shards == 4  # never fewer shards than readers
  # Today's old default, 16 shards for 2B pairs: ~125M records a shard, refused in one line with the way out.
  big = cache_writer.plan_shards((2_000_000_000, False), SPECS_128, num_shards=16, sizing=sizing)
  with pytest.raises(cache.CacheError) as e:
    cache_writer.check_shard_memory(big)
  message = str(e.value)
  assert "\n" not in message and "125,000,000 records" in message and "--worker_memory_gb 4" in message
  enough = int(message.split("use at least ")[1].split(" shards")[0].replace(",", ""))
  assert enough == 2_782  # ceil(2B / (2 GiB // 2,987 bytes)): half of the worker for the shard
  cache_writer.check_shard_memory(cache_writer.plan_shards((2_000_000_000, False), SPECS_128, num_shards=enough,
                                                           sizing=sizing))
  with pytest.raises(cache.CacheError, match="over half"):
    cache_writer.check_shard_memory(cache_writer.plan_shards((2_000_000_000, False), SPECS_128,
                                                             num_shards=enough - 1, sizing=sizing))
  # A given count that fits is used, with a warning when it strays from the sizing.
  with caplog.at_level(logging.WARNING, logger="st5_jax.data"):
    cache_writer.warn_given_shards(plan)  # derived: nothing to say
    assert not caplog.text
    cache_writer.warn_given_shards(cache_writer.plan_shards((2_000_000_000, False), SPECS_128, num_shards=3_000,
                                                            sizing=cache_writer.ShardSizing(num_readers=32)))
  assert "num_shards 3000: up to 666,667 records a shard, more than --records_per_shard 500000; not a multiple of " \
      "the 32 readers." in caplog.text


def test_input_rows_are_counted_or_estimated_from_samples(tmp_path, monkeypatch):
  """Lines (a last line without its end too), TFRecord records; above the counting limit, sampled files' rows per
  byte times the bytes."""
  for k in range(5):
    body = "".join(json.dumps({"q": f"q{k} {i}" + "x" * (i % 7), "a": "a"}) + "\n" for i in range(400 + 100 * k))
    (tmp_path / f"p{k}.jsonl").write_text(body if k else body.rstrip("\n"))
  records = [cache_writer.frame_record(os.urandom(10 + i % 50)) for i in range(300)]
  (tmp_path / "r.tfrecord").write_bytes(b"".join(records))

  def split(pattern, fmt):
    return sources.FileSplit(RowReader(str(tmp_path / pattern), RowFormat(fmt, {"inputs": "q"})),
                             description=pattern)

  assert cache_writer.input_rows(split("p*.jsonl", "jsonl")) == (400 + 500 + 600 + 700 + 800, True)
  assert cache_writer.input_rows(split("r.tfrecord", "tfrecord")) == (300, True)
  assert cache_writer.input_rows(sources.MemorySplit([{"inputs": "x"}] * 7, features=("inputs",),
                                                     description="m")) == (7, True)
  monkeypatch.setattr(cache_writer, "_COUNT_BYTES", 0)
  monkeypatch.setattr(cache_writer, "_SAMPLE_BYTES", 4096)
  rows, exact = cache_writer.input_rows(split("p*.jsonl", "jsonl"))
  assert not exact and abs(rows - 3000) < 0.05 * 3000, rows
  rows, exact = cache_writer.input_rows(split("r.tfrecord", "tfrecord"))
  assert not exact and abs(rows - 300) < 0.1 * 300, rows
