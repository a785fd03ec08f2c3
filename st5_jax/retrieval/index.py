"""A corpus index: the embeddings of every document, in fixed-size shards, written resumably over processes.

    build_index(model="workdirs/st5", corpus=["corpus.jsonl"], out="index/")   # `st5 index`
    from_embeddings("index/", ids, emb_NxD)        # embeddings made elsewhere (benchmarks): no model
    index = Index.open("index/")     # index.ids, index.embeddings(), index.iter_blocks(n), index.load_ann()

Layout of an index folder (local or gs://):

  shard-00000.npy    float32 [n, D] embeddings of documents [0, shard_size) in corpus order
  shard-00000.ids    their ids, one a line
  shard-00000.json   count, sha256 of the embedding bytes and of the ids file, the model and corpus
                     fingerprints and the shard size: written last, so it marks the shard finished
  ...
  ann.faiss          the ANN index, when one was asked for (retrieval/ann.py)
  quantized.npy      with --precision int8|uint8|binary|ubinary: the whole corpus as st5_jax.quantize codes
                     ([N, D] int8 / uint8, or [N, ceil(D/8)] packed bits), searched by `st5 search --precision`
  quantized_ranges.npy  int8 / uint8: the float32 [2, D] per-dimension min and max of the corpus the codes use
  manifest.json      written last, by the lead: model (path, fingerprint, config), corpus (files, their sha256,
                     fingerprint), dim, dtype, shard size and list, max_length, the ANN's kind and parameters,
                     the quantized copy's precision and sha256, the code version. No times, hosts or process
                     counts: two builds of the same index are the same bytes.

A model with prompts (st5_model.prompts) encodes the documents with `encode_document`'s prompt (its
"document" prompt, if any) and `st5 search` the queries with `encode_query`'s (its "query" prompt). A
model with a truncate_dim stores that many (renormalised) dimensions.

Processes: shard s is encoded by process s % P, on that process's own devices (a mesh of
jax.local_devices()); no collective crosses processes, so processes never wait on one another until the
barrier before the manifest. Each process parses, tokenises and encodes only its shards' documents (it
streams past the others' rows, counting them). Parameters are replicated over the local devices and the
batch split over them: encoding needs no communication per layer that way, and an inference tower is small
next to a device's memory (ST5-XL's encoder, 1.2B parameters, is 4.8 GB in float32). `param_sharding="fsdp"`
(and "auto" when the float32 parameters exceed a quarter of a device's memory, e.g. ST5-XXL's 19 GB encoder on
a 16 GB v5e chip) splits the parameters' embed axis over the local devices instead (the training layout,
st5_jax/partitioning.py); XLA then all-gathers each layer's weights per batch.

Resumable: a rerun skips every shard whose JSON, embeddings and ids are there and match (same model
fingerprint, corpus fingerprint and shard size; hashes recomputed); anything else of a process's shards,
temporary files of a killed write included, is removed and redone. Files are written whole (a temporary
file renamed locally; GCS objects appear on close), the shard's JSON last. Killed at any point and rerun, the
folder ends with the bytes of an uninterrupted run (same device count and batch size: batches split the same
way) and no finished shard is encoded twice. An --out holding an index of another model, corpus or shard size is refused
(IndexMismatchError), naming both.

Length buckets as `st5 encode`: each shard's documents sorted by token length, batches padded to the fine
buckets (8, 12, 16, 24, ...), one compile per bucket, the next batch dispatched before the last is fetched.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import json
import logging
import os
import time
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from st5_jax import paths
from st5_jax.parts import dumps as _dumps
from st5_jax.parts import read_json as _read_json
from st5_jax.parts import sha256 as _sha256
from st5_jax.retrieval import ann as ann_lib
from st5_jax.retrieval import corpus_files

log = logging.getLogger(__name__)

FORMAT = "st5-index/1"
MANIFEST = "manifest.json"
QUANTIZED_FILE = "quantized.npy"
RANGES_FILE = "quantized_ranges.npy"
DEFAULT_SHARD_SIZE = 65536
PARAM_SHARDINGS = ("auto", "replicated", "fsdp")
FSDP_MEMORY_FRACTION = 0.25  # auto: fsdp when float32 parameters exceed this share of a device's memory


class IndexMismatchError(ValueError):
  """--out holds (part of) an index of another model, corpus or shard size."""


def shard_name(s: int) -> str:
  return f"shard-{s:05d}"


def _array_sha256(a: np.ndarray) -> str:
  """sha256 of the array's bytes in C order (not of the .npy header)."""
  return _sha256(np.ascontiguousarray(a).reshape(-1).view(np.uint8).data)


