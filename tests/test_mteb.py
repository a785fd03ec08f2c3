"""st5_jax.mteb: an mteb AbsEncoder with a ModelMeta; offline STS-B through mteb equals `st5 eval`'s."""

from __future__ import annotations

import json

import flax.linen as nn
import jax
import numpy as np
import pytest

from st5_jax import cli, configs
from st5_jax.checkpoints import native
from st5_jax.model import init_params


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, vocab_path):
  cfg = configs.ST5Config(t5=configs.t5_size("t5_tiny"), pooling="enc_mean", embedding_dim=16, max_length=32)
  params = jax.device_get(nn.unbox(init_params(cfg, jax.random.PRNGKey(0))))
  d = tmp_path_factory.mktemp("mteb") / "tiny_st5"
  native.save_model(d, cfg, params, step=7, vocab_file=vocab_path)
  return d


def test_load_gives_an_abs_encoder_with_model_meta(model_dir):
  from mteb.models.abs_encoder import AbsEncoder

  from st5_jax import mteb as st5_mteb

  model = st5_mteb.load(model_dir, max_length=24)
  assert isinstance(model, AbsEncoder)
  meta = model.mteb_model_meta
  assert meta.name == "st5_jax/tiny_st5" and meta.embed_dim == 16 and meta.max_tokens == 24
  assert meta.framework == ["JAX"] and meta.similarity_fn_name == "cosine" and meta.open_weights
  assert meta.license == "apache-2.0" and meta.reference == st5_mteb.PAPER
  assert meta.n_parameters == sum(x.size for x in jax.tree.leaves(model.model.params))
  assert meta.loader_kwargs == {"max_length": 24} and meta.revision == "step7"
  # mteb calls similarity() on encode()'s output: unit vectors, so cosine = dot.
  emb = model.model.encode(["a man plays", "a woman sings"])
  sims = model.similarity(emb, emb)
  assert abs(float(sims[0][0]) - 1) < 1e-5


def test_offline_stsb_in_mteb_matches_st5_eval_and_reaches_the_model_card(model_dir, data_dir, tmp_path, capsys):
  out = tmp_path / "results.json"
  rc = cli.main(["eval", "--model", str(model_dir), "--tasks", "STSBenchmark", "--mteb", "STSBenchmark",
                 "--data_dir", str(data_dir), "--output", str(out), "--mteb_output", str(tmp_path / "mteb")])
  assert rc == 0
  (result,) = json.loads(out.read_text())["models"].values()
  ours = result["tasks"]["STSBenchmark"]["main"]
  theirs = result["mteb"]["STSBenchmark"]
  assert theirs["metric"] == "cosine_spearman" and theirs["split"] == "test"
  assert abs(ours - theirs["main"]) < 1e-4, (ours, theirs["main"])
  assert abs(ours) > 5  # a random tiny model still ranks pairs; 0 would hide a broken comparison
  assert "## MTEB" in (tmp_path / "results.md").read_text()
  (mteb_file,) = (tmp_path / "mteb").rglob("STSBenchmark.json")  # mteb's own result file

  card_dir = tmp_path / "st"
  assert cli.main(["export", "--model", str(model_dir), "--format", "sentence-transformers", "--out", str(card_dir),
                   "--eval_results", str(out), "--eval_results", str(mteb_file)]) == 0
  card = (card_dir / "README.md").read_text()
  assert "## MTEB results" in card
  block = card[card.index("## MTEB results"):]
  assert f"| tiny_st5 | STSBenchmark | test | cosine_spearman | {theirs['main']:.2f} |" in block
  assert f"| mteb | STSBenchmark | test | main_score | {theirs['main']:.2f} |" in block
  capsys.readouterr()


def test_unknown_mteb_task_fails_before_loading(tmp_path, data_dir, capsys):
  rc = cli.main(["eval", "--model", str(tmp_path / "never_loaded"), "--mteb", "NoSuchTaskAnywhere",
                 "--data_dir", str(data_dir), "--output", str(tmp_path / "r.json")])
  assert rc == 2
  err = capsys.readouterr().err
  assert "st5 eval: error: unknown mteb task 'NoSuchTaskAnywhere'" in err and "Traceback" not in err


