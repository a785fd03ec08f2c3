"""`export_model`: any readable model -> SavedModel or sentence-transformers folder + model card."""

from __future__ import annotations

import logging
import os
import pathlib
import shutil
import time
from typing import Any, Sequence

from st5_jax import paths
from st5_jax.export import model_card, savedmodel, sentence_transformers, source
from st5_jax.export.formats import FORMATS

log = logging.getLogger(__name__)


def export_model(model: paths.PathLike, *, format: str, out: paths.PathLike,  # noqa: A002
                 vocab: str | None = None, pooling: str | None = None, max_length: int | None = None,
                 platforms: Sequence[str] | None = None, eval_results: Sequence[str] = (),
                 overwrite: bool = False, checkpoint: str = "auto", prompts: dict[str, str] | None = None,
                 default_prompt_name: str | None = None, truncate_dim: int | None = None,
                 contamination_report: str | None = None) -> dict[str, Any]:
  """Exports `model` (any format `SentenceEncoder.load` reads) to `out` (local or gs://); returns a summary.

  format: "savedmodel" or "sentence-transformers". `pooling` / `max_length` override the
  checkpoint's; `prompts` are added to the model's own (a name given replaces the model's),
  `default_prompt_name` / `truncate_dim` replace the model's (st5_jax.configs.ST5Config);
  `platforms` are the SavedModel's lowering targets (default cpu, cuda, tpu);
  `eval_results` are `st5 eval` results files quoted in the model card; `contamination_report` a
  `st5 data overlap --out` report, the card's Contamination section (copied as contamination.json). `checkpoint`: of a work dir,
  "latest", "best" or "auto" (best when early stopping kept one).
  """
  if format not in FORMATS:
    raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
  out_path = os.fspath(paths.path(out))  # local or gs://
  if paths.exists(out_path):
    if not overwrite:
      raise FileExistsError(f"{out_path} exists; pass overwrite=True (--overwrite) to replace it")
    if os.fspath(paths.path(model)) == out_path:
      raise ValueError("cannot export a model onto itself")
  for f in eval_results:
    if not paths.is_file(f):
      raise FileNotFoundError(f"evaluation results {f} do not exist")
  if contamination_report:
    from st5_jax.data.offline import contamination  # pylint: disable=g-import-not-at-top  (TensorFlow, datasketch)
    contamination.read_report(contamination_report)  # a bad report fails before the model loads
  start = time.perf_counter()
  src = source.load_source(model, vocab=vocab, pooling=pooling, max_length=max_length, checkpoint=checkpoint)
  src.config = src.config.replace(
      prompts={**src.config.prompt_dict, **(prompts or {})},
      default_prompt_name=default_prompt_name if default_prompt_name is not None else src.config.default_prompt_name,
      truncate_dim=truncate_dim if truncate_dim is not None else src.config.truncate_dim)
  if format == "sentence-transformers":
    if src.config.pooling == "layer_attention":
      # sentence-transformers pools only the last layer: export the removed-at-inference
      # form, and say so in the model card.
      src = source.remove_layer_attention(src)
      log.warning("%s uses layer_attention pooling, which sentence-transformers cannot express: exporting it "
                  "with the attention head removed (%s of the last layer, then the projection); the model "
                  "card says so. Pass --pooling enc_mean for the mean instead, or use --format savedmodel "
                  "for the full model.", model, src.config.pooling)
    sentence_transformers.check_exportable(src.config)  # before any writing
  loaded = time.perf_counter()
  num_params = int(sum(v.size for v in src.flat.values()))
  card = model_card.collect(config=src.config, source=src.path, source_format=src.format, step=src.step,
                            eval_results=eval_results, num_params=num_params,
                            trained_pooling=src.trained_pooling, contamination_report=contamination_report)
  name = paths.path(out_path).name
  # The writers write local files: a gs:// destination is written locally, then uploaded.
  with paths.staged_output(out_path) as local_out:
    target = pathlib.Path(local_out)
    # Written beside `out` and swapped in at the end: a failed export leaves the old one intact.
    staging = target.parent / f".{target.name}.export-{os.getpid()}"
    if staging.exists():
      shutil.rmtree(staging)
    flat, src.flat = src.flat, {}  # the exporter consumes the arrays (one copy of the weights)
    if format == "savedmodel":
      meta = {"source": src.path, "source_format": src.format, "step": src.step}
      stats = savedmodel.export(config=src.config, flat=flat, vocab_file=src.vocab_file, out=staging,
                                platforms=tuple(platforms or savedmodel.DEFAULT_PLATFORMS),
                                metadata=meta, consume=True)
    else:
      stats = sentence_transformers.export(config=src.config, flat=flat, vocab_file=src.vocab_file, out=staging)
    del flat
    model_card.write(staging, card, export_format=format, name=name)
    if target.exists():
      shutil.rmtree(target)
    os.replace(staging, target)
    size = sum(f.stat().st_size for f in target.rglob("*") if f.is_file())
  end = time.perf_counter()
  summary = {"out": out_path, "format": format, "source": src.path, "source_format": src.format,
             "pooling": src.config.pooling, "towers": src.config.towers, "output_dim": src.config.encode_dim,
             "prompts": src.config.prompt_dict, "truncate_dim": src.config.truncate_dim,
             "max_length": src.config.max_length, "num_params": num_params, "bytes": size,
             "vocab_file": src.vocab_file, "mteb_training_datasets": card.mteb_training_datasets,
             "load_seconds": round(loaded - start, 2),
             "export_seconds": round(end - loaded, 2), **{k: v for k, v in stats.items() if k.endswith("_seconds")}}
  log.info("exported %s -> %s (%s, %.1f MB) in %.1fs", src.path, out_path, format, size / 2**20, end - start)
  return summary