# ------------------------------------------------------------------------------------------------ the model


@dataclasses.dataclass
class LoadedModel:
  """A JAX model's parameters on the host, its tokenizer and what identifies it."""

  path: str  # as given
  resolved: str  # the folder loaded (a work dir's best/ when --checkpoint chose it)
  config: Any  # ST5Config (max_length already set)
  params: Any  # numpy parameter tree
  tokenizer: Any
  vocab_file: str
  source: str
  params_sha256: str
  vocab_sha256: str

  @property
  def fingerprint(self) -> str:
    """sha256 of parameters, config (pooling, max_length, dtype, ...) and vocabulary: what the embeddings depend on."""
    return _sha256(f"{self.params_sha256}\n{self.config.to_json()}\n{self.vocab_sha256}".encode())

  def to_json(self) -> dict:
    return {"path": self.path, "resolved": self.resolved, "source": self.source, "fingerprint": self.fingerprint,
            "params_sha256": self.params_sha256, "vocab_sha256": self.vocab_sha256,
            "config": self.config.to_dict()}


def params_sha256(params: Any) -> str:
  """sha256 over the parameters' names, dtypes, shapes and bytes, names sorted."""
  from st5_jax.checkpoints import tree  # pylint: disable=g-import-not-at-top

  h = hashlib.sha256()
  for name, value in sorted(tree.flatten(params).items()):
    a = np.asarray(value)
    h.update(f"{name}:{a.dtype.str}:{a.shape}\n".encode())
    h.update(np.ascontiguousarray(a).reshape(-1).view(np.uint8).data)
  return h.hexdigest()


def load_model(path: str, *, pooling: str | None = None, vocab: str | None = None, max_length: int | None = None,
               checkpoint: str = "auto", dtype: str | None = None) -> LoadedModel:
  """Any format `st5 encode` loads except SavedModels (TensorFlow cannot run on the JAX mesh)."""
  from st5_jax import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
  from st5_jax.checkpoints import loader, native  # pylint: disable=g-import-not-at-top
  from st5_jax.inference import default_dtype  # pylint: disable=g-import-not-at-top

  path = os.fspath(paths.path(path))  # absolute when local: the manifest does not depend on the working directory
  resolved = native.choose_checkpoint(path, checkpoint)
  fmt = loader.detect_format(resolved)
  if fmt == "savedmodel":
    raise ValueError(f"{resolved} is a SavedModel, which runs on TensorFlow, not on the JAX device mesh this "
                     "command encodes with; pass the work dir or model folder it was exported from")
  config, params, _, fmt = loader.load_model(resolved, pooling=pooling,
                                             t5_overrides={"dtype": dtype or default_dtype()})
  if max_length is not None:
    if max_length < 2:
      raise ValueError(f"max_length must be at least 2 (a token and EOS), got {max_length}")
    config = config.replace(max_length=max_length)
  vocab_file = loader.resolve_vocab(resolved, fmt, vocab)
  return LoadedModel(path=path, resolved=resolved, config=config, params=params,
                     tokenizer=vocab_lib.Tokenizer(vocab_file),
                     vocab_file=vocab_file, source=f"{fmt}:{resolved}", params_sha256=params_sha256(params),
                     vocab_sha256=_sha256(paths.read_bytes(vocab_file)))


def choose_param_sharding(requested: str, params: Any, devices: Sequence[Any]) -> str:
  """replicated or fsdp (see the module docstring); auto by the parameters' size against device memory."""
  if requested not in PARAM_SHARDINGS:
    raise ValueError(f"param_sharding must be one of {', '.join(PARAM_SHARDINGS)}, got {requested!r}")
  if requested != "auto":
    return requested
  if len(devices) == 1:
    return "replicated"
  stats = devices[0].memory_stats() or {}  # None on CPU: host memory, replicate
  limit = stats.get("bytes_limit")
  from st5_jax.checkpoints import tree  # pylint: disable=g-import-not-at-top
  nbytes = sum(np.asarray(v).size * 4 for v in tree.flatten(params).values())
  return "fsdp" if limit and nbytes > FSDP_MEMORY_FRACTION * limit else "replicated"