def test_prompts_by_mteb_prompt_type_and_truncate_dim(model_dir):
  from mteb.types import PromptType

  from st5_jax import SentenceEncoder
  from st5_jax import mteb as st5_mteb

  texts = ["a man plays a guitar", "what is T5?", ""]
  batches = [{"text": texts[:2]}, {"text": texts[2:]}]  # mteb's DataLoader: batches of {"text": [...]}
  sts = st5_mteb.local_tasks(["STSBenchmark"])[0].metadata  # type "STS"
  retrieval = sts.model_copy(update={"name": "SomeRetrieval", "type": "Retrieval"})
  plain = SentenceEncoder.load(model_dir)
  enc = SentenceEncoder(plain.config.replace(prompts={"query": "q: ", "document": "d: ", "STS": "sts: "}),
                        plain.params, tokenizer=plain.tokenizer)
  model = st5_mteb.wrap(enc, path=str(model_dir))
  assert model.mteb_model_meta.use_instructions and model.model_prompts == enc.prompts

  def run(meta, prompt_type):
    return model.encode(batches, task_metadata=meta, hf_split="test", hf_subset="default", prompt_type=prompt_type)

  # As mteb's sentence-transformers wrapper: the query side gets the "query" prompt, the document side the
  # "document" prompt, and a prompt named after the task type wins over both.
  np.testing.assert_allclose(run(retrieval, PromptType.query), enc.encode(texts, prompt="q: "), atol=1e-6)
  np.testing.assert_allclose(run(retrieval, PromptType.document), enc.encode(texts, prompt="d: "), atol=1e-6)
  np.testing.assert_allclose(run(retrieval, None), plain.encode(texts), atol=1e-6)  # no default prompt: none
  np.testing.assert_allclose(run(sts, PromptType.query), enc.encode(texts, prompt="sts: "), atol=1e-6)
  np.testing.assert_allclose(run(sts, None), enc.encode(texts, prompt="sts: "), atol=1e-6)

  # A default prompt applies where mteb has no side (STS), not to its queries and documents: those get the
  # query / document prompts, none here (a SentenceTransformer's empty "query" / "document" prompts).
  with_default = st5_mteb.wrap(SentenceEncoder(plain.config.replace(prompts={"c": "c: "}, default_prompt_name="c"),
                                               plain.params, tokenizer=plain.tokenizer), path=str(model_dir))
  np.testing.assert_allclose(with_default.encode(batches, task_metadata=sts, hf_split="test", hf_subset="default"),
                             enc.encode(texts, prompt="c: "), atol=1e-6)
  for side in (PromptType.query, PromptType.document):
    np.testing.assert_allclose(with_default.encode(batches, task_metadata=retrieval, hf_split="test",
                                                   hf_subset="default", prompt_type=side), plain.encode(texts),
                               atol=1e-6)

  truncated = st5_mteb.load(model_dir, truncate_dim=8)
  assert truncated.mteb_model_meta.embed_dim == 8 and truncated.mteb_model_meta.loader_kwargs == {"truncate_dim": 8}
  full = plain.encode(texts)
  np.testing.assert_allclose(truncated.encode(batches, task_metadata=retrieval, hf_split="test", hf_subset="default",
                                              prompt_type=PromptType.query),
                             full[:, :8] / np.linalg.norm(full[:, :8], axis=1, keepdims=True), rtol=1e-6, atol=1e-7)


