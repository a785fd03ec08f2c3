"""The path layer: every file the project reads or writes, local or on gs://.

Work dirs, checkpoints, `init_from`, model folders, vocabularies, data and eval dirs,
users' task files, metrics and exports all go through this module. A path is an
`etils.epath.Path`; `is_remote` is the one place that tells a URL from a local path.

gs:// is served by fsspec's gcsfs (through epath) for files and by tensorstore for
arrays (orbax, legacy T5X zarr), the same clients on a TPU VM as against an emulator.
TensorFlow's own GCS client (tf.io.gfile) is not used for our files: it cannot be
pointed at an emulator, so what the rehearsal proves would not be what runs.

Emulator: set only `STORAGE_EMULATOR_HOST=http://127.0.0.1:PORT` (as
google-cloud-storage and gcsfs read it); `configure_gcs()` (run on import of st5_jax)
derives what the other libraries need from it:
  TENSORSTORE_GCS_HTTP_URL   tensorstore's GCS endpoint (orbax arrays, T5X zarr)
  GCE_METADATA_ROOT, NO_GCE_CHECK
                             credential discovery asks the emulator, never the
                             metadata server at 169.254.169.254
  fsspec gs/gcs token=anon   gcsfs sends no credentials
  GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false
                             no gRPC bucket-type probe (the emulator speaks HTTP only)

Where the vocabulary lives is resolved here too: an argument, a model folder, $ST5_VOCAB,
the data folder (each local or gs://), never implicitly downloaded; a missing file is an
error that says which variable to set. Where the data folder is is decided here too, in one
place (`resolve_data_dir`): an argument, else gin `st5_jax.data.options.data_dir`, else
$ST5_DATA_DIR. The gin parameter is declared with the other data options in
st5_jax.data.config, which hands its value over through `set_configured_data_dir` when it
is imported (this module imports nothing of st5_jax: everything else builds on it).
"""

from __future__ import annotations

import atexit
import contextlib
import fnmatch
import glob as glob_lib
import hashlib
import os
import re
import shutil
import tempfile
from typing import IO, Callable, Iterator, Union

EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
VOCAB_ENV = "ST5_VOCAB"
DATA_DIR_ENV = "ST5_DATA_DIR"
# The gin parameter that names the data folder (declared in st5_jax.data.config).
GIN_DATA_DIR = "st5_jax.data.options.data_dir"
VOCAB_RELPATH = "t5_spiece/spiece.model"
# The file name the T5 vocabulary has in Hugging Face, T5X and our own model folders.
VOCAB_BASENAME = "spiece.model"
# What transformers 5 and SentenceTransformer.save write instead (a Unigram model; see vocab.py).
TOKENIZER_JSON_BASENAME = "tokenizer.json"
LAYOUT_HINT = ("the layout `st5 data prepare --out DIR` writes (sts12-16/, stsb/, sick/, senteval_transfer/, "
               "glue/, nli/, qa_pairs/, t5_spiece/spiece.model; see docs/data.md)")


def get_data_hint(data_dir: PathLike | None = None) -> str:
  """What every "the data is missing" error says: the one command that gets it, and the variable to set.

  `st5 data prepare` writes every file the README's main job and `st5 eval` read (docs/data.md).
  A known local data folder is named in place of DIR.
  """
  d = os.fspath(data_dir) if data_dir and not is_remote(data_dir) else "DIR"
  return f"get the public data with `st5 data prepare --out {d}`, then `export {DATA_DIR_ENV}={d}`"


def configure_gcs() -> None:
  """Derives every library's GCS settings from $STORAGE_EMULATOR_HOST (idempotent).

  Without the emulator variable, gs:// goes to Google Cloud Storage with the machine's
  default credentials. Must run before gcsfs is imported (it reads its switches then).
  """
  # One GCS file client everywhere (epath's fsspec backend, i.e. gcsfs), not TF's.
  os.environ.setdefault("EPATH_USE_TF", "false")
  import fsspec  # pylint: disable=g-import-not-at-top
  for protocol in ("gs", "gcs"):
    # No directory-listing cache: other processes, and tensorstore in this one, write
    # to the same bucket (a cached listing missed new checkpoint steps).
    fsspec.config.conf.setdefault(protocol, {})["use_listings_cache"] = False
  host = os.environ.get(EMULATOR_ENV)
  if not host:
    return
  url = host if "://" in host else f"http://{host}"
  netloc = url.split("://", 1)[1].rstrip("/")
  os.environ["TENSORSTORE_GCS_HTTP_URL"] = url
  os.environ["GCE_METADATA_ROOT"] = netloc
  os.environ["NO_GCE_CHECK"] = "true"
  os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
  for protocol in ("gs", "gcs"):
    fsspec.config.conf[protocol]["token"] = "anon"


