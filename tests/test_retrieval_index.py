"""`st5 index`: shards, manifest, embeddings, a real SIGKILL and resume, two processes, refusals, corpus files."""

import gzip
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time

import flax.linen as nn
import jax
import numpy as np
import pytest

from xla_env import xla_flags
from st5_jax import SentenceEncoder, cli, configs
from st5_jax.checkpoints import native
from st5_jax.errors import BadRowError, InputFileError
from st5_jax.model import init_params
from st5_jax.retrieval import corpus_files
from st5_jax.retrieval import index as index_lib

SHARD_SIZE = 40
NUM_DOCS = 300  # 8 shards, the last one of 20
BATCH = 8  # per device: 16 rows a step on 2 devices, several batches a shard
WORDS = ("the of cat dog house river bank money tree light sound music city road car blue green old new quickly "
         "under above water stone paper").split()  # one token each
# Words a document of shard k has (one more with a title): shard 0 pads to the length bucket 8, shard 1 to 12,
# the rest to 16. Shard 1 compiles a new bucket, which keeps a window open between shard 0's JSON and shard
# 1's for the kill test to land in; three compiles a run in all.
SHARD_WORDS = (3, 8, 12, 12, 12, 12, 12, 12)


def _model(directory, vocab_path, seed):
  cfg = configs.ST5Config(t5=configs.t5_size("t5_tiny"), pooling="enc_mean", embedding_dim=16, max_length=64)
  params = jax.device_get(nn.unbox(init_params(cfg, jax.random.PRNGKey(seed))))
  native.save_model(directory, cfg, params, step=1, vocab_file=vocab_path)
  return str(directory)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, vocab_path):
  return _model(tmp_path_factory.mktemp("index_model"), vocab_path, seed=0)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """A BEIR corpus.jsonl: (path, ids, texts as BEIR joins title and text)."""
  rng = random.Random(0)
  path = tmp_path_factory.mktemp("index_corpus") / "corpus.jsonl"
  ids, texts, lines = [], [], []
  for i in range(NUM_DOCS):
    n = SHARD_WORDS[i // SHARD_SIZE]
    title = rng.choice(WORDS) if i % 3 else ""
    text = " ".join(rng.choice(WORDS) for _ in range(n))
    row = {"_id": f"doc{i}", "title": title, "text": text}
    if i % 7 == 0:
      row["metadata"] = {"url": f"http://example.com/{i}"}  # BEIR's extra keys are ignored
    lines.append(json.dumps(row))
    ids.append(f"doc{i}")
    texts.append((title + " " + text).strip())
  path.write_text("\n".join(lines) + "\n")
  return str(path), ids, texts


def _build_kwargs(model_dir, corpus):
  return dict(model=model_dir, corpus=[corpus[0]], shard_size=SHARD_SIZE, batch_size=BATCH)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, model_dir, corpus):
  """The uninterrupted one-process index (2 devices, as the subprocesses below have)."""
  out = tmp_path_factory.mktemp("index_ref") / "idx"
  start = time.perf_counter()
  report = index_lib.build_index(out=str(out), devices=jax.local_devices()[:2], **_build_kwargs(model_dir, corpus))
  print(f"reference index: {NUM_DOCS} documents in {time.perf_counter() - start:.1f}s")
  assert report.encoded == list(range(8)) and report.skipped == []
  return out


def _files(directory) -> dict[str, bytes]:
  return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))}


def _env(devices=2, **extra):
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags(devices), **extra)
  env.pop("JAX_COMPILATION_CACHE_DIR", None)  # compile for real: a cached executable shuts the kill window
  return env


def _index_cmd(model_dir, corpus, out):
  return [sys.executable, "-m", "st5_jax.cli", "index", "--model", model_dir, "--corpus", corpus[0], "--out", str(out),
          "--shard_size", str(SHARD_SIZE), "--batch_size", str(BATCH)]


