"""Bad rows in corrupted copies of real files: skipped, counted, reported; strict mode stops."""

import csv
import shutil

import pytest

from st5_jax.data import builders, registry, tasks
from st5_jax.batch_geometry import DataConfigError
from st5_jax.data.iterator import make_local_iterator
from st5_jax.data.rows import RowFormat, RowReader, RowStats, list_files
from st5_jax.errors import BadRowError, InputFileError


TREC_FORMAT = RowFormat("csv", {"inputs": "qtext", "targets": "atext"}, label_column="label",
                        label_values=("0", "1"), keep_labels=("1",))


@pytest.fixture
def corrupted_trec(data_dir, tmp_path):
  """TREC-QA train.csv with four bad rows written over real ones (line numbers are physical lines)."""
  src = data_dir / "qa_pairs" / "trecqa_wang" / "train.csv"
  raw = src.read_bytes().split(b"\r\n")  # the file has CRLF line ends
  assert raw[0] == b"qtext,label,atext"
  raw[2] = b'"What is a question ?",1,"answer",extra field'   # line 3: wrong number of fields
  raw[4] = b'"   ",1,"an answer with an empty question"'          # line 5: empty text
  raw[6] = b'"Who wrote \xff\xfe this ?",1,"bad bytes"'            # line 7: not UTF-8
  raw[8] = b'"Which label ?",7,"label out of range"'                # line 9: label outside {0,1}
  path = tmp_path / "train.csv"
  path.write_bytes(b"\r\n".join(raw))
  with open(src, newline="", encoding="utf-8") as f:
    original = list(csv.DictReader(f))
  return path, original


def test_bad_rows_are_skipped_counted_and_reported(corrupted_trec):
  path, original = corrupted_trec
  stats = RowStats()
  examples = list(RowReader(str(path), TREC_FORMAT).iter_examples(stats=stats))
  assert stats.rows_read == len(original) == 4718
  assert stats.rows_skipped == 4
  assert dict(stats.skipped_by_reason) == {"wrong number of fields": 1, "empty text": 1, "undecodable bytes": 1,
                                           "label out of range": 1}
  assert stats.first_skipped == [
      f"{path}:3: wrong number of fields: 4, expected 3",
      f"{path}:5: empty text in column 'qtext'",
      f"{path}:7: undecodable bytes (not UTF-8) in field 0",
      f"{path}:9: label '7' outside ['0', '1']",
  ]
  # Nothing vanishes silently: every row is an example, filtered (label 0) or skipped.
  assert len(examples) + stats.rows_filtered + stats.rows_skipped == stats.rows_read
  positives = sum(1 for r in original if r["label"] == "1")
  replaced_positives = sum(1 for i in (1, 3, 5, 7) if original[i]["label"] == "1")
  assert len(examples) == positives - replaced_positives


def test_strict_mode_raises_on_the_first_bad_row(corrupted_trec):
  path, _ = corrupted_trec
  with pytest.raises(BadRowError, match=rf"{path}:3: wrong number of fields"):
    list(RowReader(str(path), TREC_FORMAT, strict=True).iter_examples())


def test_bad_rows_do_not_stop_a_long_run_and_are_counted_once(corrupted_trec, monkeypatch):
  path, _ = corrupted_trec
  registry.register_user_task("test_bad_trec", file_pattern=str(path), columns={"inputs": "qtext", "targets": "atext"},
                              label_column="label", label_values=("0", "1"), keep_labels=("1",))
  it = make_local_iterator(task="test_bad_trec", feature_lengths={"inputs": 16, "targets": 16},
                                    batch_size=100)
  for _ in range(12):  # ~3.5 epochs of 345 pairs
    next(it)
  stats = it.stats
  assert stats["tasks"]["test_bad_trec"]["epoch"] == 3
  assert stats["rows_skipped"] == 4 and stats["rows_read"] == 4718  # distinct rows, not per epoch
  assert stats["first_skipped"][0] == f"{path}:3: wrong number of fields: 4, expected 3"
  # Strict mode surfaces the original error from the iterator, naming the row.
  monkeypatch.setenv("ST5_DATA_STRICT", "1")
  strict = make_local_iterator(task="test_bad_trec", feature_lengths={"inputs": 16, "targets": 16},
                                        batch_size=100)
  with pytest.raises(BadRowError, match=rf"{path}:3: wrong number of fields"):
    next(strict)


def test_corrupted_wikiqa_and_triples(data_dir, tmp_path):
  wiki = tmp_path / "qa_pairs" / "wikiqa"
  wiki.mkdir(parents=True)
  shutil.copy(data_dir / "qa_pairs" / "wikiqa" / "WikiQA-test.tsv", wiki)
  lines = (data_dir / "qa_pairs" / "wikiqa" / "WikiQA-train.tsv").read_text(encoding="utf-8").split("\n")
  lines[10] = "Q9\tonly three\tfields"
  lines[11] = lines[11].rsplit("\t", 1)[0] + "\t2"
  (wiki / "WikiQA-train.tsv").write_text("\n".join(lines), encoding="utf-8")
  stats = RowStats()
  built = builders.build_wikiqa(str(tmp_path), stats=stats)
  # Train only (20,360 rows; the test file beside it is evaluation-only and not read: 26,525 with it).
  assert stats.rows_skipped == 2 and stats.rows_read == 20360
  assert stats.first_skipped[0].endswith("WikiQA-train.tsv:11: wrong number of fields: 3, expected 5 or 7")
  assert "WikiQA-train.tsv:12: label '2' outside" in stats.first_skipped[1]
  assert len(built.examples) >= 1040 - 2  # WikiQA train's 1,040 positives (1,333 with test)

  nli = tmp_path / "nli"
  nli.mkdir()
  with open(data_dir / "nli" / "snli_devtest_triples_derived.csv", newline="", encoding="utf-8") as f:
    rows = list(csv.reader(f))
  rows[1][3] = "train_or_dev"  # a split outside its range
  rows[2][0] = " "  # an empty premise
  with open(nli / "snli_devtest_triples_derived.csv", "w", newline="", encoding="utf-8") as f:
    csv.writer(f).writerows(rows)
  stats = RowStats()
  dev = builders.build_shipped_triples(str(tmp_path), "dev", stats=stats).examples
  assert stats.rows_skipped == 2 and len(dev) == 3170
  assert stats.first_skipped[0].endswith("snli_devtest_triples_derived.csv:2: label 'train_or_dev' outside "
                                         "['dev', 'test', 'train', 'validation']")
  assert stats.first_skipped[1].endswith("snli_devtest_triples_derived.csv:3: empty text in column 'sent0'")