configure_gcs()

from etils import epath  # noqa: E402  (after configure_gcs: epath reads EPATH_USE_TF on first use)

Path = epath.Path
PathLike = Union[str, os.PathLike]


class MissingFileError(FileNotFoundError):
  """A required input file is absent; the message says how to provide it."""


# ---------------------------------------------------------------------------- paths


def is_remote(p: PathLike) -> bool:
  """True for URLs (gs://, s3://, ...); the only such test in the project."""
  return "://" in os.fspath(p)


def path(p: PathLike) -> epath.Path:
  """An epath.Path; local paths are made absolute (`~` expanded)."""
  if isinstance(p, epath.Path) and is_remote(p):
    return p
  s = os.fspath(p)
  if is_remote(s):
    return epath.Path(s)
  return epath.Path(os.path.abspath(os.path.expanduser(s)))


def join(p: PathLike, *parts: str) -> str:
  return os.fspath(path(p).joinpath(*parts))


def exists(p: PathLike) -> bool:
  return path(p).exists()


def is_file(p: PathLike) -> bool:
  q = path(p)
  return q.exists() and not q.is_dir()


def is_dir(p: PathLike) -> bool:
  return path(p).is_dir()


def size(p: PathLike) -> int:
  return int(path(p).stat().length)


def read_bytes(p: PathLike) -> bytes:
  return path(p).read_bytes()


def read_text(p: PathLike, encoding: str = "utf-8") -> str:
  """The file's text with line endings untouched (no universal-newline translation)."""
  return path(p).read_bytes().decode(encoding)


def read_head(p: PathLike, n: int) -> bytes:
  with path(p).open("rb") as f:
    return f.read(n)


def open_file(p: PathLike, mode: str = "rb") -> IO:
  return path(p).open(mode)


def remove_interrupted_writes(folder: PathLike, prefix: str, numbers: set[int]) -> list[str]:
  """Removes the temporary files `write_bytes` left in a local `folder` for `PREFIX-<n>.<ext>` with n in
  `numbers` (a write killed before its rename; GCS writes leave none). Returns the names removed."""
  if is_remote(folder) or not os.path.isdir(folder):
    return []
  pattern = re.compile(rf"^\.({re.escape(prefix)}-(\d+)\.[a-z]+)\.tmp-\d+$")
  removed = [n for n in os.listdir(folder) if (m := pattern.match(n)) and int(m.group(2)) in numbers]
  for name in removed:
    os.remove(os.path.join(folder, name))
  return removed


def write_bytes(p: PathLike, data: bytes) -> None:
  """Writes atomically where the filesystem allows (local: temp file + rename)."""
  q = path(p)
  q.parent.mkdir(parents=True, exist_ok=True)
  if is_remote(q):  # GCS objects appear whole on close
    q.write_bytes(data)
    return
  tmp = q.parent / f".{q.name}.tmp-{os.getpid()}"
  tmp.write_bytes(data)
  tmp.replace(q)


def write_text(p: PathLike, text: str, encoding: str = "utf-8") -> None:
  write_bytes(p, text.encode(encoding))


def mkdir(p: PathLike) -> epath.Path:
  q = path(p)
  q.mkdir(parents=True, exist_ok=True)
  return q