def test_index_holds_the_sentence_encoder_embeddings_and_a_manifest(reference, model_dir, corpus):
  path, ids, texts = corpus
  manifest = json.loads((reference / "manifest.json").read_text())
  assert manifest["documents"] == NUM_DOCS and manifest["dim"] == 16 and manifest["dtype"] == "float32"
  assert manifest["shard_size"] == SHARD_SIZE and manifest["max_length"] == 64 and manifest["ann"] is None
  assert [s["count"] for s in manifest["shards"]] == [40] * 7 + [20]
  corpus_sha = hashlib.sha256(open(path, "rb").read()).hexdigest()
  assert manifest["corpus"]["files"] == [{"path": path, "format": "jsonl", "rows": NUM_DOCS, "sha256": corpus_sha}]
  assert manifest["model"]["path"] == model_dir and manifest["model"]["config"]["pooling"] == "enc_mean"
  assert manifest["model"]["fingerprint"] == index_lib.load_model(model_dir).fingerprint
  assert manifest["code_version"].startswith("st5_jax ")
  for shard in manifest["shards"]:
    emb = np.load(reference / f"{shard['name']}.npy")
    assert emb.dtype == np.float32 and emb.shape == (shard["count"], 16)
    assert hashlib.sha256(emb.tobytes()).hexdigest() == shard["sha256"]
    meta = json.loads((reference / f"{shard['name']}.json").read_text())
    assert meta["sha256"] == shard["sha256"] and meta["count"] == shard["count"]
    assert hashlib.sha256((reference / f"{shard['name']}.ids").read_bytes()).hexdigest() == meta["ids_sha256"]

  index = index_lib.Index.open(str(reference))
  assert index.ids == ids and len(index) == NUM_DOCS
  expected = SentenceEncoder.load(model_dir).encode(texts)
  np.testing.assert_allclose(index.embeddings(), expected, atol=1e-5)
  blocks = list(index.iter_blocks(64))  # blocks across shard boundaries
  assert [o for o, _ in blocks] == [0, 64, 128, 192, 256] and len(blocks[-1][1]) == 44
  np.testing.assert_array_equal(np.concatenate([b for _, b in blocks]), index.embeddings())


def test_killed_midway_and_rerun_is_byte_identical_and_reencodes_no_finished_shard(reference, model_dir, corpus,
                                                                                    tmp_path):
  out = tmp_path / "idx"
  proc = subprocess.Popen(_index_cmd(model_dir, corpus, out), env=_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE)
  deadline = time.monotonic() + 300
  while not (out.is_dir() and any(n.endswith(".json") for n in os.listdir(out))):
    assert proc.poll() is None, proc.communicate()[1].decode()[-3000:]
    assert time.monotonic() < deadline
    time.sleep(0.002)
  os.kill(proc.pid, signal.SIGKILL)
  proc.communicate(timeout=60)
  assert proc.returncode == -signal.SIGKILL
  finished = sorted(int(n[6:11]) for n in os.listdir(out) if n.startswith("shard-") and n.endswith(".json"))
  assert 1 <= len(finished) < 8 and not (out / "manifest.json").exists(), finished  # killed mid-way
  # What a kill during a write leaves: a temporary file, and a shard's embeddings without its JSON.
  unfinished = next(s for s in range(8) if s not in finished)
  (out / f".shard-{unfinished:05d}.npy.tmp-12345").write_bytes(b"half a file")
  (out / f"shard-{unfinished:05d}.npy").write_bytes(b"\x93NUMPY truncated")
  (out / ".manifest.json.tmp-12345").write_bytes(b"{")  # as a lead killed while writing the manifest leaves
  kept = {n: os.stat(out / n) for n in os.listdir(out) if n[:11] in {f"shard-{s:05d}" for s in finished}}

  lines = []  # the rerun in this process (its 2 devices encode as the subprocess's did)
  rerun = index_lib.build_index(out=str(out), devices=jax.local_devices()[:2], progress=lines.append,
                                **_build_kwargs(model_dir, corpus))
  assert rerun.skipped == finished and rerun.encoded == [s for s in range(8) if s not in finished]
  assert [line for line in lines if "skipped" in line] == [
      f"shard-{s:05d}: finished by an earlier run, skipped" for s in finished]
  for name, before in kept.items():  # not rewritten: same inode, same modification time
    after = os.stat(out / name)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns), name
  assert _files(out) == _files(reference)  # the same files (no temporary one left), the same bytes


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_two_processes_each_encode_their_shards_into_the_one_process_index(reference, model_dir, corpus, tmp_path):
  out = tmp_path / "idx2"
  port = _free_port()
  procs = [subprocess.Popen(_index_cmd(model_dir, corpus, out), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=_env(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2",
                                     JAX_PROCESS_ID=str(i))) for i in range(2)]
  logs = []
  for p in procs:
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err.decode()[-4000:]
    logs.append(err.decode())
  for i, log in enumerate(logs):
    assert f"process {i} of 2: encoded 4 shards" in log, log[-2000:]
    for s in range(8):  # shard s on process s % 2 only
      assert (f"shard-{s:05d}: {40 if s < 7 else 20} documents encoded" in log) == (s % 2 == i)
  assert _files(out) == _files(reference)


