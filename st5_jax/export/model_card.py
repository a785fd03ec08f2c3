"""README.md of an export: what the model is, where it came from, how well it does, how to load it.

Everything is read from files the project writes (st5_config.json, train_config.json,
results.json, operative_config.gin and config_history.json in a work dir; `st5 eval` results
files; a `st5 data overlap --out` contamination report); anything absent is reported as not recorded
rather than guessed. The training settings are the ones the run started with, followed by every change a
resume made (the history).

Beside README.md an export holds `training_data.json` (the training tasks, their MTEB names and the MTEB
names of the report's contaminated test sets: what st5_jax.mteb puts in `ModelMeta.training_datasets`)
and, when a report was given, `contamination.json` (the report itself).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import pathlib
import re
from typing import Any, Sequence

from st5_jax import __version__, configs, paths
from st5_jax.checkpoints import native
from st5_jax.checkpoints.savedmodel import prompt_signature_key
from st5_jax.configs import ST5Config
from st5_jax.data.offline import contamination_names

log = logging.getLogger(__name__)

README = "README.md"
TRAINING_DATA = "training_data.json"  # the training tasks and their MTEB names, machine-readable
CONTAMINATION = "contamination.json"  # the contamination report given at export, as given
_POOLING_TEXT = {
    "enc_first": "encoder output of the first token (ST5-Enc first)",
    "enc_mean": "mean of the encoder outputs over non-padding tokens (ST5-Enc mean)",
    "encdec_first": "first decoder output, the decoder fed only the start token (ST5-EncDec first)",
    "layer_attention": ("layer-wise attention pooling (Oh et al. 2022): attention over the states of every "
                        "encoder layer, queried by each layer's first token, concatenated with the last "
                        "layer's first token, then a tanh dense layer"),
}
# Fields that do not change the weights or the math of inference.
_NUMERICS = ("dtype", "scan_layers", "remat_policy", "dropout_rate")


# ST5Config.towers, as the card's Model table says it.
_TOWERS_TEXT = {
    "shared": "`shared`: one tower encodes queries and documents",
    "projection": "`projection` (asymmetric): one T5 with a projection per side; `encode_query` uses the query "
                  "projection, `encode_document` and `encode` without a task the document one",
    "separate": "`separate` (asymmetric): a whole tower per side (t5x_retrieval's ADE); `encode_query` uses the query "
                "tower, `encode_document` and `encode` without a task the document one",
}


def size_name(t5: configs.T5Config) -> str | None:
  """The named size (configs.SIZES) with this architecture, if any."""
  strip = {f: getattr(configs.T5Config(), f) for f in _NUMERICS}
  for name, cfg in configs.SIZES.items():
    if cfg.replace(**strip) == t5.replace(**strip):
      return name
  return None


def _read_json(path: paths.PathLike) -> dict[str, Any] | None:
  try:
    value = json.loads(paths.read_text(path))
  except (OSError, ValueError) as e:
    if paths.exists(path):
      log.warning("model card: cannot read %s: %s", path, e)
    return None
  return value if isinstance(value, dict) else None


def _gin_values(text: str, key: str) -> list[str]:
  """Quoted string values bound to `...key = 'x'` (or lists of them) in a gin file."""
  out = []
  for m in re.finditer(rf"^\s*[\w.]*\b{re.escape(key)}\s*=\s*(.+)$", text, re.MULTILINE):
    out += re.findall(r"['\"]([^'\"]+)['\"]", m[1])
  return out


RETRIEVAL_MEASURES = ("MRR@10", "nDCG@10", "Recall@100")


def _results_models(path: str) -> dict[str, Any]:
  payload = _read_json(path)
  if payload is None:
    raise FileNotFoundError(f"evaluation results {path} are missing or not JSON")
  return (payload.get("models") if "models" in payload else {pathlib.Path(path).stem: payload}) or {}


def _eval_rows(path: str) -> list[tuple[str, str, str, float]]:
  """(model, task, metric, main value) rows of an `st5 eval` results file (retrieval tasks: `_retrieval_rows`)."""
  rows = []
  for name, result in _results_models(path).items():
    for task, res in (result.get("tasks") or {}).items():
      if isinstance(res, dict) and isinstance(res.get("main"), (int, float)) and "MRR@10" not in res:
        rows.append((name, task, str(res.get("metric") or ""), float(res["main"])))
  return rows


def _retrieval_rows(path: str) -> list[tuple[str, str, int, tuple[float, ...]]]:
  """(model, task, queries, RETRIEVAL_MEASURES) rows of the retrieval tasks of an `st5 eval` results file."""
  rows = []
  for name, result in _results_models(path).items():
    for task, res in (result.get("tasks") or {}).items():
      if isinstance(res, dict) and all(isinstance(res.get(m), (int, float)) for m in RETRIEVAL_MEASURES):
        rows.append((name, task, int(res.get("n_queries") or 0), tuple(float(res[m]) for m in RETRIEVAL_MEASURES)))
  return rows


def _mteb_rows(path: str) -> list[tuple[str, str, str, str, float]]:
  """(model, task, split, metric, main x100) rows of MTEB results in a results file.

  Either an `st5 eval --mteb` results JSON (the "mteb" block of each model) or one of
  mteb's own per-task result files (`task_name` + `scores`, main_score in [0, 1]).
  """
  payload = _read_json(path)
  if payload is None:
    raise FileNotFoundError(f"evaluation results {path} are missing or not JSON")
  rows = []
  if "task_name" in payload and isinstance(payload.get("scores"), dict):
    for split, entries in payload["scores"].items():
      mains = [e["main_score"] for e in entries if isinstance(e.get("main_score"), (int, float))]
      if mains:
        rows.append(("mteb", str(payload["task_name"]), split, "main_score", 100 * sum(mains) / len(mains)))
    return rows
  models = payload.get("models") if "models" in payload else {pathlib.Path(path).stem: payload}
  for name, result in (models or {}).items():
    for task, res in ((result or {}).get("mteb") or {}).items():
      if isinstance(res, dict) and isinstance(res.get("main"), (int, float)):
        rows.append((name, task, str(res.get("split") or ""), str(res.get("metric") or ""), float(res["main"])))
  return rows


@dataclasses.dataclass
class CardInfo:
  """What the card says; every field may be unknown (None / empty)."""

  config: ST5Config
  source: str
  source_format: str
  step: int | None = None
  base_checkpoint: str | None = None
  training_data: list[str] = dataclasses.field(default_factory=list)
  train_config: dict[str, Any] | None = None
  # Changes of bindings across resumes (st5_jax/provenance.py): [{step, time, host, allowed_by, bindings}].
  config_history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
  train_results: dict[str, Any] | None = None
  eval_rows: list[tuple[str, str, str, float]] = dataclasses.field(default_factory=list)
  retrieval_rows: list[tuple[str, str, int, tuple[float, ...]]] = dataclasses.field(default_factory=list)
  mteb_rows: list[tuple[str, str, str, str, float]] = dataclasses.field(default_factory=list)
  num_params: int | None = None
  # Set when the export pools differently from training (a removed layer-attention head).
  trained_pooling: str | None = None
  # A `st5 data overlap --out` report (st5_jax.data.offline.contamination), when given at export.
  contamination: dict[str, Any] | None = None

  @property
  def mteb_training_datasets(self) -> list[str] | None:
    """ModelMeta.training_datasets: MTEB names of the training tasks and of the report's contaminated test sets."""
    names = contamination_names.training_datasets(self.training_data, self.contamination)
    return sorted(names) if names is not None else None

  def training_record(self) -> dict[str, Any]:
    """What `training_data.json` holds."""
    mapped, unmapped = contamination_names.task_names(self.training_data)
    return {"tasks": list(self.training_data), "task_mteb_names": sorted(mapped), "unmapped_tasks": unmapped,
            "contaminated_mteb_names": sorted(contamination_names.report_names(self.contamination)),
            "mteb_training_datasets": self.mteb_training_datasets,
            "contamination_report": CONTAMINATION if self.contamination is not None else None}


