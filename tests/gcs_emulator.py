"""A Google Cloud Storage emulator on 127.0.0.1 for tests (gcp-storage-emulator, in memory).

Started by the tests themselves; clients find it through STORAGE_EMULATOR_HOST only
(st5_jax.paths derives every other library's setting from that one variable).
"""

from __future__ import annotations

import logging
import os
import socket

from gcp_storage_emulator.server import create_server

from st5_jax import paths


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class GcsEmulator:
  """One in-memory emulator; `url(...)` names objects in its bucket."""

  def __init__(self, bucket: str = "st5-test"):
    # The emulator logs every 404 (a normal answer to "does this exist?") at ERROR.
    logging.getLogger("gcp_storage_emulator").setLevel(logging.CRITICAL)
    self.bucket = bucket
    self.port = _free_port()
    self.host = f"http://127.0.0.1:{self.port}"
    self._server = create_server("127.0.0.1", self.port, in_memory=True, default_bucket=bucket)
    self._server.start()

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
    self._server.stop()