def test_an_index_of_another_model_corpus_or_shard_size_is_refused(reference, model_dir, corpus, tmp_path,
                                                                   vocab_path, capsys):
  out = tmp_path / "mixed"
  shutil.copytree(reference, out)
  os.remove(out / "manifest.json")  # the shards' JSONs alone are enough to refuse
  rc = cli.main(["index", "--model", model_dir, "--corpus", corpus[0], "--out", str(out), "--shard_size", "50"])
  err = capsys.readouterr().err.strip()
  assert rc == 2 and len(err.splitlines()) == 1
  assert "shard size 40" in err and "shard size 50" in err and "another --out" in err

  other = _model(tmp_path / "other_model", vocab_path, seed=1)
  with pytest.raises(index_lib.IndexMismatchError) as e:
    index_lib.build_index(out=str(reference), model=other, corpus=[corpus[0]], shard_size=SHARD_SIZE)
  assert model_dir in str(e.value) and other in str(e.value)

  edited = tmp_path / "corpus.jsonl"
  edited.write_text(open(corpus[0]).read().replace("doc5\"", "doc5b\""))
  with pytest.raises(index_lib.IndexMismatchError, match="corpus .*corpus.jsonl .*corpus .*corpus.jsonl"):
    index_lib.build_index(out=str(reference), model=model_dir, corpus=[str(edited)], shard_size=SHARD_SIZE)