def training_tasks(root: str, train_results: dict[str, Any] | None = None) -> list[str]:
  """The training tasks a work dir records: its operative gin's task bindings, else results.json's task."""
  gin_file = paths.join(root, "operative_config.gin")
  gin_text = paths.read_text(gin_file) if paths.is_file(gin_file) else ""
  tasks = list(dict.fromkeys(_gin_values(gin_text, "task")))
  if not tasks and train_results and train_results.get("task"):
    tasks = [str(train_results["task"])]
  return tasks


def recorded_training(path: paths.PathLike) -> tuple[list[str], dict[str, Any] | None]:
  """(training tasks, contamination report) that a model folder records: an export's training_data.json and
  contamination.json, else a work dir's or model folder's operative gin (no report)."""
  folder = os.fspath(path)
  record = _read_json(paths.join(folder, TRAINING_DATA))
  if record is not None:
    report = _read_json(paths.join(folder, CONTAMINATION)) if record.get("contamination_report") else None
    return [str(t) for t in record.get("tasks") or []], report
  root = native.root(folder)
  if root is None:
    return [], None
  return training_tasks(root, _read_json(paths.join(root, "results.json"))), None


def collect(*, config: ST5Config, source: str, source_format: str, step: int | None = None,
            eval_results: Sequence[str] = (), num_params: int | None = None,
            trained_pooling: str | None = None, contamination_report: str | None = None) -> CardInfo:
  """Gathers what is known about the model at `source` (robust to missing files); `contamination_report`: a
  `st5 data overlap --out` report (a bad one is a ContaminationError)."""
  info = CardInfo(config=config, source=str(source), source_format=source_format, step=step,
                  num_params=num_params, trained_pooling=trained_pooling)
  if contamination_report:
    from st5_jax.data.offline import contamination  # pylint: disable=g-import-not-at-top  (TensorFlow, datasketch)
    info.contamination = contamination.read_report(contamination_report)
  root = native.root(source) if source_format == "native" else None
  if root is not None:
    info.train_config = _read_json(paths.join(root, "train_config.json"))
    history = _read_json(paths.join(root, "config_history.json")) or {}
    info.config_history = list(history.get("changes") or (info.train_config or {}).get("config_history") or [])
    info.train_results = _read_json(paths.join(root, "results.json"))
    gin_file = paths.join(root, "operative_config.gin")
    gin_text = paths.read_text(gin_file) if paths.is_file(gin_file) else ""
    info.base_checkpoint = (info.train_results or {}).get("init_from") or next(
        iter(_gin_values(gin_text, "init_from")), None)
    info.training_data = training_tasks(root, info.train_results)
  elif source_format in ("hf", "t5x", "sentence_transformers", "savedmodel") and paths.is_file(
      paths.join(source, TRAINING_DATA)):  # an earlier export of ours: what it recorded
    info.base_checkpoint = str(source)
    info.training_data, recorded = recorded_training(source)
    info.contamination = info.contamination or recorded
  elif source_format in ("hf", "t5x", "sentence_transformers", "savedmodel"):
    info.base_checkpoint = str(source)
  # Evaluations recorded by a training run (STS-B dev) come first, then `st5 eval` files.
  for key, value in (info.train_results or {}).items():  # the dev metrics before and after training
    metric, _, when = key.rpartition("_")
    if when in ("before", "after") and metric and isinstance(value, (int, float)) and not isinstance(value, bool):
      label = "STS-B dev" if metric == "stsb_dev_spearman" else metric.split("/")[0]
      measure = "spearman" if metric == "stsb_dev_spearman" else metric.split("/")[-1]
      info.eval_rows.append(("training run", f"{label}, {when} training", measure, float(value)))
  for path in eval_results:
    payload = _read_json(path) or {}
    if not ("task_name" in payload and "scores" in payload):  # not one of mteb's own result files
      info.eval_rows += _eval_rows(path)
      info.retrieval_rows += _retrieval_rows(path)
    info.mteb_rows += _mteb_rows(path)
  return info


