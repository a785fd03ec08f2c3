"""Search: exact top-k by dot product on the JAX devices, through an index's ANN index, or over its quantized codes.

`exact_search` streams the corpus through the devices in blocks of `block_size` rows. Each block is split
over the local devices (a 1-D mesh, `shard_map`): every device scores the queries against its rows (a
matmul at HIGHEST precision, i.e. float32 on TPU too), keeps its local top-k (`jax.lax.top_k`; with
`approx=True`, `jax.lax.approx_max_k`, TPU's approximate top-k, exact on CPU and GPU), the candidates are
all-gathered and merged with the running top-k of the earlier blocks. The running top-k stays on the devices;
each block crosses from the host once and is scored against every query block before the next one comes.
Corpus indices are int32 on the devices (N < 2^31), int64 in what is returned.

Ties: the lower corpus index first, deterministically. `lax.top_k` puts the lower position first among
equals, and every merge concatenates [running, device 0's candidates, device 1's, ...]: positions ascend
with corpus index among equal scores. (Run files are ranked again by the trec_eval convention when scored;
this order only makes the top-k itself reproducible.)
"""

from __future__ import annotations

import functools
from typing import Any, Iterator, Sequence

import numpy as np

DEFAULT_BLOCK_SIZE = 65536
DEFAULT_QUERY_BLOCK_SIZE = 1024  # queries scored at once: [1024, block / devices] float32 scores a device


def _blocks(documents: Any, block_size: int) -> Iterator[tuple[int, np.ndarray]]:
  """(offset, float32 [<=block_size, D]) of an array or of anything with iter_blocks (retrieval.index.Index)."""
  if hasattr(documents, "iter_blocks"):
    yield from documents.iter_blocks(block_size)
    return
  for start in range(0, len(documents), block_size):
    yield start, np.asarray(documents[start:start + block_size], np.float32)