def test_truncated_tfrecord_reports_and_keeps_the_good_records(tmp_path):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  path = tmp_path / "pairs.tfrecord"
  with tf.io.TFRecordWriter(str(path)) as w:
    for i in range(10):
      ex = tf.train.Example(features=tf.train.Features(feature={
          "question": tf.train.Feature(bytes_list=tf.train.BytesList(value=[f"q{i}".encode()])),
          "answer": tf.train.Feature(bytes_list=tf.train.BytesList(value=[f"a{i}".encode()] if i != 3 else []))}))
      w.write(ex.SerializeToString())
  data = path.read_bytes()
  path.write_bytes(data[:-7])  # cut the last record
  stats = RowStats()
  reader = RowReader(str(path), RowFormat("tfrecord", {"inputs": "question", "targets": "answer"}))
  examples = list(reader.iter_examples(stats=stats))
  assert [e["inputs"] for e in examples] == [f"q{i}" for i in range(9) if i != 3]
  assert stats.first_skipped == [f"{path}:4: missing field 'answer'",
                                 f"{path}:10: truncated record, rest of file skipped"]


def test_tfrecord_framing_matches_tensorflow_and_checks_crcs(tmp_path):
  """Our TFRecord parser (used for local and gs:// files) reads what TF writes, and no more."""
  import io

  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from st5_jax.data.rows import iter_tfrecord_payloads
  path = tmp_path / "r.tfrecord"
  payloads = [b"", b"x", bytes(range(256)) * 40]
  with tf.io.TFRecordWriter(str(path)) as w:
    for p in payloads:
      w.write(p)
  data = path.read_bytes()
  assert list(iter_tfrecord_payloads(io.BytesIO(data))) == payloads
  assert [r.numpy() for r in tf.data.TFRecordDataset(str(path))] == payloads
  flipped = bytearray(data)
  flipped[16 + 5] ^= 1  # a bit of the second record's length field (the first record is 16 bytes)
  assert list(iter_tfrecord_payloads(io.BytesIO(bytes(flipped))))[1] == "corrupt record length (checksum mismatch)"
  flipped = bytearray(data)
  flipped[-10] ^= 1  # a byte of the last record's data
  assert list(iter_tfrecord_payloads(io.BytesIO(bytes(flipped))))[2] == "corrupt record data (checksum mismatch)"


def test_jsonl_bad_lines(tmp_path):
  path = tmp_path / "x.jsonl"
  path.write_text('{"inputs": "a", "targets": "b"}\n{"inputs": "a"\n["list"]\n{"inputs": 3, "targets": "b"}\n'
                  '{"targets": "b"}\n\n{"inputs": "c", "targets": "d"}\n')
  stats = RowStats()
  out = list(RowReader(str(path), RowFormat("jsonl", {"inputs": "inputs", "targets": "targets"}))
             .iter_examples(stats=stats))
  assert out == [{"inputs": "a", "targets": "b"}, {"inputs": "c", "targets": "d"}]
  assert [s.split(": ", 1)[1] for s in stats.first_skipped] == [
      "invalid JSON (Expecting ',' delimiter at column 15)", "not a JSON object", "field 'inputs' is not a string",
      "missing field 'inputs'", "blank line"]


def test_missing_and_empty_files_name_the_file(tmp_path):
  with pytest.raises(InputFileError, match=rf"{tmp_path}/nope-\*.tsv does not exist"):
    list_files(str(tmp_path / "nope-*.tsv"))
  empty = tmp_path / "empty.tsv"
  empty.write_text("")
  with pytest.raises(InputFileError, match=rf"{empty} is empty"):
    list_files(str(empty))
  header_only = tmp_path / "header.csv"
  header_only.write_text("sent0,sent1,hard_neg\n")
  registry.register_user_task("test_header_only", file_pattern=str(header_only),
                              columns={"inputs": "sent0", "targets": "sent1", "negative_targets": "hard_neg"})
  with pytest.raises(DataConfigError, match=rf"no usable examples.*{header_only}"):
    make_local_iterator(task="test_header_only", feature_lengths={"inputs": 8, "targets": 8}, batch_size=2)
  registry.register_user_task("test_missing_file", file_pattern=str(tmp_path / "missing.tsv"))
  with pytest.raises(InputFileError, match="missing.tsv does not exist"):
    make_local_iterator(task="test_missing_file", feature_lengths={"inputs": 8, "targets": 8}, batch_size=2)


def test_missing_public_raw_file_says_how_to_fix(tmp_path, monkeypatch):
  monkeypatch.setenv("ST5_DATA_DIR", str(tmp_path))
  with pytest.raises(InputFileError, match=r"qa_pairs/trecqa_wang/train.csv does not exist. Run `st5 data prepare"):
    make_local_iterator(task=tasks.TRECQA, feature_lengths={"inputs": 8, "targets": 8}, batch_size=2)