def _unknown(value: Any, what: str = "not recorded in the source") -> str:
  return str(value) if value not in (None, "", [], {}) else f"unknown ({what})"


def _architecture(cfg: ST5Config) -> str:
  t5 = cfg.t5
  family = "T5.1.1 (gated GELU)" if len(t5.mlp_activations) == 2 else f"T5 1.0 ({t5.mlp_activations[0]})"
  name = size_name(t5)
  layers = f"{t5.num_encoder_layers} encoder" + (f" + {t5.num_decoder_layers} decoder" if cfg.uses_decoder else "")
  return (f"{family}{f', size `{name}`' if name else ''}: d_model {t5.emb_dim}, d_ff {t5.mlp_dim}, "
          f"{t5.num_heads} heads x {t5.head_dim}, {layers} layers, vocabulary {t5.vocab_size}")


def _prompt_usage(fmt: str, cfg: ST5Config) -> str:
  """How to encode with the prompts (empty without prompts)."""
  if not cfg.prompts:
    return ""
  first = cfg.prompts[0][0]
  key = prompt_signature_key(first)
  if fmt == "savedmodel":
    return (f"\nWith a prompt: the signature `{key}` (each prompt has one: `prompt_` + its name) prepends the "
            f"`{first}` prompt, e.g. `model.signatures[\"{key}\"](inputs=tf.constant([\"...\"]))[\"outputs\"]`; "
            "`model(x)` and `serving_default` "
            + (f"prepend the default prompt `{cfg.default_prompt_name}`.\n" if cfg.default_prompt_name
               else "prepend none.\n"))
  return (f"\nWith a prompt: `model.encode(texts, prompt_name=\"{first}\")`, or `model.encode_query(texts)` / "
          "`model.encode_document(texts)`.\n")