@functools.lru_cache(maxsize=16)
def _step(devices: tuple, k: int, k_local: int, approx: bool):
  """The jitted merge of one (query block, document block) into the running top-k."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jax.sharding import Mesh, PartitionSpec as P  # pylint: disable=g-import-not-at-top

  mesh = Mesh(np.asarray(devices), ("docs",))

  def local(run_s_QxK, run_i_QxK, q_QxD, d_NxD, offset, n_valid):
    n_local = d_NxD.shape[0]
    row_N = jax.lax.axis_index("docs") * n_local + jnp.arange(n_local, dtype=jnp.int32)  # position in the block
    s_QxN = jnp.dot(q_QxD, d_NxD.T, precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
    s_QxN = jnp.where(row_N[None, :] < n_valid, s_QxN, -jnp.inf)  # the last block's padding never wins
    if approx:
      top_s, top_p = jax.lax.approx_max_k(s_QxN, k_local, recall_target=0.95)
    else:
      top_s, top_p = jax.lax.top_k(s_QxN, k_local)
    top_i = offset + row_N[top_p]
    all_s = jax.lax.all_gather(top_s, "docs", axis=1, tiled=True)  # device order = corpus order
    all_i = jax.lax.all_gather(top_i, "docs", axis=1, tiled=True)
    merged_s, pos = jax.lax.top_k(jnp.concatenate([run_s_QxK, all_s], axis=1), k)
    merged_i = jnp.take_along_axis(jnp.concatenate([run_i_QxK, all_i], axis=1), pos, axis=1)
    return merged_s, merged_i

  fn = jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P(), P("docs"), P(), P()), out_specs=(P(), P()),
                     check_vma=False)
  return mesh, jax.jit(fn)


def exact_search(queries_QxD: np.ndarray, documents_NxD: Any, k: int, *, block_size: int = DEFAULT_BLOCK_SIZE,
                 query_block_size: int = DEFAULT_QUERY_BLOCK_SIZE, approx: bool = False,
                 devices: Sequence[Any] | None = None) -> tuple[np.ndarray, np.ndarray]:
  """(scores float32 [Q, K], indices int64 [Q, K]), K = min(k, N): the k largest dot products of each query.

  documents_NxD: a float32 [N, D] array or a retrieval.index.Index (its shards streamed in order). Ties: the
  lower corpus index first. devices: the local devices by default.
  """
  import jax  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top

  if k < 1:
    raise ValueError(f"k must be >= 1, got {k}")
  if block_size < 1 or query_block_size < 1:
    raise ValueError(f"block sizes must be >= 1, got block_size={block_size}, query_block_size={query_block_size}")
  queries_QxD = np.asarray(queries_QxD, np.float32)
  n = len(documents_NxD)
  num_q = queries_QxD.shape[0]
  k = min(k, n)
  if k == 0 or num_q == 0:
    return np.zeros((num_q, k), np.float32), np.zeros((num_q, k), np.int64)
  devices = tuple(devices or jax.local_devices())
  nd = len(devices)
  # A block never needs to be longer than the corpus; its rows divide over the devices.
  block = -(-min(block_size, n) // nd) * nd
  k_local = min(k, block // nd)
  mesh, step = _step(devices, k, k_local, approx)
  doc_sharding = NamedSharding(mesh, P("docs"))
  replicated = NamedSharding(mesh, P())
  qb = min(query_block_size, num_q)
  q_blocks = []
  for start in range(0, num_q, qb):
    q = queries_QxD[start:start + qb]
    q = np.concatenate([q, np.zeros((qb - len(q), q.shape[1]), np.float32)]) if len(q) < qb else q
    q_blocks.append(jax.device_put(q, replicated))
  state = [(jax.device_put(np.full((qb, k), -np.inf, np.float32), replicated),
            jax.device_put(np.full((qb, k), -1, np.int32), replicated)) for _ in q_blocks]
  # Its own mesh in context: a caller inside another mesh's context (the trainer's dev evaluation) would
  # otherwise hand shard_map a context mesh that is not this one.
  with jax.set_mesh(mesh):
    seen = _merge_blocks(documents_NxD, block, queries_QxD, q_blocks, state, step, doc_sharding)
  if seen != n:
    raise ValueError(f"the documents yielded {seen} rows, expected {n}")
  scores = np.concatenate([np.asarray(s) for s, _ in state])[:num_q]
  indices = np.concatenate([np.asarray(i) for _, i in state])[:num_q].astype(np.int64)
  return scores.astype(np.float32), indices


def _merge_blocks(documents_NxD, block, queries_QxD, q_blocks, state, step, doc_sharding) -> int:
  """Streams the corpus blocks through `step`, updating each query block's running top-k in `state`."""
  import jax  # pylint: disable=g-import-not-at-top

  seen = 0
  for offset, d_NxD in _blocks(documents_NxD, block):
    if d_NxD.ndim != 2 or d_NxD.shape[1] != queries_QxD.shape[1]:
      raise ValueError(f"documents have shape {d_NxD.shape}, queries {queries_QxD.shape}: dimensions differ")
    n_valid = len(d_NxD)
    if n_valid < block:
      d_NxD = np.concatenate([d_NxD, np.zeros((block - n_valid, d_NxD.shape[1]), np.float32)])
    d_dev = jax.device_put(np.ascontiguousarray(d_NxD, np.float32), doc_sharding)
    offset_dev = np.int32(offset)
    valid_dev = np.int32(n_valid)
    for j, q in enumerate(q_blocks):
      # One step in flight at a time: with hundreds of collective programs queued, XLA:CPU's host devices
      # missed their 40 s all-gather rendezvous on a loaded machine. A step is a [1024, block] matmul: the
      # wait costs nothing next to it.
      state[j] = jax.block_until_ready(step(*state[j], q, d_dev, offset_dev, valid_dev))
    seen += n_valid
  return seen


# ------------------------------------------------------------------------------------------------ over an index

METHODS = ("exact", "approx", "ann")


