"""`st5 data overlap` against public test sets (st5_jax.data.offline.contamination, contamination_beam): planted exact
and near duplicates of a BEIR folder's queries and documents are found, by side, at non-default settings; the Beam
DirectRunner writes the in-memory report; a token cache reads back as its texts; MTEB tasks from a local copy of their
Hugging Face dataset read as mteb reads them; bad input is one line.

The expected counts are re-derived here by brute force over every (training, test) pair, with a normalisation,
shingles and Jaccard written independently of the module (no LSH).
"""

import json
import re
import unicodedata

import pytest

from st5_jax import cli
from st5_jax.data import cache, registry
from st5_jax.data.offline import cache_writer, contamination, contamination_beam

THRESHOLD, NUM_PERM, SHINGLE = 0.6, 256, 4  # every setting off its default (0.8, 128, 5)

QUERIES = {  # id -> text; q5 is in queries.jsonl but judged in no qrels of the test split
    "q1": "How does the mitochondria produce energy for the cell?",
    "q2": "What is the effect of aspirin on cardiovascular mortality in elderly patients?",
    "q3": "Which genes regulate the circadian clock in fruit flies?",
    "q4": "Is vitamin D deficiency linked to bone fractures in older adults?",
    "q5": "Do cats dream about chasing mice at night?",
    "q6": "Can probiotics shorten the duration of the common cold?",
}
DOCUMENTS = {  # id -> (title, text)
    "d1": ("Hypertension", "Regular physical exercise lowers blood pressure in adults with hypertension."),
    "d2": ("Aspirin trial", "Low-dose aspirin did not reduce cardiovascular deaths among people over seventy."),
    "d3": ("", "Smoking during pregnancy increases the risk of low birth weight."),
    "d4": ("Sleep", "Short sleep duration predicts weight gain in adolescents over five years."),
    "d5": ("Clocks", "The period gene sets the pace of the circadian clock in Drosophila."),
    "d6": ("", "Probiotic supplements had no measurable effect on cold symptoms."),
}
QRELS = {"test": [("q1", "d1", 1), ("q2", "d2", 2), ("q3", "d5", 1), ("q4", "d3", 0), ("q6", "d6", 1)],
         "dev": [("q5", "d4", 1)]}
TRAINING = [  # (text, what it plants)
    ("How do the mitochondria produce energy for cells", "q1 near, just above"),
    ("What's the effect of aspirin on the cardiovascular mortality of older patients?", "q2 near, just below"),
    ("effect of aspirin on cardiovascular mortality in elderly people", "q2 near, above: q2's best match"),
    ("WHICH genes regulate the circadian-clock in fruit flies", "q3 exact"),
    ("Is a lack of vitamin D tied to broken bones in the elderly?", "q4, far"),
    ("do cats dream about chasing mice at night", "q5 exact, but q5 is not judged in test"),
    ("Regular physical exercise reduces blood pressure in adults with hypertension.", "d1 near (its text), relevant"),
    ("Low-dose aspirin did not reduce cardiovascular deaths among people over seventy!", "d2 exact (text only)"),
    ("Smoking while pregnant increases the risk of a low birth weight.", "d3 near at 0.5, below 0.6; q4 judged it 0"),
    ("Sleep: short sleep duration predicts weight gain in adolescents over five years", "d4 exact (title + text)"),
    ("An unrelated sentence about the weather in Paris.", "nothing"),
]


# ----------------------------------------------------------------------------- the independent reference


def _norm(text):
  return re.sub(r"[\W_]+", "", unicodedata.normalize("NFKC", text).lower())


def _grams(n, k):
  return {n} if len(n) <= k else {n[i:i + k] for i in range(len(n) - k + 1)}


def _jaccard(a, b, k):
  x, y = _grams(a, k), _grams(b, k)
  return len(x & y) / len(x | y)


def _expected(training, threshold, k, split="test", *, mteb=False):
  """{side: (exact ids, near ids, total)} by brute force over every pair. The queries: those with a relevant
  document in the split (BEIR's and st5 eval's), or (mteb=True) every query in its qrels (mteb's loader)."""
  judged = {}
  for qid, did, score in QRELS[split]:
    judged.setdefault(qid, {})[did] = score
  queries = {q: [_norm(t)] for q, t in QUERIES.items()
             if q in judged and (mteb or any(s > 0 for s in judged[q].values()))}
  relevant = {d for q in queries for d, s in judged[q].items() if s > 0}
  documents = {d: list(dict.fromkeys(v for v in (_norm(f"{t} {x}" if t else x), _norm(x)))) for d, (t, x) in
               DOCUMENTS.items()}
  train = {_norm(t) for t in training}

  def classify(items):
    exact, near = set(), set()
    for i, variants in items.items():
      if train & set(variants):
        exact.add(i)
      elif max(_jaccard(t, v, k) for t in train for v in variants) >= threshold:
        near.add(i)
    return exact, near

  q, d = classify(queries), classify(documents)
  return {"queries": (q[0], q[1], len(queries)), "documents": (d[0], d[1], len(DOCUMENTS)),
          "relevant_documents": (d[0] & relevant, d[1] & relevant, len(relevant))}