def _usage(fmt: str, name: str, dim: int, cfg: ST5Config | None = None) -> str:
  prompts = _prompt_usage(fmt, cfg) if cfg is not None else ""
  if fmt == "savedmodel":
    return f"""TensorFlow (no JAX needed; `tensorflow_text` registers the SentencePiece ops):

```python
import tensorflow as tf
import tensorflow_text  # noqa: F401

model = tf.saved_model.load("{name}")
embeddings = model(tf.constant(["A sentence.", "Another one."]))[0]  # float32 [2, {dim}]
# or the serving signature (TF Serving, other languages): inputs -> outputs
embeddings = model.signatures["serving_default"](inputs=tf.constant(["A sentence."]))["outputs"]
```

TF Hub / Keras, as the public ST5 models:

```python
import tensorflow_hub as hub
encoder = hub.KerasLayer("{name}")
embeddings = encoder(tf.constant(["A sentence."]))[0]
```

st5_jax (`st5 encode --model {name} ...` or):

```python
from st5_jax import SentenceEncoder
embeddings = SentenceEncoder.load("{name}").encode(["A sentence."])
```

Other signatures: `tokenize` (inputs -> int32 tokens, EOS appended, zero padded) and
`encode_tokens` (tokens -> outputs). The vocabulary is `assets/spiece.model`.
{prompts}"""
  return f"""sentence-transformers:

```python
from sentence_transformers import SentenceTransformer
model = SentenceTransformer("{name}")
embeddings = model.encode(["A sentence.", "Another one."])  # float32 [2, {dim}]
```

Hugging Face transformers (the T5 encoder only; pooling, projection and normalisation
are the `1_Pooling`, `2_Dense` and `3_Normalize` modules):

```python
from transformers import T5EncoderModel, T5Tokenizer
encoder, tokenizer = T5EncoderModel.from_pretrained("{name}"), T5Tokenizer.from_pretrained("{name}")
```

st5_jax: `SentenceEncoder.load("{name}")`, or `st5 encode --model {name} ...`.
{prompts}"""