@functools.lru_cache(maxsize=8)
def _encode_fn(config: Any, mesh: Any, side: str | None = None) -> Callable:
  """The jitted tower for a config on a mesh, shared by every MeshEncoder of them (one compile per bucket).

  `side` ("query" / "document") picks the tower of a model with asymmetric towers; a shared tower ignores it.
  """
  import jax  # pylint: disable=g-import-not-at-top

  from st5_jax import partitioning  # pylint: disable=g-import-not-at-top
  from st5_jax.model.st5 import SentenceT5  # pylint: disable=g-import-not-at-top

  module = SentenceT5(config, side=side if config.asymmetric else None)

  def encode(params, tokens_BxL):
    with partitioning.with_rules():
      return module.apply({"params": params}, tokens_BxL)

  # The parameters come committed to their shardings (replicated or fsdp), the tokens split over the batch axes.
  return jax.jit(encode, out_shardings=partitioning.batch_sharding(mesh))


class MeshEncoder:
  """texts -> float32 [N, D] embeddings over a mesh of (local) devices: the batch split over them."""

  def __init__(self, model: LoadedModel, *, devices: Sequence[Any] | None = None, batch_size: int = 64,
               param_sharding: str = "auto"):
    """batch_size: rows a device encodes per step (the batch is batch_size * devices)."""
    import jax  # pylint: disable=g-import-not-at-top

    from st5_jax import partitioning  # pylint: disable=g-import-not-at-top
    from st5_jax.model.st5 import abstract_params  # pylint: disable=g-import-not-at-top

    if batch_size < 1:
      raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    devices = list(devices or jax.local_devices())
    self.param_sharding = choose_param_sharding(param_sharding, model.params, devices)
    fsdp = self.param_sharding == "fsdp"
    mesh_config = partitioning.MeshConfig(data=1 if fsdp else len(devices), fsdp=len(devices) if fsdp else 1)
    self.mesh = partitioning.make_mesh(mesh_config, devices)
    if fsdp:
      shardings = partitioning.param_shardings(abstract_params(model.config), self.mesh)
    else:
      shardings = jax.tree.map(lambda _: partitioning.replicated(self.mesh), model.params)
    self._batch_sharding = partitioning.batch_sharding(self.mesh)
    self.params = jax.device_put(model.params, shardings)
    self.batch_size = batch_size * len(devices)
    self.max_length = model.config.max_length
    self.tokenizer = model.tokenizer
    self.config = model.config
    self.dim = model.config.encode_dim  # truncate_dim when the model has one
    if model.config.asymmetric:
      log.info("%s has asymmetric towers (%s): queries and documents encode with their own", model.path,
               model.config.towers)

  def describe(self) -> str:
    return f"{self.param_sharding} over {self.mesh.devices.size} {self.mesh.devices.flat[0].platform} device(s)"

  def encode(self, texts: Sequence[str], *, prompt: str = "", side: str = "document") -> np.ndarray:
    """float32 [len(texts), D] in input order; `prompt` is prepended to every text (st5_jax.encode_options).

    `side`: the tower of a model with asymmetric towers ("query" or "document", as sentence-transformers'
    Router defaults to the document route); a shared tower ignores it.
    """
    import jax  # pylint: disable=g-import-not-at-top

    from st5_jax import encode_options  # pylint: disable=g-import-not-at-top
    from st5_jax import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
    from st5_jax.encoder import encode_length_bucket  # pylint: disable=g-import-not-at-top

    out_NxD = np.zeros((len(texts), self.config.output_dim), np.float32)
    if not texts:
      return out_NxD[:, :self.dim]
    rows = self.tokenizer.encode([prompt + t for t in texts], max_length=self.max_length)
    order = np.argsort([-len(r) for r in rows], kind="stable")
    B = self.batch_size
    pending = None  # (rows, device result) of the batch in flight
    apply = _encode_fn(self.config, self.mesh, side if self.config.asymmetric else None)
    with jax.set_mesh(self.mesh):
      for start in range(0, len(rows), B):
        idx = order[start:start + B]
        L = encode_length_bucket(max(len(rows[i]) for i in idx), self.max_length)
        tokens_BxL = vocab_lib.pad_batch([rows[i] for i in idx] + [[]] * (B - len(idx)), L)
        current = (idx, apply(self.params, jax.device_put(tokens_BxL, self._batch_sharding)))
        if pending is not None:  # fetched after the next batch is dispatched: the device never waits on the host
          out_NxD[pending[0]] = np.asarray(pending[1], np.float32)[: len(pending[0])]
        pending = current
      out_NxD[pending[0]] = np.asarray(pending[1], np.float32)[: len(pending[0])]
    return encode_options.truncate_embeddings(out_NxD, self.config.truncate_dim, renormalise=self.config.normalize)