def _write_beir(root, *, queries=True):
  root.mkdir(parents=True)
  with open(root / "corpus.jsonl", "w", encoding="utf-8") as f:
    for did, (title, text) in DOCUMENTS.items():
      f.write(json.dumps({"_id": did, "title": title, "text": text}) + "\n")
  if queries:
    with open(root / "queries.jsonl", "w", encoding="utf-8") as f:
      for qid, text in QUERIES.items():
        f.write(json.dumps({"_id": qid, "text": text}) + "\n")
  (root / "qrels").mkdir()
  for split, rows in QRELS.items():
    (root / "qrels" / f"{split}.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{s}\n" for q, d, s in rows))
  return str(root)


@pytest.fixture(scope="module")
def beir_dir(tmp_path_factory):
  return _write_beir(tmp_path_factory.mktemp("beir") / "scifact")


@pytest.fixture(scope="module")
def train_file(tmp_path_factory):
  path = tmp_path_factory.mktemp("train") / "pairs.jsonl"
  texts = [t for t, _ in TRAINING]
  with open(path, "w", encoding="utf-8") as f:  # {query, pos: [...], neg: [...]}, as `st5 data mine` writes
    for i in range(0, len(texts), 3):
      f.write(json.dumps({"query": texts[i], "pos": texts[i + 1:i + 2], "neg": texts[i + 2:i + 3], "n": i}) + "\n")
  return str(path)


def _sides(report):
  (test_set,) = report["test_sets"]
  return test_set["sides"]


def _ids(side, kind):
  return {e["id"] for e in side[f"{kind}_examples"]}


SETTINGS = contamination.Settings(near_threshold=THRESHOLD, num_perm=NUM_PERM, shingle=SHINGLE, show=10)


# ----------------------------------------------------------------------------- tests


def test_planted_exact_and_near_duplicates_are_counted_by_side_at_the_threshold(beir_dir, train_file):
  texts = [t for t, _ in TRAINING]
  # The plants are where their names say, by the reference's own Jaccard (character 4-grams).
  j = {what: max(_jaccard(_norm(t), _norm(v), SHINGLE) for v in (QUERIES | {k: x for k, (_, x) in DOCUMENTS.items()}
                                                                  ).values()) for t, what in TRAINING}
  assert 0.6 <= j["q1 near, just above"] < 0.65 and 0.5 < j["q2 near, just below"] < 0.6
  assert 0.5 <= j["d3 near at 0.5, below 0.6; q4 judged it 0"] < 0.6 and j["d1 near (its text), relevant"] > 0.7
  plan = contamination.plan_training(jsonl=[train_file])
  test_sets, _ = contamination.read_test_sets(beir=[beir_dir])
  for threshold in (THRESHOLD, 0.5):  # d3's plant (0.507) is in at 0.5, out at 0.6
    settings = contamination.Settings(near_threshold=threshold, num_perm=NUM_PERM, shingle=SHINGLE, show=10)
    report = contamination.check(plan, test_sets, settings)
    want = _expected(texts, threshold, SHINGLE)
    for side, (exact, near, total) in want.items():
      got = _sides(report)[side]
      assert (_ids(got, "exact"), _ids(got, "near"), got["total"]) == (exact, near, total), (threshold, side)
      assert (got["exact"], got["near"], got["contaminated"]) == (len(exact), len(near), len(exact | near))
      assert got["fraction"] == pytest.approx(len(exact | near) / total)
  report = contamination.check(plan, test_sets, SETTINGS)
  sides = _sides(report)
  assert (_ids(sides["queries"], "exact"), _ids(sides["queries"], "near")) == ({"q3"}, {"q1", "q2"})
  assert (_ids(sides["documents"], "exact"), _ids(sides["documents"], "near")) == ({"d2", "d4"}, {"d1"})
  assert (_ids(sides["relevant_documents"], "exact"), _ids(sides["relevant_documents"], "near")) == ({"d2"}, {"d1"})
  # q5 is judged in dev only, q4 judged d3 not relevant (0), so neither is a test query; d3 is no relevant document.
  assert sides["relevant_documents"]["total"] == 4 and sides["queries"]["total"] == 4
  # Each test text by its best match: q2's is the plant above the threshold, with the reference's Jaccard; near
  # examples lowest Jaccard first.
  near = sides["queries"]["near_examples"]
  assert [e["id"] for e in near] == ["q1", "q2"] and near[0]["jaccard"] <= near[1]["jaccard"]
  assert near[1]["training_text"] == "effect of aspirin on cardiovascular mortality in elderly people"
  assert near[1]["jaccard"] == pytest.approx(_jaccard(_norm(near[1]["training_text"]), _norm(QUERIES["q2"]), SHINGLE),
                                             abs=1e-4)
  assert report["test_sets"][0]["mteb_name"] == "SciFact" and report["contaminated"]
  assert report["training"]["texts"] == len(texts) and report["settings"]["lsh_bands"] * \
      report["settings"]["lsh_rows"] <= NUM_PERM
  # At the defaults (0.8, 5-grams, 128 permutations) only the exact copies and d1's one-word change remain.
  default = _sides(contamination.check(plan, test_sets, contamination.Settings()))
  want = _expected(texts, 0.8, 5)
  assert {s: (_ids(default[s], "exact"), _ids(default[s], "near")) for s in want} == {
      s: (e, n) for s, (e, n, _) in want.items()}
  # show=1 keeps one example per side and kind; the counts stay.
  one = _sides(contamination.check(plan, test_sets, contamination.Settings(THRESHOLD, NUM_PERM, SHINGLE, show=1)))
  assert len(one["queries"]["near_examples"]) == 1 and one["queries"]["near"] == 2
  # --jsonl_fields: only the named fields are training text (here the queries: q1, q2's below plant, q4 far ...).
  only = contamination.check(contamination.plan_training(jsonl=[train_file], jsonl_fields=["query"]), test_sets,
                             SETTINGS)
  assert only["training"]["texts"] == len(texts[::3])
  assert _ids(_sides(only)["queries"], "near") == {i for i in ("q1", "q2", "q3") if i in
                                                   _expected(texts[::3], THRESHOLD, SHINGLE)["queries"][1]}