def render(info: CardInfo, *, export_format: str, name: str = ".") -> str:
  """The card's Markdown (with Hugging Face-style front matter)."""

  cfg = info.config
  library = "sentence-transformers" if export_format == "sentence-transformers" else "tensorflow"
  lines = ["---", f"library_name: {library}", "pipeline_tag: sentence-similarity",
           "tags:", "- sentence-t5", "- sentence-similarity", "- feature-extraction", f"- {cfg.pooling}",
           "---", "",
           f"# Sentence-T5 encoder ({cfg.pooling}, {cfg.encode_dim} dimensions)", "",
           f"Exported with `st5 export --format {export_format}` (st5_jax {__version__}) on "
           f"{datetime.date.today().isoformat()} from `{info.source}` ({info.source_format} format"
           + (f", step {info.step}" if info.step is not None else "") + ").", "",
           "## Model", "",
           "| | |", "|---|---|",
           f"| Architecture | {_architecture(cfg)} |",
           f"| Pooling | `{cfg.pooling}`: {_POOLING_TEXT[cfg.pooling]} |",
           "| Projection | " + (f"dense {cfg.t5.emb_dim} -> {cfg.embedding_dim}, no bias" if cfg.embedding_dim
                               else "none (pooled T5 outputs)") + " |",
           *([f"| Towers | {_TOWERS_TEXT[cfg.towers]} |"] if cfg.asymmetric else []),
           f"| Normalisation | {'L2 (unit-length embeddings; dot product = cosine)' if cfg.normalize else 'none'} |",
           f"| Max sequence length | {cfg.max_length} tokens, EOS included (longer inputs are truncated) |",
           "| Tokenizer | T5 SentencePiece vocabulary; EOS (id 1) appended, padding id 0 |"]
  if cfg.truncate_dim is not None:
    lines.append(f"| Truncated | the first {cfg.truncate_dim} of {cfg.output_dim} dimensions"
                 + (", renormalised to unit length |" if cfg.normalize else " |"))
  if info.num_params:
    lines.append(f"| Parameters | {info.num_params:,} |")
  if cfg.prompts:
    lines += ["", "## Prompts", "",
              "Prepended to the text before tokenisation (they count in the max sequence length); "
              "`encode_query` uses `query`, `encode_document` `document` (each none when the model has no such prompt)"
              + (f"; `encode` without a prompt uses `{cfg.default_prompt_name}`." if cfg.default_prompt_name
                 else "; `encode` without a prompt adds none."), "",
              "| Name | Prompt |", "|---|---|"]
    lines += [f"| `{name}` | `{json.dumps(text)}` |" for name, text in cfg.prompts]
  if info.trained_pooling and info.trained_pooling != cfg.pooling:
    lines += ["", "## Pooling differs from training", "",
              f"This model was trained with `{info.trained_pooling}` pooling "
              f"({_POOLING_TEXT[info.trained_pooling]}). This export **removes that attention head at "
              f"inference**: it pools with `{cfg.pooling}` ({_POOLING_TEXT[cfg.pooling]}) and applies the "
              "trained projection, so its embeddings are not those of the trained model (training scores "
              "quoted below are the full model's). The paper reports that the gain of layer-wise attention "
              "pooling survives this removal; st5_jax's docs/results.md measures what it keeps. The full "
              "model exports with `st5 export --format savedmodel`."]
  tc, tr = info.train_config or {}, info.train_results or {}
  steps = tr.get("last_step", info.step)
  lines += ["", "## Training", "",
            f"- Base checkpoint: {_unknown(info.base_checkpoint)}",
            f"- Training data: {_unknown(', '.join(info.training_data))}",
            f"- Steps: {_unknown(steps)}" + (f" of {tc['num_train_steps']}" if tc.get("num_train_steps") else "")
            + (f", global batch size {tc['global_batch_size']}" if tc.get("global_batch_size") else "")]
  if tc:
    opt = tc.get("optimizer") or {}
    details = [f"{k} {v}" for k, v in (("temperature", tc.get("temperature")),
                                       ("bidirectional loss", tc.get("bidirectional")),
                                       ("seed", tc.get("seed"))) if v is not None]
    if isinstance(opt, dict) and opt:
      details.append("optimizer " + ", ".join(f"{k}={v}" for k, v in opt.items() if not isinstance(v, dict)))
    if details:
      lines.append(f"- Settings{' at the start' if info.config_history else ''}: {'; '.join(details)}")
  for entry in info.config_history:  # what resumes changed, in order (config_history.json)
    changes = "; ".join(f"`{c.get('binding')}` {c.get('before')} -> {c.get('after')}"
                        for c in entry.get("bindings") or [] if isinstance(c, dict))
    lines.append(f"- Changed from step {entry.get('step')} ({entry.get('allowed_by')}, {entry.get('time')}): "
                 f"{changes}")
  if tr.get("interrupted_by"):
    lines.append(f"- Note: the last run was interrupted by {tr['interrupted_by']}")
  mapped, unmapped = contamination_names.task_names(info.training_data)
  if info.training_data:
    lines.append("- MTEB names of the training data: " + (", ".join(sorted(mapped)) or "none")
                 + (f" (no MTEB name known for {', '.join(unmapped)})" if unmapped else ""))
  if info.contamination is not None:
    lines += _contamination_lines(info)
  lines += ["", "## Evaluation", ""]
  if info.eval_rows:
    lines += ["| Model | Task | Metric | Score |", "|---|---|---|---:|"]
    lines += [f"| {m} | {t} | {metric or '-'} | {v:.2f} |" for m, t, metric, v in info.eval_rows]
  else:
    lines.append("See the MTEB results below." if info.mteb_rows else
                 "No evaluation results were recorded for this model (run `st5 eval --model DIR --output "
                 "results.json` and re-export with `--eval_results results.json` to include them).")
  if info.retrieval_rows:
    lines += ["", "## Retrieval", "",
              "`st5 eval --tasks retrieval`: each task's queries ranked against its whole corpus by exact search "
              "(fractions in [0, 1]).", "",
              "| Model | Task | Queries | " + " | ".join(RETRIEVAL_MEASURES) + " |",
              "|---|---|---:|" + "---:|" * len(RETRIEVAL_MEASURES)]
    lines += [f"| {m} | {t} | {n} | " + " | ".join(f"{v:.3f}" for v in vals) + " |"
              for m, t, n, vals in info.retrieval_rows]
  if info.mteb_rows:
    lines += ["", "## MTEB results", "",
              "Scored with [MTEB](https://github.com/embeddings-benchmark/mteb) (`st5 eval --mteb`); main score x100.",
              "", "| Model | Task | Split | Metric | Score |", "|---|---|---|---|---:|"]
    lines += [f"| {m} | {t} | {split or '-'} | {metric or '-'} | {v:.2f} |" for m, t, split, metric, v in info.mteb_rows]
  lines += ["", "## How to load", "", _usage(export_format, name, cfg.encode_dim, cfg).rstrip(), ""]
  return "\n".join(lines)


