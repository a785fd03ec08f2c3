"""A first run from nothing: `st5 data prepare --base-url` from an empty folder against a 127.0.0.1 mirror of the
public files that serves no derived file, then the README's main job and `st5 eval`'s readers on what it wrote; and
the one line `st5 train` says when the data is missing."""

import contextlib
import hashlib
import http.server
import io
import json
import os
import pathlib
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request

import pytest

from st5_jax import cli, paths
from st5_jax.data.offline import catalog, derive
from st5_jax.evaluation import harness

TRIPLES = "nli/snli_devtest_triples_derived.csv"
TRIPLES_SHA256 = "f166a30840177e9458ba9b9cc94eef040ff038301442181f56bcb50c4fc30121"  # ../shared/data/DATA.md
DERIVED = {f.relpath for d in catalog.DATASETS.values() if d.derived for f in d.files}
EVAL_TASKS = "sts,transfer,sentglue,geometry"  # `st5 eval`'s suites in the README
MAIN_JOB = ["train", "--gin_file", "st5_tiny_cpu.gin"]  # what launch/tpu_run.sh --gin st5_tiny_cpu.gin runs


def _sha256(path) -> str:
  return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def mirror(data_dir):
  """http://127.0.0.1:PORT serving the public files at their relative paths, 404 for every derived one."""
  requested = []

  class Handler(http.server.SimpleHTTPRequestHandler):

    def __init__(self, *args, **kwargs):
      super().__init__(*args, directory=str(data_dir), **kwargs)

    def do_GET(self):
      rel = urllib.parse.unquote(self.path.lstrip("/"))
      requested.append(rel)
      if rel in DERIVED:
        self.send_error(404, "derived files are not published")
        return
      super().do_GET()

    def log_message(self, *args):
      pass

  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  yield f"http://127.0.0.1:{server.server_address[1]}", requested
  server.shutdown()
  server.server_close()


@pytest.fixture(scope="module")
def first_run(mirror, tmp_path_factory):
  """(data folder, stdout, paths requested from the mirror) of `st5 data prepare --base-url MIRROR --out EMPTY`
  with no data folder configured."""
  url, requested = mirror
  out = tmp_path_factory.mktemp("first_run") / "data"
  start = len(requested)
  with pytest.MonkeyPatch.context() as mp:
    mp.delenv(paths.DATA_DIR_ENV)  # else prepare would copy from it (--source) instead of downloading
    mp.delenv(paths.VOCAB_ENV)
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
      rc = cli.main(["data", "prepare", "--base-url", url + "/", "--out", str(out), "--no-progress"])
  assert rc == 0, stdout.getvalue()
  return out, stdout.getvalue(), requested[start:]


def test_the_mirror_serves_no_derived_file(mirror, data_dir):
  url, _ = mirror
  with pytest.raises(urllib.error.HTTPError, match="404"):
    urllib.request.urlopen(f"{url}/{TRIPLES}")
  assert (data_dir / TRIPLES).exists() and DERIVED == {TRIPLES}


def test_prepare_from_an_empty_folder_downloads_and_derives(first_run, data_dir):
  out, stdout, requested = first_run
  # The triples are derived here from their public source, with the checksum DATA.md lists.
  assert _sha256(out / TRIPLES) == TRIPLES_SHA256 == catalog.CHECKSUMS["snli_triples_derived"][TRIPLES]
  assert f"{TRIPLES_SHA256}  {TRIPLES}" in (data_dir / "DATA.md").read_text(encoding="utf-8")
  assert TRIPLES not in requested  # never downloaded, not even tried
  recipe = catalog.DATASETS["snli_triples_derived"].derived
  assert recipe.sources == ("snli_senteval",) and recipe.name in derive.RECIPES
  row = next(line for line in stdout.splitlines() if line.startswith("snli_triples_derived "))
  # files, present, copied, downloaded, derived, lines
  assert row.split()[1:7] == ["1", "0", "0", "0", "1", "6340"], row
  # Every other core file came from the mirror; the local-only SQuAD reconstruction is skipped, not an error.
  downloadable = {f.relpath for name in catalog.CORE_DATASETS for f in catalog.DATASETS[name].files
                  if not catalog.DATASETS[name].derived and not catalog.DATASETS[name].local_only}
  assert set(requested) == downloadable
  assert "squad_dev_reconstructed    skipped: local-only" in stdout and not (out / "squad_v1.1_dev").exists()
  assert f"export ST5_DATA_DIR={out}" in stdout
  manifest = json.loads((out / "prepared" / "MANIFEST.json").read_text())
  assert manifest["datasets"]["snli_triples_derived"] == {TRIPLES: {"sha256": TRIPLES_SHA256, "verified": True}}
  assert manifest["tasks"]["st5_snli_devtest_triples"]["all"]["inputs"] == [TRIPLES]


def test_no_training_task_depends_on_a_local_only_dataset():
  # What makes skipping local-only datasets safe: prepare can always get what a training task reads (what the
  # default `st5 eval` suites read: test_st5_eval_reads_only_what_prepare_wrote).
  needed = {n for names in catalog.TASK_DATASETS.values() for n in names}
  assert not [n for n in needed if catalog.DATASETS[n].local_only]
  assert [d.name for d in catalog.DATASETS.values() if d.local_only] == ["squad_dev_reconstructed"]


_RECORDING: list[tuple[str, list[str]]] = []  # (folder prefix, files opened under it) while a test records