def glob(pattern: PathLike) -> list[str]:
  """Files matching a glob (local or gs://), sorted."""
  s = os.fspath(pattern)
  if not is_remote(s):
    return sorted(glob_lib.glob(os.path.expanduser(s)))
  # Split at the first wildcard: list from the fixed prefix, match the rest.
  parts = s.split("/")
  fixed = []
  for part in parts:
    if any(c in part for c in "*?["):
      break
    fixed.append(part)
  if len(fixed) == len(parts):
    return [s] if exists(s) else []
  base = path("/".join(fixed))
  rest = "/".join(parts[len(fixed):])
  if not base.exists():
    return []
  return sorted(os.fspath(m) for m in base.glob(rest) if fnmatch.fnmatch(os.fspath(m), s))


def walk_files(p: PathLike) -> Iterator[tuple[str, epath.Path]]:
  """(relative path, file) of every file under a directory."""
  root = path(p)
  scheme = os.fspath(root).split("://", 1)[0] + "://" if is_remote(root) else ""
  for dirpath, _, files in root.walk():
    dirpath = os.fspath(dirpath)
    if scheme and not dirpath.startswith(scheme):  # gcsfs walks without the scheme
      dirpath = scheme + dirpath
    for name in files:
      f = epath.Path(dirpath) / name
      yield os.path.relpath(os.fspath(f), os.fspath(root)), f


def copy_file(src: PathLike, dst: PathLike, *, chunk_bytes: int = 1 << 24) -> None:
  """Copies one file between any two locations (local <-> gs://), streaming."""
  out = path(dst)
  out.parent.mkdir(parents=True, exist_ok=True)
  with path(src).open("rb") as fin, out.open("wb") as fout:
    while chunk := fin.read(chunk_bytes):
      fout.write(chunk)


def copy_tree(src: PathLike, dst: PathLike) -> None:
  """Copies a directory tree between any two locations (local <-> gs://)."""
  for rel, f in walk_files(src):
    copy_file(f, path(dst) / rel)


def remove_tree(p: PathLike) -> None:
  q = path(p)
  if q.exists():
    q.rmtree()


_LOCAL_CACHE: dict[str, str] = {}


def local_dir(p: PathLike) -> str:
  """A local directory with the contents of `p`: `p` itself, or a per-process copy of a remote one.

  For libraries that only open local files (SavedModel loading, safetensors, torch). The
  copy is made once per process and removed at exit.
  """
  if not is_remote(p):
    return os.fspath(path(p))
  key = os.fspath(path(p))
  if key not in _LOCAL_CACHE or not os.path.isdir(_LOCAL_CACHE[key]):
    tmp = tempfile.mkdtemp(prefix=f"st5_{hashlib.sha1(key.encode()).hexdigest()[:8]}_")
    copy_tree(key, tmp)
    _LOCAL_CACHE[key] = tmp
    atexit.register(shutil.rmtree, tmp, True)
  return _LOCAL_CACHE[key]


def local_file(p: PathLike) -> str:
  """A local copy of a remote file (once per process), or the local file itself."""
  if not is_remote(p):
    return os.fspath(path(p))
  key = os.fspath(path(p))
  if key not in _LOCAL_CACHE or not os.path.isfile(_LOCAL_CACHE[key]):
    tmp = tempfile.mkdtemp(prefix=f"st5_{hashlib.sha1(key.encode()).hexdigest()[:8]}_")
    local = os.path.join(tmp, path(p).name)
    with open(local, "wb") as f:
      f.write(read_bytes(key))
    _LOCAL_CACHE[key] = local
    atexit.register(shutil.rmtree, tmp, True)
  return _LOCAL_CACHE[key]


@contextlib.contextmanager
def staged_output(out: PathLike, *, prefix: str = "st5_out_") -> Iterator[str]:
  """A local directory to write into; copied to a remote `out` when the block succeeds.

  For writers that only write local files (SavedModel, sentence-transformers folders).
  A local `out` is left to the caller (it writes next to it and renames atomically).
  """
  if not is_remote(out):
    yield os.fspath(path(out))
    return
  tmp = tempfile.mkdtemp(prefix=prefix)
  try:
    target = os.path.join(tmp, "out")
    yield target
    remove_tree(out)
    copy_tree(target, out)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def tensorstore_kvstore(p: PathLike) -> dict:
  """A tensorstore kvstore spec for a directory (`file` locally, `gcs` for gs://)."""
  s = os.fspath(path(p))
  if s.startswith("gs://"):
    bucket, _, prefix = s[len("gs://"):].partition("/")
    return {"driver": "gcs", "bucket": bucket, "path": prefix}
  if is_remote(s):
    raise ValueError(f"{s}: only local paths and gs:// are supported for arrays")
  return {"driver": "file", "path": s}