def test_qrels_split_picks_the_test_queries_and_relevant_documents(beir_dir, train_file):
  plan = contamination.plan_training(jsonl=[train_file])
  test_sets, _ = contamination.read_test_sets(beir=[f"{beir_dir}:dev"])
  sides = _sides(contamination.check(plan, test_sets, SETTINGS))
  want = _expected([t for t, _ in TRAINING], THRESHOLD, SHINGLE, split="dev")
  assert (_ids(sides["queries"], "exact"), sides["queries"]["total"]) == (want["queries"][0], 1) == ({"q5"}, 1)
  assert (_ids(sides["relevant_documents"], "exact"), sides["relevant_documents"]["total"]) == ({"d4"}, 1)
  assert test_sets[0].split == "dev"


@pytest.fixture(scope="module")
def token_cache(tmp_path_factory):
  """A tiny cache of the training texts as (q, a) pairs, written with a prompt on the query side."""
  root = tmp_path_factory.mktemp("cache")
  rows = root / "rows.jsonl"
  texts = [t for t, _ in TRAINING]
  with open(rows, "w", encoding="utf-8") as f:
    for i in range(0, len(texts) - 1, 2):
      f.write(json.dumps({"q": texts[i], "a": texts[i + 1]}) + "\n")
    f.write(json.dumps({"q": texts[-1], "a": texts[0]}) + "\n")
  registry.register_user_task("test_contamination_cache", file_pattern=str(rows), columns={"inputs": "q", "targets": "a"})
  cache_writer.write_cache("test_contamination_cache", "train", cache.task_dir(str(root / "out"),
                                                                                "test_contamination_cache", "train"),
                           2, {"inputs": 64, "targets": 64}, decontaminate=False, prompts={"query": "query: "})
  return str(root / "out")


def test_token_cache_is_decoded_back_to_its_texts(token_cache, train_file, beir_dir):
  plan = contamination.plan_training(caches=[token_cache])  # the --out root: <task>/<split>/ found below it
  assert [u.kind for u in plan.units] == ["cache", "cache"] and plan.sources[0]["task"] == "test_contamination_cache"
  decoded, count = contamination.distinct_texts(plan)
  # Every text, with the query prompt the cache was written with taken off again.
  assert set(decoded) == {_norm(t) for t, _ in TRAINING} and count == 12
  test_sets, _ = contamination.read_test_sets(beir=[beir_dir])
  from_cache = contamination.check(plan, test_sets, SETTINGS)
  from_file = contamination.check(contamination.plan_training(jsonl=[train_file]), test_sets, SETTINGS)
  counts = lambda r: {s: (c["exact"], c["near"]) for s, c in _sides(r).items()}
  assert counts(from_cache) == counts(from_file)
  with pytest.raises(contamination.ContaminationError, match="another vocabulary"):
    contamination.plan_training(caches=[token_cache], vocab=_other_vocab(token_cache))