def query_model(index: Any, *, model: str | None = None, max_length: int | None = None, vocab: str | None = None,
                checkpoint: str = "auto", pooling: str | None = None) -> Any:
  """The LoadedModel that encodes queries for `index`: its own model unless `model` overrides it.

  The index's model is loaded from the folder it was built from and must still have the same parameters and
  vocabulary (a work dir that trained on since would encode queries in another space).
  """
  from st5_jax.retrieval import index as index_lib  # pylint: disable=g-import-not-at-top

  built = index.manifest["model"]
  if model is None and built is None:
    raise ValueError(f"{index.directory} was written from embeddings without a model; pass --model to encode "
                     "the queries")
  if model is not None:
    return index_lib.load_model(model, pooling=pooling, vocab=vocab, max_length=max_length, checkpoint=checkpoint)
  loaded = index_lib.load_model(built["resolved"], pooling=pooling or built["config"]["pooling"], vocab=vocab,
                                max_length=max_length, checkpoint="latest")
  if loaded.params_sha256 != built["params_sha256"] or loaded.vocab_sha256 != built["vocab_sha256"]:
    what = "parameters" if loaded.params_sha256 != built["params_sha256"] else "vocabulary"
    raise index_lib.IndexMismatchError(
        f"the model at {built['resolved']} is not the one {index.directory} was built with (its {what} changed since); "
        "pass --model with the checkpoint the index was built from, or rebuild the index")
  return loaded


def search_index(index: Any, queries_QxD: np.ndarray, k: int, *, method: str = "exact",
                 ann_params: dict | None = None, block_size: int = DEFAULT_BLOCK_SIZE,
                 devices: Sequence[Any] | None = None, precision: str = "float32",
                 rescore_multiplier: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """(scores [Q, K], indices [Q, K]) over a retrieval.index.Index: exact or approx on the devices, or its ANN index.

  ann_params: overrides of the ANN index's search parameters (nprobe, efSearch) for method="ann".
  precision: other than float32, exact search over the index's quantized copy of that precision (`st5 index
  --precision`) on the host (st5_jax.quantize.search: Hamming distance for binary codes, the codes' dot product
  for int8 / uint8), the top k * rescore_multiplier (default 4; 0: none) rescored with the float queries.
  """
  from st5_jax import quantize  # pylint: disable=g-import-not-at-top
  from st5_jax.retrieval import ann as ann_lib  # pylint: disable=g-import-not-at-top

  if method not in METHODS:
    raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
  quantize.check_precision(precision)
  if queries_QxD.ndim != 2 or queries_QxD.shape[1] != index.dim:
    raise ValueError(f"queries have shape {queries_QxD.shape}; the index holds {index.dim}-dimensional embeddings")
  if rescore_multiplier is not None and precision == "float32":
    raise ValueError("rescore_multiplier rescores a search over quantized codes: give a precision other than float32")
  if precision != "float32":
    if method != "exact":
      raise ValueError(f"a {precision} search is exact over the quantized codes; method {method!r} searches the "
                       "float32 embeddings")
    codes, ranges = index.load_quantized(precision)
    multiplier = quantize.DEFAULT_RESCORE_MULTIPLIER if rescore_multiplier is None else rescore_multiplier
    return quantize.search(queries_QxD, codes, k, precision=precision, dim=index.dim, ranges=ranges,
                           rescore_multiplier=multiplier)
  if method != "ann":
    return exact_search(queries_QxD, index, k, block_size=block_size, approx=method == "approx", devices=devices)
  info = index.ann_info
  if not info:
    index.load_ann()  # raises: no ANN index, with the fix
  params = dict(info["params"])
  searchable = ann_lib.SEARCH_PARAMS[info["kind"]]
  for key, value in (ann_params or {}).items():
    if value is None:
      continue
    if key not in searchable or int(value) < 1:
      raise ValueError(f"{key}={value} is not a search parameter of the index's {info['kind']} ANN index (it takes "
                       f"{', '.join(searchable) or 'none'}, >= 1)")
    params[key] = int(value)
  return ann_lib.search(index.load_ann(), info["kind"], params, queries_QxD, k)
