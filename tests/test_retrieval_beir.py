"""BEIR folders, local and on the GCS emulator: what load_beir reads, and one line for each malformed case."""

import json

import ir_measures
import pytest

from st5_jax import cli
from st5_jax.retrieval import beir, metrics, runs
from st5_jax.retrieval.beir import RetrievalDataError

CORPUS = [
    {"_id": "d1", "title": "Paris", "text": "Paris is the capital of France."},
    {"_id": "d2", "title": "", "text": "Berlin is the capital of Germany."},  # empty title: text alone
    {"_id": "d3", "text": "No title field at all.", "metadata": {"url": "x"}},  # other fields ignored
    {"_id": 4, "title": "Zürich", "text": "Zürich liegt am See."},  # an integer id, as some dumps have
    {"_id": "d5", "title": "Rome", "text": ""},
    {"_id": "d6", "title": "Oslo", "text": "Oslo is in Norway."},
]
QUERIES = [
    {"_id": "q1", "text": "capital of France"},
    {"_id": "q2", "text": "Where is Zürich?"},
    {"_id": "q3", "text": "only in the dev split"},
    {"_id": "q4", "text": "judged, but nothing relevant"},
    {"_id": "q5", "text": "capital of Germany"},
]
TEST_QRELS = "query-id\tcorpus-id\tscore\nq1\td1\t2\nq1\td6\t0\nq2\t4\t1\nq2\td5\t3\nq4\td2\t0\nq5\td2\t1\n"
DEV_QRELS = "query-id\tcorpus-id\tscore\nq3\td3\t1\n"


def _write_jsonl(path, records, *, crlf_at=None):
  lines = [json.dumps(r, ensure_ascii=False) + ("\r\n" if i == crlf_at else "\n") for i, r in enumerate(records)]
  path.write_text("".join(lines[:2]) + "\n" + "".join(lines[2:]), encoding="utf-8")  # a blank line is skipped


@pytest.fixture
def beir_dir(tmp_path):
  root = tmp_path / "beir"
  (root / "qrels").mkdir(parents=True)
  _write_jsonl(root / "corpus.jsonl", CORPUS, crlf_at=1)
  _write_jsonl(root / "queries.jsonl", QUERIES)
  (root / "qrels" / "test.tsv").write_text(TEST_QRELS)
  (root / "qrels" / "dev.tsv").write_text(DEV_QRELS)
  return root


def test_load_beir_reads_the_folder(beir_dir):
  data = beir.load_beir(beir_dir)
  assert data.corpus == {"d1": "Paris Paris is the capital of France.", "d2": "Berlin is the capital of Germany.",
                         "d3": "No title field at all.", "4": "Zürich Zürich liegt am See.", "d5": "Rome ",
                         "d6": "Oslo Oslo is in Norway."}
  # q4 is judged with score 0 only: left out; q3 belongs to dev. queries.jsonl's order.
  assert list(data.queries.items()) == [("q1", "capital of France"), ("q2", "Where is Zürich?"),
                                        ("q5", "capital of Germany")]
  assert data.qrels == {"q1": {"d1": 2, "d6": 0}, "q2": {"4": 1, "d5": 3}, "q5": {"d2": 1}}
  assert data.stats == {"documents": 6, "queries_in_file": 5, "judgements": 6, "qrels_queries": 4, "queries": 3,
                        "queries_without_relevant": 1}
  dev = beir.load_beir(beir_dir, split="dev")
  assert dev.queries == {"q3": "only in the dev split"} and dev.qrels == {"q3": {"d3": 1}}
  assert dev.corpus == data.corpus and dev.stats["queries_without_relevant"] == 0