def _audit(event, args):
  if event == "open" and _RECORDING and isinstance(args[0], str):
    for prefix, opened in _RECORDING:
      if args[0].startswith(prefix):
        opened.append(args[0][len(prefix):])


sys.addaudithook(_audit)  # once per process (a hook cannot be removed): idle unless a test records


@contextlib.contextmanager
def _opened_under(root: pathlib.Path):
  """Yields the set of files (relative paths) opened under `root` inside the block."""
  opened: list[str] = []
  read: set[str] = set()
  _RECORDING.append((str(root) + os.sep, opened))
  try:
    yield read
  finally:
    _RECORDING.pop()
    read.update(opened)


@pytest.fixture(autouse=True)
def _fresh_gin():
  """`st5 train` run in this process parses gin: leave no bindings to the tests after these."""
  yield
  import gin  # pylint: disable=g-import-not-at-top
  gin.clear_config()


def _verified(out: pathlib.Path) -> dict[str, str]:
  """{relpath: sha256} of every raw file prepare verified, as its manifest records them."""
  manifest = json.loads((out / "prepared" / "MANIFEST.json").read_text())
  return {rel: e["sha256"] for files in manifest["datasets"].values() for rel, e in files.items() if e["verified"]}


def test_st5_eval_reads_only_what_prepare_wrote(first_run):
  out = first_run[0]
  # What `st5 eval --tasks sts,transfer,sentglue,geometry` reads before encoding, and STSBenchmarkDev: the main
  # job's STS-B dev evaluation (before and after training) reads it with the same reader (evaluation/sts.py).
  names = harness.resolve_tasks(EVAL_TASKS) + ["STSBenchmarkDev"]
  with _opened_under(out) as read:
    for name in names:
      texts, _ = harness.TASKS[name].build(str(out), kfold=2)
      assert texts, name
  verified = _verified(out)
  assert read and read <= set(verified), sorted(read - set(verified))
  assert all(_sha256(out / rel) == verified[rel] for rel in read)
  assert "stsb/original/sts-dev.csv" in read
  datasets = {name for name, d in catalog.DATASETS.items() for f in d.files if f.relpath in read}
  assert {"stsb", "sts12_16", "sick", "senteval_transfer", "glue"} <= datasets, datasets


def test_the_main_job_trains_on_the_prepared_folder(first_run, tmp_path, monkeypatch, capsys):
  out = first_run[0]
  monkeypatch.setenv(paths.DATA_DIR_ENV, str(out))
  monkeypatch.delenv(paths.VOCAB_ENV)
  workdir = tmp_path / "workdir"
  # Two steps of the README's run; its STS-B dev evaluation (~20 s more here) reads a file the test above reads.
  with _opened_under(out) as read:
    rc = cli.main(MAIN_JOB + ["--workdir", str(workdir), "--gin.TrainConfig.num_train_steps=2",
                              "--gin.TrainConfig.eval_every=-1", "--no_progress"])
  assert rc == 0, capsys.readouterr().err[-3000:]
  results = json.loads((workdir / "results.json").read_text())
  assert results["last_step"] == 2 and results["final_metrics"]["loss"] > 0
  assert (workdir / "spiece.model").read_bytes() == (out / paths.VOCAB_RELPATH).read_bytes()
  # The vocabulary and the triples (as the prepared split of its task) came from the folder, and nothing else.
  assert {paths.VOCAB_RELPATH, "prepared/st5_snli_devtest_triples/all.jsonl"} <= read, read
  prepared = {"prepared/MANIFEST.json", "prepared/st5_snli_devtest_triples/all.jsonl"}
  assert read <= set(_verified(out)) | prepared, sorted(read - set(_verified(out)) - prepared)


def _one_error_line(capsys) -> str:
  err = capsys.readouterr().err
  lines = [line for line in err.splitlines() if line.startswith("st5 train: error: ")]
  assert len(lines) == 1 and "Traceback" not in err, err
  return lines[0]


def test_without_data_the_main_job_names_the_one_command(tmp_path, monkeypatch, capsys, vocab_path):
  monkeypatch.delenv(paths.DATA_DIR_ENV)
  monkeypatch.delenv(paths.VOCAB_ENV)
  run = MAIN_JOB + ["--workdir", str(tmp_path / "w"), "--no_progress"]
  # Nothing configured: the vocabulary is the first file the run looks for.
  assert cli.main(run) == 2
  line = _one_error_line(capsys)
  assert "`st5 data prepare --out DIR`, then `export ST5_DATA_DIR=DIR`" in line, line
  # A data folder that lacks the files (here: empty) is named in the command.
  empty = tmp_path / "empty"
  empty.mkdir()
  monkeypatch.setenv(paths.DATA_DIR_ENV, str(empty))
  assert cli.main(run) == 2
  line = _one_error_line(capsys)
  assert f"`st5 data prepare --out {empty}`, then `export ST5_DATA_DIR={empty}`" in line, line
  # A vocabulary of one's own but no data folder: the tasks' data folder is what is missing.
  monkeypatch.delenv(paths.DATA_DIR_ENV)
  monkeypatch.setenv(paths.VOCAB_ENV, vocab_path)
  assert cli.main(run) == 2
  line = _one_error_line(capsys)
  assert line.startswith("st5 train: error: No data directory given: get the public data with "
                         "`st5 data prepare --out DIR`, then `export ST5_DATA_DIR=DIR`."), line