def side_prompt(model: LoadedModel, side: str) -> str:
  """The text `encode_query` / `encode_document` of `model` prepends (side "query" / "document"); "" if none."""
  from st5_jax import encode_options  # pylint: disable=g-import-not-at-top

  return encode_options.side_prompt(model.config.prompt_dict, side)


# ------------------------------------------------------------------------------------------------ building


@dataclasses.dataclass
class BuildReport:
  """What one process did: the shards it encoded and those it found finished (skipped)."""

  process: int
  processes: int
  documents: int
  shards: int
  encoded: list[int]
  skipped: list[int]
  encoded_documents: int = 0
  encode_seconds: float = 0.0
  layout: str = ""
  ann: dict | None = None
  manifest: dict | None = None


def _identity(model: LoadedModel, corpus: corpus_files.CorpusScan, shard_size: int) -> dict:
  return {"model_fingerprint": model.fingerprint, "corpus_fingerprint": corpus.fingerprint, "shard_size": shard_size,
          "model": model.path, "corpus_files": [f.path for f in corpus.files]}


def _describe(ident: dict) -> str:
  return (f"model {ident.get('model')} (fingerprint {str(ident.get('model_fingerprint'))[:12]}), corpus "
          f"{','.join(ident.get('corpus_files') or [])} (fingerprint {str(ident.get('corpus_fingerprint'))[:12]}), "
          f"shard size {ident.get('shard_size')}")


def _same(a: dict, b: dict) -> bool:
  return all(a.get(k) == b.get(k) for k in ("model_fingerprint", "corpus_fingerprint", "shard_size"))


def _check_no_mixing(out: str, ident: dict) -> None:
  """Refuses an --out that holds any part of an index of another model, corpus or shard size."""
  found = []
  manifest = _read_json(paths.join(out, MANIFEST)) if paths.exists(paths.join(out, MANIFEST)) else None
  if manifest:
    model = manifest.get("model") or {}
    found.append((MANIFEST, {"model_fingerprint": model.get("fingerprint"),
                             "corpus_fingerprint": manifest["corpus"]["fingerprint"],
                             "shard_size": manifest["shard_size"], "model": model.get("path"),
                             "corpus_files": [f["path"] for f in manifest["corpus"]["files"]] or ["(embeddings)"]}))
  for f in paths.glob(paths.join(out, "shard-*.json")):
    meta = _read_json(f)
    if meta:
      found.append((os.path.basename(f), meta))
  for name, meta in found:
    if not _same(meta, ident):
      raise IndexMismatchError(f"{out} holds an index of another model, corpus or shard size ({name}: "
                               f"{_describe(meta)}); this run: {_describe(ident)}. Pass another --out, or delete "
                               f"{out} to rebuild it")


def _remove_stale(out: str, shards: set[int]) -> None:
  """Temporary files of these shards left by a killed write."""
  for name in paths.remove_interrupted_writes(out, "shard", shards):
    log.info("removed %s (a write interrupted by a kill)", name)


def _finished(out: str, s: int, ident: dict, count: int) -> tuple[bool, str]:
  """(True, "") when shard s is complete and matches; else (False, why)."""
  base = paths.join(out, shard_name(s))
  meta = _read_json(base + ".json")
  if meta is None:
    return False, "no shard JSON"
  if not _same(meta, ident) or meta.get("count") != count:
    return False, "its JSON does not match"
  try:
    emb = _load_npy(base + ".npy")
    ids_bytes = paths.read_bytes(base + ".ids")
  except (FileNotFoundError, ValueError, OSError) as e:
    return False, f"unreadable ({type(e).__name__})"
  if emb.dtype != np.float32 or emb.shape != (count, meta.get("dim")) or _array_sha256(emb) != meta.get("sha256"):
    return False, "embeddings differ from its JSON"
  if _sha256(ids_bytes) != meta.get("ids_sha256"):
    return False, "ids differ from its JSON"
  return True, ""


def _load_npy(path: str, *, mmap: bool = False) -> np.ndarray:
  if not paths.is_remote(path):
    return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
  return np.load(io.BytesIO(paths.read_bytes(path)), allow_pickle=False)


def _write_shard(out: str, s: int, ids: Sequence[str], emb_NxD: np.ndarray, ident: dict) -> dict:
  base = paths.join(out, shard_name(s))
  buf = io.BytesIO()
  np.save(buf, np.ascontiguousarray(emb_NxD, np.float32))
  ids_bytes = "".join(i + "\n" for i in ids).encode()
  meta = {"shard": s, "count": len(ids), "dim": int(emb_NxD.shape[1]), "dtype": "float32",
          "sha256": _array_sha256(emb_NxD), "ids_sha256": _sha256(ids_bytes), **ident}
  paths.write_bytes(base + ".npy", buf.getvalue())
  paths.write_bytes(base + ".ids", ids_bytes)
  paths.write_bytes(base + ".json", _dumps(meta))  # last: the shard is finished once this exists
  return meta


