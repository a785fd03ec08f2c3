"""A Google Cloud Storage emulator on 127.0.0.1 for tests (gcp-storage-emulator, in memory).

Started by the tests themselves; clients find it through STORAGE_EMULATOR_HOST only
(st5_jax.paths derives every other library's setting from that one variable).

gcp-storage-emulator 2026.7 leaves out two things GCS does and tensorstore (orbax's
OCDBT checkpoints) relies on, so its request handler is extended here:
  - object reads carry `x-goog-generation` / `x-goog-metageneration` headers (tensorstore
    reads an object's generation from them: without, "Malformed StorageGeneration");
  - `ifGenerationMatch` / `ifGenerationNotMatch` preconditions are honoured (412, or 304
    for a read whose cached generation is current), as OCDBT's conditional writes and
    tensorstore's cache revalidation expect.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import socket
import threading
import urllib.parse
from functools import partial
from http import HTTPStatus
from http import server as http_server

from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import buckets
from gcp_storage_emulator.server import RequestHandler
from gcp_storage_emulator.storage import Storage

from st5_jax import paths

# Object URLs of the JSON API (metadata and media) and of media uploads.
_OBJECT_URL = re.compile(r"^(?:/download)?(?:/storage/v1)?/b/(?P<bucket>[-.\w]+)/o/(?P<name>.+)$")
_UPLOAD_URL = re.compile(r"^/upload/storage/v1/b/(?P<bucket>[-.\w]+)/o$")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class _Handler(RequestHandler):
  """gcp-storage-emulator's handler plus generation headers and preconditions."""

  def log_message(self, format, *args):  # noqa: A002  (one line per request is noise)
    del format, args

  def _object(self):
    """(bucket, object name, query) of an object request, else (None, None, query)."""
    url = urllib.parse.urlsplit(self.path)
    query = urllib.parse.parse_qs(url.query)
    m = _OBJECT_URL.match(url.path)
    if m and "/" not in m["bucket"]:
      return m["bucket"], urllib.parse.unquote(m["name"]), query
    m = _UPLOAD_URL.match(url.path)
    if m and "name" in query:
      return m["bucket"], query["name"][0], query
    return None, None, query

  def _generation(self, bucket: str, name: str) -> int:
    try:
      return int(self.storage.get_file_obj(bucket, name)["generation"])
    except NotFound:
      return 0  # GCS: generation 0 matches "does not exist"

  def _precondition_failed(self) -> bool:
    bucket, name, query = self._object()
    if name is None or not ({"ifGenerationMatch", "ifGenerationNotMatch"} & set(query)):
      return False
    generation = self._generation(bucket, name)
    status = None
    if "ifGenerationMatch" in query and int(query["ifGenerationMatch"][0]) != generation:
      status = HTTPStatus.PRECONDITION_FAILED
    if "ifGenerationNotMatch" in query and int(query["ifGenerationNotMatch"][0]) == generation:
      status = HTTPStatus.NOT_MODIFIED if self.command == "GET" else HTTPStatus.PRECONDITION_FAILED
    if status is None:
      return False
    self.send_response(status.value, status.phrase)
    self.send_header("Content-Length", "0")
    self.end_headers()
    return True

  def send_header(self, keyword, value):
    if keyword == "Content-Length" and self.command == "GET":
      bucket, name, _ = self._object()
      if name is not None:
        generation = self._generation(bucket, name)
        if generation:
          super().send_header("x-goog-generation", str(generation))
          super().send_header("x-goog-metageneration", "1")
    super().send_header(keyword, value)

  def do_GET(self):
    if not self._precondition_failed():
      super().do_GET()

  def do_POST(self):
    if not self._precondition_failed():
      super().do_POST()


class _Server(http_server.HTTPServer):
  """One request at a time (the emulator's storage is not thread-safe)."""

  def handle_error(self, request, client_address):
    exc = __import__("sys").exc_info()[1]
    if isinstance(exc, (BrokenPipeError, ConnectionResetError)) or getattr(exc, "errno", None) == errno.EPIPE:
      return  # the client gave up on a response (a cancelled read-ahead): not an emulator error
    super().handle_error(request, client_address)


class GcsEmulator:
  """One in-memory emulator with one bucket; `url(...)` names objects in it."""

  def __init__(self, bucket: str = "st5-test"):
    logging.getLogger("gcp_storage_emulator").setLevel(logging.CRITICAL)  # every 404 is logged at ERROR
    self.bucket = bucket
    self.port = _free_port()
    self.host = f"http://127.0.0.1:{self.port}"
    storage = Storage(use_memory_fs=True)
    buckets.create_bucket(bucket, storage)
    self._httpd = _Server(("127.0.0.1", self.port), partial(_Handler, storage))
    self._thread = threading.Thread(target=self._httpd.serve_forever, name="gcs-emulator", daemon=True)
    self._thread.start()

  def env(self) -> dict[str, str]:
    """What a subprocess needs to use the emulator: one variable."""
    return {paths.EMULATOR_ENV: self.host}

  def activate(self) -> None:
    """Points this process's clients at the emulator (before any gs:// use in it)."""
    os.environ.update(self.env())
    paths.configure_gcs()

  def url(self, *parts: str) -> str:
    return "/".join([f"gs://{self.bucket}", *parts])

  def upload(self, local_dir: str | os.PathLike, *parts: str) -> str:
    """Copies a local folder into the bucket; returns its gs:// URL."""
    dst = self.url(*parts)
    paths.copy_tree(local_dir, dst)
    return dst

  def stop(self) -> None:
    self._httpd.shutdown()
    self._httpd.server_close()


def _main(argv: list[str] | None = None) -> None:
  """`python tests/gcs_emulator.py --port 9023 --bucket BUCKET`: this emulator as a server of its own.

  For a pod rehearsal by hand (docs/tpu.md): `gcp-storage-emulator start` alone neither sends
  the generation headers tensorstore reads nor honours `ifGenerationMatch`, which orbax's
  checkpoints and a work dir's lease rely on. In memory; serves until interrupted.
  """
  import argparse  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(prog="python tests/gcs_emulator.py", description=_main.__doc__.splitlines()[0])
  parser.add_argument("--host", default="127.0.0.1")
  parser.add_argument("--port", type=int, default=9023)
  parser.add_argument("--bucket", action="append", required=True, help="a bucket to create (repeatable)")
  args = parser.parse_args(argv)
  logging.getLogger("gcp_storage_emulator").setLevel(logging.CRITICAL)  # every 404 is logged at ERROR
  storage = Storage(use_memory_fs=True)
  for bucket in args.bucket:
    buckets.create_bucket(bucket, storage)
  httpd = _Server((args.host, args.port), partial(_Handler, storage))
  print(f"GCS emulator on http://{args.host}:{args.port} (buckets: {', '.join(args.bucket)}); "
        f"export {paths.EMULATOR_ENV}=http://{args.host}:{args.port}", flush=True)
  try:
    httpd.serve_forever()
  except KeyboardInterrupt:
    pass
  finally:
    httpd.server_close()


if __name__ == "__main__":
  _main()