def test_qrels_readers(tmp_path, beir_dir):
  # TREC's 4-column qrels read as BEIR's TSV; ir-measures' own reader agrees.
  trec = tmp_path / "qrels.trec"
  trec.write_text("".join(f"{q} 0 {d} {s}\n" for q, rel in beir.read_qrels(beir_dir / "qrels/test.tsv").items()
                          for d, s in rel.items()))
  assert beir.read_qrels(trec) == beir.read_qrels(beir_dir / "qrels/test.tsv") == runs.read_qrels(trec)
  theirs = {}
  for row in ir_measures.read_trec_qrels(str(trec)):
    theirs.setdefault(row.query_id, {})[row.doc_id] = row.relevance
  assert beir.read_qrels(trec) == theirs
  headerless = tmp_path / "headerless.tsv"
  headerless.write_text("q1\td1\t1\r\nq1\td2\t-1\r\n")
  assert beir.read_qrels(headerless) == {"q1": {"d1": 1, "d2": -1}}


def test_a_beir_folder_on_gcs_loads_and_scores_like_its_local_copy(gcs, beir_dir):
  url = gcs.upload(beir_dir, "beir", "tiny")
  local, remote = beir.load_beir(beir_dir), beir.load_beir(url)
  assert remote == local and list(remote.corpus) == list(local.corpus) and list(remote.queries) == list(local.queries)
  run = {"q1": {"d6": 0.9, "d1": 0.9, "d2": 0.1}, "q2": {"d5": 0.5, "4": 0.7}, "q5": {"d1": 0.3}}
  assert metrics.evaluate(run, remote.qrels) == metrics.evaluate(run, local.qrels)
  # Run files on gs:// too.
  runs.write_trec(f"{url}/runs/run.trec", run, tag="t")
  runs.write_jsonl(f"{url}/runs/run.jsonl", run, k=1)
  assert runs.read_trec(f"{url}/runs/run.trec") == run
  assert runs.read_jsonl(f"{url}/runs/run.jsonl") == {"q1": {"d6": 0.9}, "q2": {"4": 0.7}, "q5": {"d1": 0.3}}
  # A malformed folder on gs:// is the same one line.
  (beir_dir / "qrels" / "test.tsv").write_text(TEST_QRELS + "q5\td99\t1\n")
  bad = gcs.upload(beir_dir, "beir", "bad")
  with pytest.raises(RetrievalDataError, match=rf"^{bad}/qrels/test.tsv:8: corpus-id 'd99' is not in "
                                               rf"{bad}/corpus.jsonl; add it there or drop its qrels rows$"):
    beir.load_beir(bad)


def _corpus_lines(replace: dict) -> str:
  lines = [json.dumps(r) for r in CORPUS]
  for i, text in replace.items():
    lines[i] = text
  return "\n".join(lines) + "\n"