def _shard_count(n: int, shard_size: int, s: int) -> int:
  return min(shard_size, n - s * shard_size)


def build_index(model: str, corpus: Sequence[str], out: str, *, shard_size: int = DEFAULT_SHARD_SIZE,
                batch_size: int = 64, max_length: int | None = None, pooling: str | None = None,
                vocab: str | None = None, checkpoint: str = "auto", param_sharding: str = "auto",
                ann: str = "auto", ann_params: dict | None = None, devices: Sequence[Any] | None = None,
                corpus_format: str | None = None, precision: str = "float32",
                progress: Callable[[str], None] | None = None) -> BuildReport:
  """Encodes the corpus files into an index folder `out` (see the module docstring); every process calls it.

  precision: also write the corpus as int8 / uint8 / binary / ubinary codes (st5_jax.quantize; float32: none).
  progress: called with one line per shard (default: logging).
  """
  from st5_jax import quantize  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top

  from st5_jax import multihost  # pylint: disable=g-import-not-at-top

  say = progress or log.info
  if shard_size < 1:
    raise ValueError(f"shard_size must be >= 1, got {shard_size}")
  quantize.check_precision(precision)
  out = os.fspath(paths.path(out))
  proc, procs = jax.process_index(), jax.process_count()
  files = corpus_files.expand(corpus)
  scan = corpus_files.scan(files, fmt=corpus_format)
  n = scan.rows
  if n == 0:
    raise ValueError(f"no documents in {', '.join(files)} (every line is blank)")
  ann_kind, ann_params = ann_lib.resolve(ann, n, ann_params)
  loaded = load_model(model, pooling=pooling, vocab=vocab, max_length=max_length, checkpoint=checkpoint)
  ident = _identity(loaded, scan, shard_size)
  if paths.exists(out) and not paths.is_dir(out):
    raise NotADirectoryError(f"--out {out} is a file; an index is a folder")
  _check_no_mixing(out, ident)
  paths.mkdir(out)

  num_shards = -(-n // shard_size)
  mine = [s for s in range(num_shards) if s % procs == proc]
  _remove_stale(out, set(mine))
  todo, skipped = [], []
  for s in mine:
    done, why = _finished(out, s, ident, _shard_count(n, shard_size, s))
    if done:
      skipped.append(s)
      say(f"{shard_name(s)}: finished by an earlier run, skipped")
    else:
      todo.append(s)
      if why != "no shard JSON":
        say(f"{shard_name(s)}: {why}; encoding it again")
  report = BuildReport(process=proc, processes=procs, documents=n, shards=num_shards, encoded=[], skipped=skipped)
  if todo:
    encoder = MeshEncoder(loaded, devices=devices or jax.local_devices(), batch_size=batch_size,
                          param_sharding=param_sharding)
    report.layout = encoder.describe()
    prompt = side_prompt(loaded, "document")
    for s, ids, texts in corpus_files.iter_shards(scan, shard_size, todo):
      start = time.perf_counter()
      emb_NxD = encoder.encode(texts, prompt=prompt, side="document")
      _write_shard(out, s, ids, emb_NxD, ident)
      seconds = time.perf_counter() - start
      report.encoded.append(s)
      report.encoded_documents += len(ids)
      report.encode_seconds += seconds
      say(f"{shard_name(s)}: {len(ids)} documents encoded in {seconds:.1f}s ({len(ids) / max(seconds, 1e-9):.0f}/s, "
          f"{encoder.describe()})")
  multihost.barrier("st5_index:shards")
  if multihost.is_lead():
    report.manifest = _finish(out, model=loaded.to_json(), corpus=scan.to_json(), max_length=loaded.config.max_length,
                              shard_size=shard_size, num_shards=num_shards, ident=ident, ann_kind=ann_kind,
                              ann_params=ann_params, precision=precision, say=say)
    report.ann = report.manifest["ann"]
  multihost.barrier("st5_index:manifest")
  return report


def _finish(out: str, *, model: dict, corpus: dict, max_length: int | None, shard_size: int, num_shards: int,
            ident: dict, ann_kind: str, ann_params: dict, say: Callable[[str], None],
            precision: str = "float32") -> dict:
  """The lead, after every process's shards are written: the ANN index, the quantized copy, then the manifest."""
  shards = []
  for s in range(num_shards):
    meta = _read_json(paths.join(out, shard_name(s) + ".json"))
    if meta is None or not _same(meta, ident):
      raise RuntimeError(f"{shard_name(s)} of {out} was not written (did the process that encodes it fail?); rerun "
                         "the command to resume")
    shards.append({"name": shard_name(s), "count": meta["count"], "sha256": meta["sha256"],
                   "ids_sha256": meta["ids_sha256"]})
  dim = _read_json(paths.join(out, shard_name(0) + ".json"))["dim"]
  n = corpus["documents"]
  manifest = {
      "format": FORMAT, "model": model, "corpus": corpus, "documents": n, "dim": dim, "dtype": "float32",
      "shard_size": shard_size, "shards": shards, "max_length": max_length, "ann": None,
      "code_version": _code_version()}
  ann_path = paths.join(out, ann_lib.FILE)
  if not paths.is_remote(out):  # the lead's temporary files of a killed write of these
    for name in os.listdir(out):
      if name.startswith(tuple(f".{f}.tmp-" for f in (MANIFEST, ann_lib.FILE, QUANTIZED_FILE, RANGES_FILE))):
        os.remove(os.path.join(out, name))
  if ann_kind != "none":
    previous = _read_json(paths.join(out, MANIFEST)) or {}
    old = previous.get("ann")
    if (old and old.get("kind") == ann_kind and old.get("params") == ann_params and previous.get("shards") == shards
        and paths.exists(ann_path) and _sha256(paths.read_bytes(ann_path)) == old.get("sha256")):
      manifest["ann"] = old
      say(f"{ann_lib.FILE}: {ann_kind} {ann_params} already built, kept")
    else:
      start = time.perf_counter()
      partial = Index(out, manifest)
      index = ann_lib.build(ann_kind, ann_params, dim=dim, n=n,
                            blocks=lambda: (b for _, b in partial.iter_blocks(DEFAULT_SHARD_SIZE)))
      data = ann_lib.save(index, ann_path)
      manifest["ann"] = {"kind": ann_kind, "params": ann_params, "file": ann_lib.FILE, "sha256": _sha256(data)}
      say(f"{ann_lib.FILE}: {ann_kind} {ann_params} over {n} vectors built in "
          f"{time.perf_counter() - start:.1f}s")
  elif paths.exists(ann_path):
    paths.path(ann_path).unlink()  # an earlier run's ANN index the manifest no longer names
  quantized = _quantized(out, manifest, precision, say)
  if quantized:  # absent otherwise: a float32 index's manifest keeps the bytes it had
    manifest["quantized"] = quantized
  paths.write_bytes(paths.join(out, MANIFEST), _dumps(manifest))
  return manifest


def _quantized(out: str, manifest: dict, precision: str, say: Callable[[str], None]) -> dict | None:
  """Writes (or keeps) the corpus as `precision` codes beside the shards; the manifest's "quantized" entry."""
  from st5_jax import quantize  # pylint: disable=g-import-not-at-top

  files = [paths.join(out, QUANTIZED_FILE), paths.join(out, RANGES_FILE)]
  if precision == "float32":
    for f in files:  # an earlier run's quantized copy the manifest no longer names
      if paths.exists(f):
        paths.path(f).unlink()
    return None
  previous = _read_json(paths.join(out, MANIFEST)) or {}
  old = previous.get("quantized")
  if (old and old.get("precision") == precision and previous.get("shards") == manifest["shards"]
      and paths.exists(files[0]) and _sha256(paths.read_bytes(files[0])) == old.get("sha256")):
    say(f"{QUANTIZED_FILE}: {precision} codes already written, kept")
    return old
  start = time.perf_counter()
  index = Index(out, manifest)
  entry = {"precision": precision, "file": QUANTIZED_FILE}
  ranges_2xD = None
  if precision in quantize.SCALAR:  # the corpus is its own calibration set: each dimension's min and max
    lo_D, hi_D = np.full(index.dim, np.inf, np.float32), np.full(index.dim, -np.inf, np.float32)
    for _, block in index.iter_blocks(DEFAULT_SHARD_SIZE):
      lo_D, hi_D = np.minimum(lo_D, block.min(axis=0)), np.maximum(hi_D, block.max(axis=0))
    ranges_2xD = np.stack([lo_D, hi_D])
    buf = io.BytesIO()
    np.save(buf, ranges_2xD)
    paths.write_bytes(files[1], buf.getvalue())
    entry.update(ranges_file=RANGES_FILE, ranges_sha256=_array_sha256(ranges_2xD))
  elif paths.exists(files[1]):
    paths.path(files[1]).unlink()
  codes = [quantize.quantize_embeddings(block, precision, ranges=ranges_2xD)
           for _, block in index.iter_blocks(DEFAULT_SHARD_SIZE)]
  buf = io.BytesIO()
  np.save(buf, np.concatenate(codes))
  data = buf.getvalue()
  paths.write_bytes(files[0], data)
  entry["sha256"] = _sha256(data)
  say(f"{QUANTIZED_FILE}: {len(index)} documents as {precision} codes in {time.perf_counter() - start:.1f}s "
      f"({len(data) / 2**20:.1f} MiB)")
  return entry


def from_embeddings(out: str, ids: Sequence[str], emb_NxD: np.ndarray, *, shard_size: int = DEFAULT_SHARD_SIZE,
                    ann: str = "auto", ann_params: dict | None = None, precision: str = "float32",
                    progress: Callable[[str], None] | None = None) -> "Index":
  """An index folder of given embeddings (no model: benchmarks, tests, embeddings made elsewhere); one process.

  The manifest's model entry is null (search then needs --model); the corpus fingerprint is that of the ids
  and embedding bytes, so rerunning with the same arrays keeps the finished shards and other arrays are refused.
  """
  emb_NxD = np.asarray(emb_NxD, np.float32)
  if emb_NxD.ndim != 2 or len(ids) != len(emb_NxD) or not len(ids):
    raise ValueError(f"from_embeddings: {len(ids)} ids for embeddings of shape {emb_NxD.shape}")
  if shard_size < 1:
    raise ValueError(f"shard_size must be >= 1, got {shard_size}")
  say = progress or log.info
  out = os.fspath(paths.path(out))
  ids_bytes = "".join(i + "\n" for i in ids).encode()
  fingerprint = _sha256(f"{_sha256(ids_bytes)}\n{_array_sha256(emb_NxD)}".encode())
  ident = {"model_fingerprint": None, "corpus_fingerprint": fingerprint, "shard_size": shard_size, "model": None,
           "corpus_files": ["(embeddings)"]}
  _check_no_mixing(out, ident)
  paths.mkdir(out)
  n = len(ids)
  num_shards = -(-n // shard_size)
  _remove_stale(out, set(range(num_shards)))
  for s in range(num_shards):
    if not _finished(out, s, ident, _shard_count(n, shard_size, s))[0]:
      rows = slice(s * shard_size, (s + 1) * shard_size)
      _write_shard(out, s, list(ids[rows]), emb_NxD[rows], ident)
  ann_kind, ann_params = ann_lib.resolve(ann, n, ann_params)
  manifest = _finish(out, model=None, corpus={"files": [], "fingerprint": fingerprint, "documents": n},
                     max_length=None, shard_size=shard_size, num_shards=num_shards, ident=ident, ann_kind=ann_kind,
                     ann_params=ann_params, precision=precision, say=say)
  return Index(out, manifest)


def _code_version() -> str:
  import st5_jax  # pylint: disable=g-import-not-at-top
  return f"st5_jax {st5_jax.__version__}"


# ------------------------------------------------------------------------------------------------ reading


class Index:
  """A finished index folder (its manifest): ids, embeddings streamed shard by shard, the ANN index."""

  def __init__(self, directory: str, manifest: dict):
    self.directory = os.fspath(paths.path(directory))
    self.manifest = manifest
    self._ids: list[str] | None = None

  @classmethod
  def open(cls, directory: str) -> "Index":
    directory = os.fspath(paths.path(directory))
    path = paths.join(directory, MANIFEST)
    if not paths.exists(path):
      raise FileNotFoundError(f"{directory} is not a finished index (no {MANIFEST}); build or resume it with "
                              f"`st5 index --model M --corpus FILES --out {directory}`")
    manifest = json.loads(paths.read_text(path))
    if manifest.get("format") != FORMAT:
      raise ValueError(f"{path}: format {manifest.get('format')!r}, this code reads {FORMAT!r}")
    return cls(directory, manifest)

  def __len__(self) -> int:
    return int(self.manifest["documents"])

  @property
  def dim(self) -> int:
    return int(self.manifest["dim"])

  @property
  def ids(self) -> list[str]:
    """Document ids in corpus order (row i of the embeddings is ids[i])."""
    if self._ids is None:
      ids = []
      for shard in self.manifest["shards"]:
        data = paths.read_bytes(paths.join(self.directory, shard["name"] + ".ids"))
        ids.extend(data.decode().split("\n")[:-1])  # one id a line, each ending in "\n"
      if len(ids) != len(self):
        raise ValueError(f"{self.directory}: the shards hold {len(ids)} ids, the manifest says {len(self)}")
      self._ids = ids
    return self._ids

  def shard(self, i: int, *, verify: bool = False) -> np.ndarray:
    """float32 [count, D] of shard i (memory-mapped when local)."""
    info = self.manifest["shards"][i]
    emb = _load_npy(paths.join(self.directory, info["name"] + ".npy"), mmap=not verify)
    if emb.shape != (info["count"], self.dim):
      raise ValueError(f"{self.directory}/{info['name']}.npy has shape {emb.shape}, the manifest says "
                       f"({info['count']}, {self.dim})")
    if verify and _array_sha256(emb) != info["sha256"]:
      raise ValueError(f"{self.directory}/{info['name']}.npy does not match its sha256 in the manifest; rebuild it "
                       "(delete the shard's .json and rerun `st5 index`)")
    return emb

  def iter_blocks(self, block_size: int) -> Iterator[tuple[int, np.ndarray]]:
    """(offset, float32 [<=block_size, D]) over the whole corpus in order, blocks crossing shard boundaries."""
    pending: list[np.ndarray] = []
    have, offset = 0, 0
    for i in range(len(self.manifest["shards"])):
      emb = self.shard(i)
      start = 0
      while start < len(emb):
        take = min(block_size - have, len(emb) - start)
        pending.append(emb[start:start + take])
        have += take
        start += take
        if have == block_size:
          yield offset, np.concatenate(pending).astype(np.float32, copy=False)
          offset += have
          pending, have = [], 0
    if have:
      yield offset, np.concatenate(pending).astype(np.float32, copy=False)

  def embeddings(self) -> np.ndarray:
    """float32 [N, D]: every shard, concatenated (the whole corpus in memory)."""
    if not self.manifest["shards"]:
      return np.zeros((0, self.dim), np.float32)
    return np.concatenate([np.asarray(self.shard(i)) for i in range(len(self.manifest["shards"]))])

  @property
  def ann_info(self) -> dict | None:
    return self.manifest.get("ann")

  @property
  def quantized_info(self) -> dict | None:
    """{"precision", "file", "sha256", ...} of the quantized copy (`st5 index --precision`), or None."""
    return self.manifest.get("quantized")

  def load_quantized(self, precision: str) -> tuple[np.ndarray, np.ndarray | None]:
    """(codes [N, C], ranges float32 [2, D] or None) of the `precision` copy; an error naming the fix when the
    index holds another or none. Codes are memory-mapped when local (checked against their sha256 otherwise)."""
    info = self.quantized_info
    if not info or info["precision"] != precision:
      held = f"{info['precision']} codes" if info else "no quantized copy"
      raise IndexMismatchError(f"{self.directory} holds {held}, not {precision}; add them with `st5 index ... "
                               f"--out {self.directory} --precision {precision}` (the finished shards are kept) or "
                               f"search with --precision {info['precision'] if info else 'float32'}")
    path = paths.join(self.directory, info["file"])
    if paths.is_remote(path):
      data = paths.read_bytes(path)
      if _sha256(data) != info["sha256"]:
        raise ValueError(f"{path} does not match its sha256 in the manifest; rerun `st5 index` to rewrite it")
      codes = np.load(io.BytesIO(data), allow_pickle=False)
    else:
      codes = _load_npy(path, mmap=True)
    if len(codes) != len(self):
      raise ValueError(f"{path} holds {len(codes)} rows, the manifest {len(self)} documents; rerun `st5 index`")
    ranges = None
    if info.get("ranges_file"):
      ranges = _load_npy(paths.join(self.directory, info["ranges_file"]))
      if _array_sha256(ranges) != info["ranges_sha256"]:
        raise ValueError(f"{self.directory}/{info['ranges_file']} does not match its sha256 in the manifest; "
                         "rerun `st5 index` to rewrite it")
    return codes, ranges

  def load_ann(self) -> Any:
    """The faiss index saved with the embeddings; an error naming the fix when there is none."""
    info = self.ann_info
    if not info:
      raise FileNotFoundError(f"{self.directory} has no ANN index; build one with `st5 index ... --ann ivf` (the "
                              "finished shards are kept) or search exactly")
    data = paths.read_bytes(paths.join(self.directory, info["file"]))
    if _sha256(data) != info["sha256"]:
      raise ValueError(f"{self.directory}/{info['file']} does not match its sha256 in the manifest; rerun "
                       "`st5 index` to rebuild it")
    return ann_lib.from_bytes(data)