def test_a_bad_corpus_row_is_one_line_exit_2(model_dir, tmp_path, capsys):
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"_id": "a", "text": "fine"}\n\n{"_id": "b", "text": "unclosed}\n')
  rc = cli.main(["index", "--model", model_dir, "--corpus", str(bad), "--out", str(tmp_path / "idx")])
  err = capsys.readouterr().err.strip()
  assert rc == 2 and len(err.splitlines()) == 1, err
  assert err.startswith("st5 index: error: ") and f"{bad}:3: not JSON" in err
  assert not (tmp_path / "idx").exists()  # refused before anything was written


def test_param_sharding_fsdp_and_another_batch_size_give_the_same_embeddings(reference, model_dir, corpus, tmp_path):
  head = tmp_path / "head.jsonl"  # shards 0 and 1 of the corpus: two length buckets to compile, not three
  head.write_text("".join(open(corpus[0]).readlines()[:2 * SHARD_SIZE]))
  report = index_lib.build_index(out=str(tmp_path / "fsdp"), model=model_dir, corpus=[str(head)], shard_size=30,
                                 batch_size=3, param_sharding="fsdp", devices=jax.local_devices())
  assert report.layout == "fsdp over 8 cpu device(s)" and report.encoded == [0, 1, 2]
  fsdp = index_lib.Index.open(str(tmp_path / "fsdp"))
  assert [s["count"] for s in fsdp.manifest["shards"]] == [30, 30, 20]
  expected = index_lib.Index.open(str(reference)).embeddings()[:2 * SHARD_SIZE]
  np.testing.assert_allclose(fsdp.embeddings(), expected, atol=1e-5)


def test_an_index_on_gcs_from_a_corpus_on_gcs(gcs, reference, model_dir, corpus, tmp_path):
  src = gcs.url("index", "corpus.jsonl")
  from st5_jax import paths
  paths.write_bytes(src, open(corpus[0], "rb").read())
  out = gcs.url("index", "idx")
  kw = dict(model=model_dir, corpus=[src], shard_size=SHARD_SIZE, batch_size=BATCH, devices=jax.local_devices()[:2])
  report = index_lib.build_index(out=out, **kw)
  assert report.encoded == list(range(8))
  local = _files(reference)
  for name, data in local.items():
    if name.endswith((".npy", ".ids")):  # the JSONs name the corpus file, here on gs://
      assert paths.read_bytes(f"{out}/{name}") == data, name
  manifest = json.loads(paths.read_text(f"{out}/manifest.json"))
  assert manifest["corpus"]["files"][0]["path"] == src
  assert manifest["corpus"]["fingerprint"] == json.loads(local["manifest.json"])["corpus"]["fingerprint"]
  index = index_lib.Index.open(out)
  assert index.ids == corpus[1]
  again = index_lib.build_index(out=out, **kw)
  assert again.encoded == [] and again.skipped == list(range(8))


# ------------------------------------------------------------------------------------------------ corpus files


def test_corpus_formats_ids_and_titles(tmp_path):
  (tmp_path / "c.tsv").write_text("p1\tfirst passage\n\np2\tsecond\r\n")
  (tmp_path / "dpr.tsv").write_text("id\ttext\ttitle\n7\tthe text\tThe Title\n")
  (tmp_path / "c.txt").write_text("line zero\n\n  line two  \n")
  (tmp_path / "ids.jsonl").write_text('{"id": 3, "text": " x "}\n{"id": "q4", "text": "y", "title": null}\n')
  with gzip.open(tmp_path / "c.jsonl.gz", "wt") as f:
    f.write('{"_id": "g", "title": "T", "text": "body"}\n')
  (tmp_path / "sniffed").write_text('{"_id": "s", "text": "json without extension"}\n')
  (tmp_path / "sniffed_tsv").write_text("s1\ttab separated\n")
  read = lambda name: corpus_files.read_all([str(tmp_path / name)])
  assert read("c.tsv") == (["p1", "p2"], ["first passage", "second"])
  assert read("dpr.tsv") == (["7"], ["The Title the text"])
  assert read("c.txt") == (["0", "2"], ["line zero", "line two"])  # ids: line numbers, blank lines counted
  assert read("ids.jsonl") == (["3", "q4"], ["x", "y"])
  assert read("c.jsonl.gz") == (["g"], ["T body"])
  assert read("sniffed") == (["s"], ["json without extension"])
  assert read("sniffed_tsv") == (["s1"], ["tab separated"])
  (tmp_path / "tabs.txt").write_text("a\tb\n")
  assert read("tabs.txt") == (["0"], ["a\tb"])  # .txt: plain text, tabs and all
  assert corpus_files.read_all([str(tmp_path / "tabs.txt")], fmt="tsv") == (["a"], ["b"])  # --format tsv
  assert corpus_files.expand(["a.tsv,b.tsv", "c.tsv"]) == ["a.tsv", "b.tsv", "c.tsv"]
  assert corpus_files.expand([str(tmp_path / "c.*")]) == [str(tmp_path / n) for n in ("c.jsonl.gz", "c.tsv", "c.txt")]
  with pytest.raises(InputFileError, match="no file matches"):
    corpus_files.expand([str(tmp_path / "nothing*.jsonl")])
  with pytest.raises(InputFileError, match="missing.jsonl does not exist"):
    corpus_files.scan([str(tmp_path / "missing.jsonl")])
  beir = tmp_path / "beir"
  beir.mkdir()
  (beir / "corpus.jsonl").write_text('{"_id": "d", "text": "t"}\n')
  scan = corpus_files.scan([str(beir), str(tmp_path / "c.tsv")])  # a BEIR folder: its corpus.jsonl
  assert [f.rows for f in scan.files] == [1, 2] and scan.rows == 3
  shards = list(corpus_files.iter_shards(scan, 2, [1]))
  assert shards == [(1, ["p2"], ["second"])]
  moved = tmp_path / "moved.tsv"
  shutil.copy(tmp_path / "c.tsv", moved)  # the fingerprint is of the content, not the path
  assert corpus_files.scan([str(beir), str(moved)]).fingerprint == scan.fingerprint
  assert corpus_files.scan([str(moved), str(beir)]).fingerprint != scan.fingerprint


@pytest.mark.parametrize("name,content,message", [
    ("a.jsonl", '{"_id": "x", "text": "t"}\n[1, 2]\n', ":2: a JSON list"),
    ("b.jsonl", '{"text": "no id"}\n', ":1: no _id or id"),
    ("c.jsonl", '{"_id": "x", "text": 5}\n', ":1: text is not a string"),
    ("d.jsonl", '{"_id": "x y", "text": "t"}\n', ":1: id 'x y' holds whitespace"),
    ("e.tsv", "a\tone\nb\ttwo\tthree\n", ":2: 3 tab-separated columns"),
    ("f.tsv", "a\tone\n\na\tagain\n", ":3: duplicate id 'a' (first at"),
    ("g.txt", "fine\n\xff\n", ":2: not UTF-8"),
])
def test_bad_rows_name_file_and_line(tmp_path, name, content, message):
  path = tmp_path / name
  path.write_bytes(content.encode("latin-1") if name.endswith(".txt") else content.encode())
  with pytest.raises(BadRowError) as e:
    corpus_files.scan([str(path)])
  assert str(e.value).startswith(f"{path}{message}") and "\n" not in str(e.value)