def _other_vocab(tmp):
  """A SentencePiece model other than the cache's (trained here, tiny)."""
  import os  # pylint: disable=g-import-not-at-top
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  prefix = os.path.join(tmp, "other")
  spm.SentencePieceTrainer.train(sentence_iterator=iter([t for t, _ in TRAINING] * 20), model_prefix=prefix,
                                 vocab_size=60, model_type="unigram", minloglevel=2)
  return prefix + ".model"


def test_beam_direct_runner_writes_the_in_memory_report(beir_dir, train_file, token_cache, tmp_path, capsys):
  plan = contamination.plan_training(jsonl=[train_file], caches=[token_cache])
  test_sets, _ = contamination.read_test_sets(beir=[beir_dir])
  memory = contamination.check(plan, test_sets, SETTINGS)
  assert memory["contaminated"] and memory["training"]["texts"] == 2 * len(TRAINING) + 1
  # `st5 data overlap --runner DirectRunner` (a Beam flag passed on after it) writes the same report.
  out = tmp_path / "beam.json"
  assert cli.main(["data", "overlap", "--jsonl", train_file, "--cache", token_cache, "--beir", beir_dir,
                   "--near_threshold", str(THRESHOLD), "--num_perm", str(NUM_PERM), "--shingle", str(SHINGLE),
                   "--show", "10", "--out", str(out), "--runner", "DirectRunner", "--direct_num_workers=1"]) == 1
  assert "(Beam, " in capsys.readouterr().err
  assert contamination.read_report(str(out)) == json.loads(json.dumps(memory))
  # A corrupt line: the same one-line error, the first in input order, after the run.
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"query": "fine"}\n{"query": "broken\n{"query": "again"\n')
  later = tmp_path / "later.jsonl"
  later.write_text('not json\n')
  plan = contamination.plan_training(jsonl=[str(bad), str(later)])
  with pytest.raises(contamination.ContaminationError) as in_memory:
    contamination.check(plan, test_sets, SETTINGS)
  with pytest.raises(contamination.ContaminationError) as in_beam:
    contamination_beam.check_beam(plan, test_sets, SETTINGS)
  assert str(in_memory.value) == str(in_beam.value) and str(in_beam.value).startswith(f"{bad}:2: not valid JSON")


def test_command_report_exit_status_and_one_line_errors(beir_dir, train_file, tmp_path, capsys):
  out = tmp_path / "report.json"
  rc = cli.main(["data", "overlap", "--jsonl", train_file, "--beir", beir_dir, "--near_threshold", str(THRESHOLD),
                 "--num_perm", str(NUM_PERM), "--shingle", str(SHINGLE), "--show", "10", "--out", str(out)])
  text = capsys.readouterr().out
  assert rc == 1 and "Contamination found." in text and "SciFact" in text
  report = contamination.read_report(str(out))
  test_sets, _ = contamination.read_test_sets(beir=[beir_dir])
  assert report == json.loads(json.dumps(contamination.check(contamination.plan_training(jsonl=[train_file]),
                                                             test_sets, SETTINGS)))
  line = next(x for x in text.splitlines() if "relevant_documents" in x)
  assert line.split()[3:7] == ["1", "1", "4", "50.00%"]
  clean = tmp_path / "clean.jsonl"
  clean.write_text(json.dumps({"text": "Nothing here is in the test set."}) + "\n")
  assert cli.main(["data", "overlap", "--jsonl", str(clean), "--beir", beir_dir, "--json"]) == 0
  assert json.loads(capsys.readouterr().out)["contaminated"] is False

  no_queries = _write_beir(tmp_path / "no_queries", queries=False)
  corrupt = tmp_path / "corrupt.jsonl"
  corrupt.write_text('{"text": "ok"}\n\n["a list"]\n')
  cases = [
      (["--jsonl", train_file, "--beir", str(tmp_path / "missing")], "no such folder"),
      (["--jsonl", train_file, "--beir", no_queries], "queries.jsonl: the queries file is missing"),
      (["--jsonl", str(corrupt), "--beir", beir_dir], f"{corrupt}:3: a JSON list, not an object"),
      (["--jsonl", str(tmp_path / "none.jsonl"), "--beir", beir_dir], "no such file"),
      (["--jsonl", train_file, "--beir", f"{beir_dir}:train"], "no qrels for split 'train'"),
      (["--jsonl", train_file, "--beir", beir_dir, "--near_threshold", "1.5"], "near_threshold must be in (0, 1]"),
      (["--jsonl", train_file, "--beir", beir_dir, "--project", "p"], "Beam flags need --runner"),
      (["--cache", str(tmp_path), "--beir", beir_dir], "no token cache there"),
      (["--beir", beir_dir], "no training data"),
      (["--jsonl", train_file, "--mteb_task", str(tmp_path / "nope")], "is not a folder"),
  ]
  for args, message in cases:
    assert cli.main(["data", "overlap", *args]) == 2, args
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("st5 data overlap: error: ") and message in err[0], (args, err)


def _hf_dataset(root, configs):
  """A local copy of a Hugging Face dataset as mteb's are laid out: parquet per config and split, README configs."""
  from datasets import Dataset  # pylint: disable=g-import-not-at-top
  card = ["---", "configs:"]
  for config, (folder, split, columns) in configs.items():
    (root / folder).mkdir(parents=True, exist_ok=True)
    Dataset.from_dict(columns).to_parquet(str(root / folder / f"{split}-00000-of-00001.parquet"))
    card += [f"- config_name: {config}", "  data_files:", f"  - split: {split}", f"    path: {folder}/{split}-*"]
  (root / "README.md").write_text("\n".join(card + ["---", ""]))
  return str(root)


def test_mteb_tasks_from_local_hugging_face_datasets_read_as_mteb_reads_them(train_file, tmp_path, capsys,
                                                                              monkeypatch):
  import datasets  # pylint: disable=g-import-not-at-top
  import mteb  # pylint: disable=g-import-not-at-top
  judged = [(q, d, s) for q, d, s in QRELS["test"]]
  scifact = _hf_dataset(tmp_path / "hub" / "scifact", {
      "corpus": ("corpus", "corpus", {"_id": list(DOCUMENTS), "title": [t for t, _ in DOCUMENTS.values()],
                                      "text": [x for _, x in DOCUMENTS.values()]}),
      "queries": ("queries", "queries", {"_id": list(QUERIES), "text": list(QUERIES.values())}),
      "default": ("data", "test", {"query-id": [q for q, _, _ in judged], "corpus-id": [d for _, d, _ in judged],
                                   "score": [s for _, _, s in judged]})})
  sts = _hf_dataset(tmp_path / "hub" / "my-sts", {"default": ("data", "test", {
      "sentence1": [QUERIES["q3"], "A man plays a guitar."], "sentence2": ["A woman sings.", DOCUMENTS["d6"][1]],
      "score": [1.0, 2.0]})})
  # mteb itself, pointed at the folder, reads the same queries and documents (through a fresh `datasets` cache:
  # the default one is keyed by the folder's name, and another test's "scifact" may be in it).
  monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
  task = mteb.get_task("SciFact")
  task.metadata = task.metadata.model_copy(update={"dataset": {**task.metadata.dataset, "path": scifact}})
  task.load_data()
  theirs = task.dataset["default"]["test"]
  test_sets, _ = contamination.read_test_sets(mteb=[scifact, f"STS12={sts}"])
  ours = {s: {i.id for i in test_sets[0].items if i.side == s} for s in ("queries", "documents")}
  assert ours == {"queries": set(theirs["queries"]["id"]), "documents": set(theirs["corpus"]["id"])}
  assert [t.mteb_name for t in test_sets] == ["SciFact", "STS12"]  # the first named by its dataset's folder
  # The counts of the same data as a BEIR folder, but for the queries mteb keeps (q4, judged 0, too); the STS task's
  # sentences as texts.
  plan = contamination.plan_training(jsonl=[train_file])
  report = contamination.check(plan, test_sets, SETTINGS)
  want = _expected([t for t, _ in TRAINING], THRESHOLD, SHINGLE, mteb=True)
  assert want["queries"][2] == 5
  got = report["test_sets"][0]["sides"]
  assert {s: (_ids(got[s], "exact"), _ids(got[s], "near"), got[s]["total"]) for s in want} == want
  texts = report["test_sets"][1]["sides"]["texts"]
  assert (texts["total"], texts["exact"], [e["test_text"] for e in texts["exact_examples"]]) == (4, 1, [QUERIES["q3"]])
  assert cli.main(["data", "overlap", "--jsonl", train_file, "--mteb_task", f"NoSuchTask={sts}"]) == 2
  assert "'NoSuchTask' is not an mteb task name" in capsys.readouterr().err