def _contamination_lines(info: CardInfo) -> list[str]:
  """The card's Contamination section: the report's counts and fractions per test set and side."""
  report = info.contamination
  s, t = report.get("settings", {}), report.get("training", {})
  sources = ", ".join(f"{x.get('kind')} `{x.get('name')}`" for x in t.get("sources", []))
  lines = ["", "## Contamination", "",
           f"The training data ({sources or 'sources not recorded'}: {t.get('texts', 0):,} texts, "
           f"{t.get('distinct_texts', 0):,} distinct after normalisation) checked with `st5 data overlap` against "
           f"public test sets: exact matches of the normalised text (NFKC, lower case, letters and digits) and near "
           f"duplicates, Jaccard >= {s.get('near_threshold')} of {s.get('shingles')} (MinHash LSH, "
           f"{s.get('num_perm')} permutations, each candidate verified). Each test text counts once, by its best "
           "match; a document also counts among the relevant documents when a test query judges it relevant.", "",
           "| Test set | Split | MTEB name | Side | Exact | Near | Total | Contaminated |",
           "|---|---|---|---|---:|---:|---:|---:|"]
  for test_set in report.get("test_sets", []):
    for side, c in test_set.get("sides", {}).items():
      lines.append(f"| {test_set.get('name')} | {test_set.get('split') or '-'} | {test_set.get('mteb_name') or '-'} "
                   f"| {side.replace('_', ' ')} | {c['exact']:,} | {c['near']:,} | {c['total']:,} | "
                   f"{100 * c['fraction']:.2f}% |")
  names = sorted(contamination_names.report_names(report))
  lines += ["", "MTEB tasks with any contamination (listed as trained on in `ModelMeta.training_datasets`, "
            f"`{TRAINING_DATA}`): {', '.join(names) if names else 'none'}. The report is `{CONTAMINATION}`."]
  return lines


def write(directory: str | os.PathLike, info: CardInfo, *, export_format: str, name: str | None = None) -> str:
  """README.md, training_data.json and (with a report) contamination.json into `directory`; returns the card's path."""
  folder = pathlib.Path(directory)
  path = folder / README
  path.write_text(render(info, export_format=export_format, name=name or str(directory)), encoding="utf-8")
  (folder / TRAINING_DATA).write_text(json.dumps(info.training_record(), indent=1) + "\n", encoding="utf-8")
  if info.contamination is not None:
    (folder / CONTAMINATION).write_text(json.dumps(info.contamination, indent=1, sort_keys=True, ensure_ascii=False)
                                        + "\n", encoding="utf-8")
  return str(path)