# --------------------------------------------------------------- data and vocabulary


# The configured data folder (gin `st5_jax.data.options.data_dir`), set by st5_jax.data.config.
_configured_data_dir: Callable[[], str | None] = lambda: None


def set_configured_data_dir(value: Callable[[], str | None]) -> None:
  """Where `resolve_data_dir` reads the configured folder (st5_jax.data.config: its gin binding)."""
  global _configured_data_dir
  _configured_data_dir = value


def resolve_data_dir(explicit: PathLike | None = None, *, required: bool = True) -> str | None:
  """Where the data lives: the one place that decides, for the tasks, the trainer's STS-B dev
  evaluation, the vocabulary fallback and every command.

  `explicit` (a command's --data_dir), else gin `st5_jax.data.options.data_dir`, else
  $ST5_DATA_DIR; local or gs://. required: the folder must exist (a missing one is a
  MissingFileError that says what to set); otherwise None when nothing is set, and a set
  folder is returned unchecked (e.g. `st5 data prepare` creates it).
  """
  if explicit:
    value, source = os.fspath(explicit), "argument"
  elif configured := _configured_data_dir():
    value, source = configured, f"gin {GIN_DATA_DIR}"
  elif os.environ.get(DATA_DIR_ENV):
    value, source = os.environ[DATA_DIR_ENV], DATA_DIR_ENV
  elif required:
    raise MissingFileError(
        f"No data directory given: {get_data_hint()}. Or pass --data_dir, set {DATA_DIR_ENV} (or gin {GIN_DATA_DIR}) "
        f"to a folder (local or gs://) in {LAYOUT_HINT}.")
  else:
    return None
  p = path(value)
  if required and not p.is_dir():
    raise MissingFileError(f"Data directory {p} does not exist (from {source}): {get_data_hint(p)}. It should be a "
                           f"folder in {LAYOUT_HINT}.")
  return os.fspath(p)


def data_dir(explicit: PathLike | None = None, *, required: bool = True) -> epath.Path | None:
  """The folder of public data as a path (`resolve_data_dir`)."""
  value = resolve_data_dir(explicit, required=required)
  return path(value) if value else None


def vocab_path(explicit: PathLike | None = None, *, model_dir: PathLike | None = None) -> str:
  """Resolves the SentencePiece model: argument, model folder, $ST5_VOCAB, $ST5_DATA_DIR.

  In a model folder spiece.model wins; a tokenizer.json alone (transformers 5,
  SentenceTransformer.save) is used next, converted by st5_jax.vocab.
  """
  tried = []
  candidates = []
  if explicit:
    candidates.append(("argument", os.fspath(explicit)))
  if model_dir:
    for basename in (VOCAB_BASENAME, TOKENIZER_JSON_BASENAME):
      for sub in ("", "assets", "0_Transformer", "0_T5"):
        candidates.append(("model folder", join(model_dir, *([sub] if sub else []), basename)))
  if os.environ.get(VOCAB_ENV):
    candidates.append((VOCAB_ENV, os.environ[VOCAB_ENV]))
  data = data_dir(required=False)
  if data:
    candidates.append(("data folder", join(data, VOCAB_RELPATH)))
  for source, candidate in candidates:
    if is_file(candidate):
      return os.fspath(path(candidate))
    tried.append(f"{candidate} ({source})")
    if source == "argument":
      raise MissingFileError(f"Vocabulary file {candidate} does not exist.")
  raise MissingFileError(
      "No T5 SentencePiece vocabulary found" + (f"; tried: {', '.join(tried)}" if tried else "") +
      f". Pass vocab=PATH, put {VOCAB_BASENAME} (or a Unigram {TOKENIZER_JSON_BASENAME}) in the model folder, set "
      f"{VOCAB_ENV}, or {get_data_hint(data)} (it holds {VOCAB_RELPATH}).")