# (what to change: file -> new content, or None to delete; split; the message after the file name)
MALFORMED = {
    "missing corpus": ({"corpus.jsonl": None}, "test", (
        "corpus.jsonl: the documents file is missing; a BEIR folder holds corpus.jsonl, queries.jsonl and "
        "qrels/<split>.tsv")),
    "missing split": ({}, "train", (
        "qrels/train.tsv: no qrels for split 'train'; the folder has dev, test: pick one of those splits")),
    "no qrels at all": ({"qrels/test.tsv": None, "qrels/dev.tsv": None}, "test", (
        "qrels/test.tsv: no qrels for split 'test'; the folder has no qrels; a BEIR folder holds")),
    "not JSON": ({"corpus.jsonl": _corpus_lines({2: '{"_id": "d3", "text": "unterminated}'})}, "test", (
        "corpus.jsonl:3: not valid JSON (Unterminated string starting at, column 23); each line of corpus.jsonl "
        "must be one JSON object with \"_id\", \"title\" (optional) and \"text\"")),
    "a JSON list": ({"corpus.jsonl": _corpus_lines({0: '["d1", "text"]'})}, "test",
                    "corpus.jsonl:1: a JSON list, not an object; each line"),
    "no text": ({"corpus.jsonl": _corpus_lines({1: '{"_id": "d2", "body": "x"}'})}, "test",
                "corpus.jsonl:2: no \"text\" string for _id 'd2'; each line"),
    "no id": ({"queries.jsonl": '{"text": "a query"}\n'}, "test", (
        "queries.jsonl:1: no \"_id\" (a non-empty string); each line of queries.jsonl must be one JSON object with "
        "\"_id\" and \"text\"")),
    "duplicate id": ({"queries.jsonl": "".join(f'{{"_id": "{q}", "text": "a"}}\n' for q in ("q1", "q2", "q1"))}, "test",
                     "queries.jsonl:3: duplicate _id 'q1' (first on line 1); ids must be unique: remove or rename one"),
    "empty queries": ({"queries.jsonl": "\n"}, "test",
                      "queries.jsonl: no queries (the file is empty); each line of queries.jsonl must be"),
    "not UTF-8": ({"queries.jsonl": b'{"_id": "q1", "text": "caf\xe9"}\n'}, "test",
                  "queries.jsonl:1: not UTF-8 (invalid continuation byte at byte 27 of the line); save the file"),
    "unknown query": ({"qrels/test.tsv": TEST_QRELS + "q9\td1\t1\nq8\td1\t0\n"}, "test", (
        "qrels/test.tsv:8: query-id 'q9' is not in {root}/queries.jsonl (and 1 more such ids); add it there or drop "
        "its qrels rows")),
    "unknown document": ({"qrels/test.tsv": TEST_QRELS.replace("q2\td5\t3", "q2\td55\t3")}, "test",
                         "qrels/test.tsv:5: corpus-id 'd55' is not in {root}/corpus.jsonl; add it there or drop its"),
    "bad score": ({"qrels/test.tsv": TEST_QRELS + "q5\td1\thigh\n"}, "test",
                  "qrels/test.tsv:8: score 'high' is not an integer; each line must be"),
    "bad columns": ({"qrels/test.tsv": TEST_QRELS + "q5\td1\n"}, "test",
                    "qrels/test.tsv:8: 2 columns; each line must be `query-id<TAB>corpus-id<TAB>score`"),
    "header only": ({"qrels/test.tsv": "query-id\tcorpus-id\tscore\n"}, "test",
                    "qrels/test.tsv: no judgements (only a header or nothing); write one"),
    "nothing relevant": ({"qrels/test.tsv": "query-id\tcorpus-id\tscore\nq1\td1\t0\nq2\td2\t-1\n"}, "test", (
        "qrels/test.tsv: no query has a relevant document (every score <= 0); relevant documents need a score of 1 "
        "or more")),
    "conflicting duplicate": ({"qrels/test.tsv": TEST_QRELS + "q1\td1\t2\nq1\td1\t1\n"}, "test", (
        "qrels/test.tsv:9: query 'q1', document 'd1' judged again with score 1 (earlier 2); keep one row per pair")),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_each_malformed_folder_is_one_actionable_line(beir_dir, case):
  changes, split, message = MALFORMED[case]
  for name, content in changes.items():
    if content is None:
      (beir_dir / name).unlink()
    elif isinstance(content, bytes):
      (beir_dir / name).write_bytes(content)
    else:
      (beir_dir / name).write_text(content, encoding="utf-8")
  with pytest.raises(RetrievalDataError) as e:
    beir.load_beir(beir_dir, split=split)
  text = str(e.value)
  assert text.startswith(f"{beir_dir}/" + message.format(root=beir_dir)), text
  assert "\n" not in text
  # `st5` prints it as this one line and exits 2 (st5_jax.cli).
  assert isinstance(e.value, ValueError) and cli.is_user_error(e.value) and cli.one_line(e.value) == text


def test_a_missing_folder(tmp_path):
  with pytest.raises(RetrievalDataError, match=r"/nowhere: no such folder; pass a folder laid out as BEIR's"):
    beir.load_beir(tmp_path / "nowhere")
