"""`st5 data prepare`: downloads against a local HTTP server, local copies, idempotency, CLI."""

import contextlib
import hashlib
import http.server
import io
import json
import re
import shutil
import tarfile
import threading
import unicodedata
import zipfile

import pytest
import raw_counts

from st5_jax import cli
from st5_jax.data import builders
from st5_jax.data.offline import catalog, derive, download, prepare
from st5_jax.data.rows import RowStats
from st5_jax.evaluation import harness

TREC_FILES = catalog.DATASETS["trecqa"].files


@pytest.fixture(scope="module")
def mirror(data_dir, tmp_path_factory):
  """http://127.0.0.1:PORT serving ../shared/data at /, plus /bad/ (a corrupted copy), /truncated/ and /archives/."""
  bad = tmp_path_factory.mktemp("bad_mirror")
  for f in TREC_FILES:
    (bad / f.relpath).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(data_dir / f.relpath, bad / f.relpath)
  dev = bad / "qa_pairs" / "trecqa_wang" / "dev.csv"
  dev.write_bytes(dev.read_bytes().replace(b"Who", b"Whom", 1))  # same size, different bytes
  archives = tmp_path_factory.mktemp("archives")
  with tarfile.open(archives / "wang.tar.gz", "w:gz") as t:
    t.add(data_dir / "qa_pairs" / "trecqa_wang" / "train.csv", arcname="wang/train.csv")
  with zipfile.ZipFile(archives / "wang.zip", "w") as z:
    z.write(data_dir / "qa_pairs" / "trecqa_wang" / "test.csv", arcname="WangCorpus/test.csv")
  roots = {"/bad/": bad, "/archives/": archives}

  class Handler(http.server.SimpleHTTPRequestHandler):

    def __init__(self, *args, **kwargs):
      super().__init__(*args, directory=str(data_dir), **kwargs)

    def translate_path(self, path):
      for prefix, root in roots.items():
        if path.startswith(prefix):
          return str(root / path[len(prefix):])
      return super().translate_path(path)

    def do_GET(self):
      if self.path.startswith("/truncated/"):
        body = (data_dir / self.path[len("/truncated/"):]).read_bytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[:len(body) // 2])  # then the connection closes
        self.close_connection = True
        return
      super().do_GET()

    def log_message(self, *args):
      pass

  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  yield f"http://127.0.0.1:{server.server_address[1]}"
  server.shutdown()
  server.server_close()


def test_download_with_correct_checksums(mirror, tmp_path):
  fetcher = download.Fetcher(out_dir=str(tmp_path), base_url=mirror)
  results = [fetcher.fetch(f) for f in TREC_FILES]
  assert [r.status for r in results] == ["downloaded"] * 4
  for f in TREC_FILES:
    assert hashlib.sha256((tmp_path / f.relpath).read_bytes()).hexdigest() == f.sha256
  # Present files are kept, not fetched again.
  assert [fetcher.fetch(f).status for f in TREC_FILES] == ["present"] * 4


def test_wrong_checksum_is_refused_and_leaves_nothing(mirror, tmp_path):
  dev = next(f for f in TREC_FILES if f.relpath.endswith("dev.csv"))
  fetcher = download.Fetcher(out_dir=str(tmp_path), base_url=f"{mirror}/bad")
  with pytest.raises(download.FetchError) as e:
    fetcher.fetch(dev)
  message = str(e.value)
  assert f"{mirror}/bad/qa_pairs/trecqa_wang/dev.csv: checksum mismatch" in message
  assert f"expected {dev.sha256}" in message
  assert f"Put a copy at {tmp_path}/qa_pairs/trecqa_wang/dev.csv" in message
  assert not (tmp_path / dev.relpath).exists() and not list((tmp_path / "qa_pairs" / "trecqa_wang").iterdir())


def test_http_404_names_file_url_and_where_to_put_it(mirror, tmp_path):
  fetcher = download.Fetcher(out_dir=str(tmp_path / "out"), source_dir=str(tmp_path / "empty"),
                             base_url=f"{mirror}/nothing-here")
  with pytest.raises(download.FetchError) as e:
    fetcher.fetch(TREC_FILES[0])
  message = str(e.value)
  rel = TREC_FILES[0].relpath
  assert message.startswith(f"Cannot get {rel}.")
  assert f"{tmp_path}/empty/{rel}: not found" in message
  assert f"{mirror}/nothing-here/{rel}: HTTP 404" in message
  assert f"Put a copy at {tmp_path}/out/{rel}" in message and "--source" in message and "--base-url" in message


def test_truncated_download_is_detected(mirror, tmp_path):
  fetcher = download.Fetcher(out_dir=str(tmp_path), base_url=f"{mirror}/truncated")
  train = next(f for f in TREC_FILES if f.relpath.endswith("train.csv"))
  with pytest.raises(download.FetchError, match=r"truncated download: received \d+ of 968459 bytes"):
    fetcher.fetch(train)
  assert not (tmp_path / train.relpath).exists()


def test_archive_members_are_extracted_and_verified(mirror, tmp_path):
  train, test = (next(f for f in TREC_FILES if f.relpath.endswith(n)) for n in ("train.csv", "test.csv"))
  files = [catalog.RemoteFile(train.relpath, train.sha256, (f"{mirror}/archives/wang.tar.gz#wang/train.csv",)),
           catalog.RemoteFile(test.relpath, test.sha256, (f"{mirror}/archives/missing.zip#x",
                                                          f"{mirror}/archives/wang.zip#WangCorpus/test.csv"))]
  fetcher = download.Fetcher(out_dir=str(tmp_path))
  try:
    assert [fetcher.fetch(f).status for f in files] == ["downloaded", "downloaded"]
  finally:
    fetcher.close()
  assert hashlib.sha256((tmp_path / test.relpath).read_bytes()).hexdigest() == test.sha256


def test_unknown_checksum_needs_trust_unverified(mirror, tmp_path):
  f = catalog.RemoteFile("qa_pairs/trecqa_wang/README.md", None, ())
  with pytest.raises(download.FetchError, match="--trust-unverified"):
    download.Fetcher(out_dir=str(tmp_path), base_url=mirror).fetch(f)
  result = download.Fetcher(out_dir=str(tmp_path), base_url=mirror, trust_unverified=True).fetch(f)
  assert result.status == "downloaded" and not result.verified
  assert result.sha256 == next(x.sha256 for x in TREC_FILES if x.relpath == f.relpath)


def test_local_only_file_says_so(tmp_path):
  squad = catalog.DATASETS["squad_dev_reconstructed"].files[0]
  assert catalog.DATASETS["squad_dev_reconstructed"].local_only
  with pytest.raises(download.FetchError, match="no public URL with identical bytes"):
    download.Fetcher(out_dir=str(tmp_path)).fetch(squad)


def test_catalog_matches_the_shared_folder(data_dir):
  # Every file of the shared layout is in the catalog with DATA.md's checksum, and vice versa.
  listed = {f.relpath: f.sha256 for d in catalog.DATASETS.values() if not d.optional for f in d.files}
  on_disk = {str(p.relative_to(data_dir)) for p in data_dir.rglob("*") if p.is_file() and p.name != "DATA.md"}
  assert set(listed) == on_disk
  for rel, sha in listed.items():
    assert download.sha256_of(str(data_dir / rel)) == sha, rel
  # Downloadable datasets have URLs; derived ones are made by their recipe, never downloaded.
  assert all(f.urls for d in catalog.DATASETS.values() if not d.local_only and not d.derived for f in d.files)
  assert all(not f.urls for d in catalog.DATASETS.values() if d.derived for f in d.files)


def test_prepare_everything_from_the_local_folder_then_idempotent(data_dir, tmp_path):
  out = tmp_path / "data"
  report = prepare.prepare(out_dir=str(out), source_dir=str(data_dir), offline=True, progress=False)
  assert report.ok, report.summary()
  assert {d.name for d in report.datasets} == set(catalog.CORE_DATASETS)
  assert all(set(d.counts()) == {"copied"} for d in report.datasets)
  tasks = {(t.task, t.split): t for t in report.tasks}
  # Builders give DATA.md's counts (test_data_builders.py); prepared files then lack every example that
  # shares a text with an evaluation set, counted here with a normalisation of our own. No ReQA: it needs
  # SQuAD train, which ../shared/data lacks (SQuAD dev would leak into SentGLUE-QNLI).
  raw = {("st5_qatar_living_good_answers", "train"): builders.build_qatar_living_good,
         ("st5_qatar_living_perfect_match", "train"): builders.build_qatar_living_perfect_match,
         ("st5_trecqa_positives", "train"): builders.build_trecqa, ("st5_wikiqa_positives", "train"): builders.build_wikiqa,
         ("st5_snli_devtest_triples", "train"): lambda d, **kw: builders.build_shipped_triples(d, "dev", **kw),
         ("st5_snli_devtest_triples", "validation"): lambda d, **kw: builders.build_shipped_triples(d, "test", **kw),
         ("st5_snli_devtest_triples", "all"): lambda d, **kw: builders.build_shipped_triples(d, None, **kw)}
  norm = lambda t: re.sub(r"[\W_]+", "", unicodedata.normalize("NFKC", t).lower())  # noqa: E731
  evaluation = {n for spec in harness.TASKS.values() for n in map(norm, spec.build(str(data_dir))[0]) if n}
  expected = {}
  for key, build in raw.items():
    examples = build(data_dir, stats=RowStats()).examples
    # Every text of the example, a forum question's body alone included (builders.DECONTAMINATION_TEXTS).
    texts = lambda ex: [v for k, v in ex.items() if k not in ("source", builders.DECONTAMINATION_TEXTS)] + list(  # noqa: E731
        ex.get(builders.DECONTAMINATION_TEXTS, ()))
    expected[key] = sum(1 for ex in examples if not {norm(v) for v in texts(ex)} & evaluation)
  assert {k: t.written for k, t in tasks.items()} == expected
  assert expected[("st5_trecqa_positives", "train")] < 569 and expected[("st5_snli_devtest_triples", "all")] < 6339
  first = (out / "prepared" / "st5_trecqa_positives" / "train.jsonl").read_text().split("\n")[0]
  row = json.loads(first)
  rel, line = row["source"].rsplit(":", 1)  # provenance relative to the data folder: the raw row's line
  assert rel == "qa_pairs/trecqa_wang/train.csv"
  assert row["inputs"] in (out / rel).read_text(encoding="utf-8").splitlines()[int(line) - 1]
  summary = report.summary()
  assert "st5_trecqa_positives (train)" in summary and "5866" in summary
  assert raw_counts.trecqa(data_dir)["rows"] == 5866  # train + dev (test is evaluation-only)
  manifest = json.loads((out / "prepared" / "MANIFEST.json").read_text())
  assert manifest["tasks"]["st5_wikiqa_positives"]["train"]["stats"]["rows_read"] == raw_counts.wikiqa(data_dir)["rows"]

  again = prepare.prepare(out_dir=str(out), source_dir=str(data_dir), offline=True, progress=False)
  assert again.ok and all(set(d.counts()) == {"present"} for d in again.datasets)
  assert {t.status for t in again.tasks} == {"up to date"}
  # A changed input rebuilds what depends on it (and only that).
  (out / "qa_pairs" / "trecqa_wang" / "dev.csv").write_text("qtext,label,atext\nq,1,a\n")
  third = prepare.prepare(out_dir=str(out), source_dir=str(data_dir), offline=True, progress=False,
                          datasets=["trecqa", "wikiqa"])
  assert [d.counts() for d in third.datasets] == [{"present": 3, "copied": 1}, {"present": 2}]
  assert {(t.task, t.status) for t in third.tasks if t.task in ("st5_trecqa_positives", "st5_wikiqa_positives")} == {
      ("st5_trecqa_positives", "up to date"), ("st5_wikiqa_positives", "up to date")}


def test_prepare_downloads_from_a_mirror_and_builds(mirror, tmp_path, data_dir):
  report = prepare.prepare(out_dir=str(tmp_path), base_url=mirror, datasets=["trecqa", "wikiqa"], progress=False)
  assert report.ok, report.summary()
  assert [d.counts() for d in report.datasets] == [{"downloaded": 4}, {"downloaded": 2}]
  # The builders give 569 and 1040 pairs (train splits; TREC-QA dev too). The folder now holds the retrieval
  # sets' files (TREC-QA test and dev, WikiQA test) and no other evaluation set's: the prepared files lack the
  # examples sharing a text with those sets, counted with a normalisation of our own.
  norm = lambda t: re.sub(r"[\W_]+", "", unicodedata.normalize("NFKC", t).lower())  # noqa: E731
  present, evaluation = [], set()
  for name, spec in harness.TASKS.items():
    try:
      texts = spec.build(str(tmp_path))[0]
    except FileNotFoundError:
      continue
    present.append(name)
    evaluation |= {n for n in map(norm, texts) if n}
  assert present == ["WikiQA", "TREC-QA", "TREC-QA-dev"]
  built = {"st5_trecqa_positives": builders.build_trecqa(data_dir, stats=RowStats()).examples,
           "st5_wikiqa_positives": builders.build_wikiqa(data_dir, stats=RowStats()).examples}
  assert {t: len(ex) for t, ex in built.items()} == {"st5_trecqa_positives": 569, "st5_wikiqa_positives": 1040}
  assert (569, 1040) == (raw_counts.trecqa(data_dir)["distinct_positives"],
                         raw_counts.wikiqa(data_dir)["distinct_positives"])
  expected = {t: sum(1 for e in ex if not {norm(e["inputs"]), norm(e["targets"])} & evaluation)
              for t, ex in built.items()}
  assert {t.task: t.written for t in report.tasks} == expected == {"st5_trecqa_positives": 347,
                                                                   "st5_wikiqa_positives": 1035}


def test_prepare_reports_a_missing_dataset(mirror, tmp_path):
  report = prepare.prepare(out_dir=str(tmp_path), base_url=f"{mirror}/nothing-here", datasets=["trecqa"],
                           progress=False)
  assert not report.ok and len(report.errors) == 4 and not report.tasks
  assert "HTTP 404" in report.summary() and "Put a copy at" in report.summary()


def test_cli_prepare_list_and_nli_triples(data_dir, tmp_path, capsys, monkeypatch):
  rc = cli.main(["data", "prepare", "--source", str(data_dir), "--out", str(tmp_path / "d"), "--datasets",
                 "trecqa,t5_vocab", "--offline", "--no-progress"])
  out = capsys.readouterr().out
  assert rc == 0, out
  assert "st5_trecqa_positives (train)" in out and "export ST5_DATA_DIR=" in out
  # Without --source, $ST5_DATA_DIR is the local folder: unset, nothing can be found.
  monkeypatch.delenv("ST5_DATA_DIR")
  rc = cli.main(["data", "prepare", "--out", str(tmp_path / "e"), "--datasets", "squad_dev_reconstructed",
                 "--no-progress", "--offline"])
  captured = capsys.readouterr()
  assert rc == 1 and "Cannot get squad_v1.1_dev/dev-v1.1.reconstructed.json" in captured.out
  monkeypatch.setenv("ST5_DATA_DIR", str(data_dir))
  assert cli.main(["data", "list"]) == 0
  assert "st5_stage1_public_qa" in capsys.readouterr().out
  rc = cli.main(["data", "nli-triples", "--input", str(data_dir / "nli" / "snli_senteval_devtest" / "s1.test"),
                 "--out", str(tmp_path / "t.csv")])
  assert rc == 0 and "wrote 3167 triples" in capsys.readouterr().out
  assert raw_counts.snli_senteval(data_dir, "test")["per_entailment"] == 3167
  with contextlib.redirect_stderr(io.StringIO()):
    with pytest.raises(SystemExit):
      cli.main(["data", "prepare", "--bogus"])


TRIPLES = "nli/snli_devtest_triples_derived.csv"


def test_every_recipe_is_known_and_reads_catalogued_datasets():
  derived = [d for d in catalog.DATASETS.values() if d.derived]
  assert [d.name for d in derived] == ["snli_triples_derived"]
  for d in derived:
    assert d.derived.name in derive.RECIPES and set(d.derived.sources) <= set(catalog.CORE_DATASETS)
    assert not d.local_only and all(f.sha256 for f in d.files)


def _senteval_only(data_dir, root):
  """A source folder holding only the SentEval SNLI files (the triples' public source)."""
  for f in catalog.DATASETS["snli_senteval"].files:
    (root / f.relpath).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(data_dir / f.relpath, root / f.relpath)
  return root


def test_prepare_derives_the_triples_pulls_in_their_source_and_replaces_a_bad_copy(data_dir, tmp_path):
  source = _senteval_only(data_dir, tmp_path / "src")
  out = tmp_path / "out"
  (out / "nli").mkdir(parents=True)
  (out / TRIPLES).write_text("sent0,sent1,hard_neg,split\nstale,copy,here,dev\n")  # wrong bytes: replaced
  report = prepare.prepare(out_dir=str(out), source_dir=str(source), offline=True, progress=False,
                           datasets=["snli_triples_derived"])
  assert report.ok, report.summary()
  assert [(d.name, d.counts()) for d in report.datasets] == [("snli_senteval", {"copied": 6}),
                                                             ("snli_triples_derived", {"derived": 1})]
  assert (out / TRIPLES).read_bytes() == (data_dir / TRIPLES).read_bytes()
  assert download.sha256_of(str(out / TRIPLES)) == catalog.CHECKSUMS["snli_triples_derived"][TRIPLES]
  assert not [p for p in out.iterdir() if p.name.startswith(".derive-")]  # no scratch folder left
  assert {(t.task, t.split): t.written for t in report.tasks}[("st5_snli_devtest_triples", "all")] > 6000
  # A second run finds it present (verified) and derives nothing.
  again = prepare.prepare(out_dir=str(out), source_dir=str(source), offline=True, progress=False,
                          datasets=["snli_triples_derived"])
  assert [d.counts() for d in again.datasets] == [{"present": 6}, {"present": 1}]


def test_a_derived_dataset_without_its_source_says_which(data_dir, tmp_path):
  report = prepare.prepare(out_dir=str(tmp_path / "out"), source_dir=str(tmp_path / "empty"), offline=True,
                           progress=False, datasets=["snli_triples_derived"])
  assert not report.ok and not report.tasks
  assert any(e.startswith(f"Cannot derive {TRIPLES}: its source dataset(s) snli_senteval could not be got")
             for e in report.errors), report.errors
  assert not (tmp_path / "out" / TRIPLES).exists()


def test_derived_bytes_that_differ_from_the_catalogue_are_refused(data_dir, tmp_path, monkeypatch):
  source = _senteval_only(data_dir, tmp_path / "src")
  real = derive.RECIPES["snli_devtest_triples"]

  def changed_builder(data_dir, out_dir):  # as if a builder changed its output by one byte
    real(data_dir, out_dir)
    with open(f"{out_dir}/{TRIPLES}", "a", encoding="utf-8") as f:
      f.write(" ")

  monkeypatch.setitem(derive.RECIPES, "snli_devtest_triples", changed_builder)
  report = prepare.prepare(out_dir=str(tmp_path / "out"), source_dir=str(source), offline=True, progress=False,
                           datasets=["snli_triples_derived"])
  assert not report.ok
  (error,) = report.errors
  assert error.startswith(f"Derived {TRIPLES} has sha256 ") and "the catalogue lists f166a308" in error, error
  assert not (tmp_path / "out" / TRIPLES).exists()  # never written under its name


def test_default_prepare_skips_a_local_only_dataset_it_cannot_get(tmp_path):
  # squad_dev_reconstructed is core but local-only: without a copy at hand it is skipped, not an error.
  names, skipped = prepare._select(None, str(tmp_path), None)  # pylint: disable=protected-access
  assert skipped == ["squad_dev_reconstructed"] and "squad_dev_reconstructed" not in names
  assert names.index("snli_senteval") < names.index("snli_triples_derived")
  squad = catalog.DATASETS["squad_dev_reconstructed"].files[0]
  (tmp_path / squad.relpath).parent.mkdir(parents=True)
  (tmp_path / squad.relpath).write_text("{}")
  names, skipped = prepare._select(None, str(tmp_path), None)  # pylint: disable=protected-access
  assert "squad_dev_reconstructed" in names and not skipped