def _beir(root, name, queries, documents, qrels):
  folder = root / name
  (folder / "qrels").mkdir(parents=True)
  (folder / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries.items()))
  (folder / "corpus.jsonl").write_text("".join(json.dumps({"_id": d, "title": "", "text": t}) + "\n"
                                               for d, t in documents.items()))
  (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t1\n" for q, d in qrels))
  return str(folder)


def test_export_with_a_contamination_report_fills_the_card_and_model_meta(model_dir, tmp_path, capsys):
  """`st5 data overlap --out` -> `st5 export --contamination_report` -> the card's Contamination section and mteb's
  ModelMeta (memory_usage_mb, training_datasets: the training task's MTEB name and the contaminated test set's),
  checked with mteb's own ModelMeta validation and zero-shot computation."""
  import shutil

  import mteb
  from mteb.models.model_meta import ModelMeta

  from st5_jax import mteb as st5_mteb

  scifact = _beir(tmp_path, "scifact", {"q1": "Does vitamin D prevent fractures?", "q2": "Is coffee bad for you?"},
                  {"d1": "Vitamin D and bone health.", "d2": "Coffee and the heart."}, [("q1", "d1"), ("q2", "d2")])
  nfcorpus = _beir(tmp_path, "nfcorpus", {"n1": "What lowers cholesterol?"}, {"e1": "Oats lower cholesterol."},
                   [("n1", "e1")])
  train = tmp_path / "train.jsonl"
  train.write_text(json.dumps({"query": "does vitamin d prevent fractures", "pos": "Vitamin D and bone health"}) + "\n")
  report = tmp_path / "report.json"
  assert cli.main(["data", "overlap", "--jsonl", str(train), "--beir", scifact, "--beir", nfcorpus,
                   "--out", str(report)]) == 1
  work = tmp_path / "work"
  shutil.copytree(model_dir, work)
  (work / "operative_config.gin").write_text("DataConfig.task = 'st5_snli_devtest_triples'\n")
  out = tmp_path / "st"
  assert cli.main(["export", "--model", str(work), "--format", "sentence-transformers", "--out", str(out),
                   "--contamination_report", str(report)]) == 0
  card = (out / "README.md").read_text()
  section = card[card.index("## Contamination"):card.index("## Evaluation")]
  for row in ("| scifact | test | SciFact | queries | 1 | 0 | 2 | 50.00% |",
              "| scifact | test | SciFact | documents | 1 | 0 | 2 | 50.00% |",
              "| scifact | test | SciFact | relevant documents | 1 | 0 | 2 | 50.00% |",
              "| nfcorpus | test | NFCorpus | queries | 0 | 0 | 1 | 0.00% |"):
    assert row in section, row
  assert "MTEB names of the training data: SNLI" in card and "): SciFact. The report is `contamination.json`." in section
  assert json.loads((out / "contamination.json").read_text()) == json.loads(report.read_text())
  assert json.loads((out / "training_data.json").read_text())["mteb_training_datasets"] == ["SNLI", "SciFact"]

  model = st5_mteb.load(out)
  meta = model.mteb_model_meta
  assert meta.training_datasets == {"SNLI", "SciFact"}
  params = model.model.params
  assert meta.memory_usage_mb == round(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params)) / 2**20) > 0
  # float32 parameters: mteb's own estimate from the parameter count agrees.
  assert meta.memory_usage_mb == ModelMeta._calculate_memory_usage_mb(meta.name, meta.n_parameters)
  # mteb's validation: the pydantic model round-trips, training datasets expand through its task graph, zero-shot.
  assert ModelMeta.model_validate(meta.model_dump()) == meta
  assert {"SNLI", "SciFact"} <= meta.get_training_datasets()
  assert meta.is_zero_shot_on(mteb.get_tasks(tasks=["SciFact"])) is False
  assert meta.is_zero_shot_on(["NFCorpus"]) is True and meta.zero_shot_percentage(["SciFact", "NFCorpus"]) == 50
  # Nothing known: None (mteb's "unknown"); a report given to load: its contaminated tasks.
  assert st5_mteb.load(model_dir).mteb_model_meta.training_datasets is None
  assert st5_mteb.load(model_dir, contamination_report=str(report)).mteb_model_meta.training_datasets == {"SciFact"}
  bad = tmp_path / "bad.json"
  bad.write_text('{"format": "something else"}')
  assert cli.main(["export", "--model", str(work), "--format", "sentence-transformers", "--out",
                   str(tmp_path / "never"), "--contamination_report", str(bad)]) == 2
  assert "not a contamination report" in capsys.readouterr().err
  assert not (tmp_path / "never").exists()


def test_mteb_names_of_our_tasks_and_test_sets_are_mtebs():
  """Every name the mapping gives is an mteb task or a name mteb's own model metas use for a dataset it has no task
  of; every task this project registers is mapped or declared the user's."""
  import mteb
  import seqio

  import st5_jax.tasks  # noqa: F401  (registers every task)
  from st5_jax.data.offline import contamination_names as names

  def is_task(name):
    try:
      mteb.get_task(name)
    except (KeyError, ValueError):
      return False
    return True

  in_metas = {d for m in mteb.get_model_metas() for d in (m.training_datasets or ())}
  for task, mapped in names.TASK_NAMES.items():
    for name in mapped:
      assert is_task(name) or name in in_metas, (task, name)
  for name in [*names.BEIR_NAMES.values(), *names.EVAL_NAMES.values(), *names.TASK_NAMES["consert_sts_sentences"]]:
    assert is_task(name), name
  assert not is_task("SNLI") and "SNLI" in in_metas and "MNLI" in in_metas  # a dataset, not a task, in mteb
  ours = {n for n in [*seqio.TaskRegistry.names(), *seqio.MixtureRegistry.names()]
          if n.startswith(("st5_", "consert_"))}
  assert ours - set(names.UNKNOWN_TASKS) == set(names.TASK_NAMES)
