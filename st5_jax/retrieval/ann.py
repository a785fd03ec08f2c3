"""Approximate nearest-neighbour search over an index's embeddings: faiss-cpu (pinned 1.15.1), inner product.

Why faiss and not ScaNN: faiss-cpu ships manylinux wheels for every Python this project supports and
installs with no extra system libraries; ScaNN's wheels lag behind Python and TensorFlow releases and are
x86-only. The index is built once, by the lead process, on the host CPU (corpora beyond device memory are
the reason for an ANN index: exact search on the devices streams the corpus through them at every query
block). Embeddings are L2-normalised, so the inner product is the cosine similarity `exact_search` ranks by.

Kinds (`st5 index --ann`):

  flat  IndexFlatIP: exact, on the CPU (a baseline; no parameters).
  ivf   IndexIVFFlat: k-means into `nlist` lists (faiss's seeded k-means: the same embeddings give the same
        bytes), a query scans the `nprobe` lists nearest to it. Vectors are stored unquantised (4 * D bytes a
        document, as the shards), so IVF costs no recall to compression.
  hnsw  IndexHNSWFlat: a graph of `M` links a node, built with `efConstruction`, searched with `efSearch`.
        Built on several threads, its bytes may differ between builds (results keep their recall).

Defaults (`default_params`), and why:

  nlist = the power of two nearest 4 * sqrt(N) (faiss's guideline is 4..16 * sqrt(N)), at most N / 39 (faiss
        wants 39 training points a list): 512 lists at 2 * 10^4 documents, 1,024 at 10^5, 4,096 at 10^6,
        16,384 at 2.1 * 10^7. The low end keeps k-means cheap to train on the host.
  nprobe = nlist / 16, at least 8: 1/16 of the corpus scanned a query. Recall depends on how clustered the
        embeddings are far more than on N; measured Recall@100 against exact search, 1,000 queries drawn like
        the documents (unit vectors around random unit centres plus Gaussian noise of norm ~1, D=64):
          2 * 10^4 documents, 200 centres (tests/test_retrieval_search.py): nlist 512, nprobe 16 / 32 / 64:
            0.970 / 0.985 / 0.995 (the test bounds the default at 0.97);
          10^5 documents, 1,000 centres: nlist 1,024, nprobe 32 / 64 / 128: 0.964 / 0.982 / 0.993;
          a more diffuse corpus (noise of norm ~1.2, 2 * 10^4): nprobe = nlist / 16: 0.919, nlist / 8: 0.962.
        About 0.95 and up at k=100 keeps MRR@10 / nDCG@10 within noise of exact search, which is what the
        index is for; raise --nprobe (search time grows with it) where a corpus is less clustered.
  M = 32, efConstruction = 200: the values hnswlib's and faiss's benchmarks use for D of 64..1024; faiss's
        default efConstruction (40) builds a visibly worse graph. Measured on the 2 * 10^4 corpus above:
        efSearch 100 / 128 / 200: 0.991 / 0.996 / 0.999 (built in 16 s on 2 busy cores); M=16 with
        efConstruction=64 builds 3x faster for 0.976 at efSearch 128.
  efSearch = 128 (never below k).

Parameters are recorded in the index manifest and the index is saved in the index folder as ann.faiss
(faiss's own serialisation, written through st5_jax.paths, so gs:// works too); `load` reads it back.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable

import numpy as np

from st5_jax import paths

KINDS = ("ivf", "hnsw", "flat")
CHOICES = ("auto", "none", *KINDS)
SEARCH_PARAMS = {"ivf": ("nprobe",), "hnsw": ("efSearch",), "flat": ()}  # set at search time, not built in
AUTO_MIN_DOCUMENTS = 100_000  # below this, exact search on the devices is fast enough: no ANN index by default
FILE = "ann.faiss"
MIN_POINTS_PER_LIST = 39  # faiss's k-means warns below this
MAX_TRAIN_POINTS_PER_LIST = 256  # and subsamples above it (its max_points_per_centroid)


def default_kind(n: int) -> str:
  return "none" if n < AUTO_MIN_DOCUMENTS else "ivf"


def default_params(kind: str, n: int) -> dict[str, int]:
  """The parameters of `kind` for n documents (see the module docstring for why)."""
  if kind == "ivf":
    target = 4 * math.sqrt(max(n, 1))
    nlist = 2 ** max(0, round(math.log2(target)))
    nlist = max(1, min(nlist, n // MIN_POINTS_PER_LIST))
    return {"nlist": nlist, "nprobe": max(min(8, nlist), nlist // 16)}
  if kind == "hnsw":
    return {"M": 32, "efConstruction": 200, "efSearch": 128}
  if kind == "flat":
    return {}
  raise ValueError(f"unknown ANN kind {kind!r}; known: {', '.join(KINDS)}")


def resolve(kind: str, n: int, overrides: dict[str, Any] | None = None) -> tuple[str, dict[str, int]]:
  """(kind, parameters) for a request: `auto` chosen by corpus size, overrides (None values dropped) checked."""
  if kind not in CHOICES:
    raise ValueError(f"--ann must be one of {', '.join(CHOICES)}, got {kind!r}")
  if kind == "auto":
    kind = default_kind(n)
  if kind == "none":
    return kind, {}
  params = default_params(kind, n)
  for key, value in (overrides or {}).items():
    if value is None:
      continue
    if key not in params:
      raise ValueError(f"{key} is not a parameter of an {kind} index (its parameters: "
                       f"{', '.join(params) or 'none'})")
    if int(value) < 1:
      raise ValueError(f"{key} must be >= 1, got {value}")
    params[key] = int(value)
  if kind == "ivf":
    if params["nlist"] > n:
      raise ValueError(f"nlist={params['nlist']} is more lists than the {n} documents; use at most {n}")
    params["nprobe"] = min(params["nprobe"], params["nlist"])
  return kind, params


def _import_faiss():
  try:
    import faiss  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError("ANN indexes need faiss: pip install faiss-cpu==1.15.1 (a core dependency of st5_jax; "
                      "reinstall the package)") from e
  return faiss


def _train_sample(blocks: Callable[[], Iterable[np.ndarray]], n: int, size: int) -> np.ndarray:
  """Every (n // size)-th row, at most `size` rows: spread over the whole corpus, deterministic."""
  step = max(1, n // size)
  picked, offset = [], 0
  for block_NxD in blocks():
    first = (-offset) % step
    picked.append(block_NxD[first::step])
    offset += len(block_NxD)
  return np.ascontiguousarray(np.concatenate(picked)[:size], np.float32)


def build(kind: str, params: dict[str, int], *, dim: int, n: int,
          blocks: Callable[[], Iterable[np.ndarray]]) -> Any:
  """A faiss index of `kind` over the float32 [*, dim] blocks `blocks()` yields, in corpus order (ids 0..n-1).

  `blocks` is called once more for IVF's training sample; neither pass holds the corpus twice.
  """
  faiss = _import_faiss()
  if kind == "flat":
    index = faiss.IndexFlatIP(dim)
  elif kind == "ivf":
    quantizer = faiss.IndexFlatIP(dim)
    index = faiss.IndexIVFFlat(quantizer, dim, params["nlist"], faiss.METRIC_INNER_PRODUCT)
    index.train(_train_sample(blocks, n, MAX_TRAIN_POINTS_PER_LIST * params["nlist"]))
  elif kind == "hnsw":
    index = faiss.IndexHNSWFlat(dim, params["M"], faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = params["efConstruction"]
  else:
    raise ValueError(f"unknown ANN kind {kind!r}; known: {', '.join(KINDS)}")
  for block_NxD in blocks():
    index.add(np.ascontiguousarray(block_NxD, np.float32))
  if index.ntotal != n:
    raise RuntimeError(f"the ANN index holds {index.ntotal} vectors, expected {n}")
  return index


def to_bytes(index: Any) -> bytes:
  return _import_faiss().serialize_index(index).tobytes()


def from_bytes(data: bytes) -> Any:
  return _import_faiss().deserialize_index(np.frombuffer(data, np.uint8))


def save(index: Any, path: paths.PathLike) -> bytes:
  """Writes the index atomically (local) or whole (gs://); returns its bytes (for the manifest's sha256)."""
  data = to_bytes(index)
  paths.write_bytes(path, data)
  return data


def load(path: paths.PathLike) -> Any:
  return from_bytes(paths.read_bytes(path))


def search(index: Any, kind: str, params: dict[str, int], queries_QxD: np.ndarray,
           k: int) -> tuple[np.ndarray, np.ndarray]:
  """(scores float32 [Q, k], indices int64 [Q, k]); -1 / -inf where the index found fewer than k."""
  faiss = _import_faiss()
  k = min(k, index.ntotal)
  if kind == "ivf":
    faiss.extract_index_ivf(index).nprobe = params["nprobe"]
  elif kind == "hnsw":
    index.hnsw.efSearch = max(params["efSearch"], k)
  scores_QxK, indices_QxK = index.search(np.ascontiguousarray(queries_QxD, np.float32), k)
  scores_QxK = np.where(indices_QxK < 0, -np.inf, scores_QxK).astype(np.float32)
  return scores_QxK, indices_QxK.astype(np.int64)

