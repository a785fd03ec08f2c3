"""Getting dataset files: from a local folder, a mirror or canonical URLs, checksum-verified.

`Fetcher.fetch` tries, in order: the copy already in the output folder, a local source
folder in the data layout (files at their catalog relpaths), then downloads (a mirror
`base_url` laid out the same way, or the file's canonical URLs). A file is only ever
written under its final name after its sha256 matched, so an interrupted or corrupt
download never looks like a good file. When everything fails, the error names the file,
every place tried with what went wrong, and where to put a copy. Derived files are never
downloaded: prepare takes a verified copy at hand, else derives them (derive.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import http.client
import os
import shutil
import socket
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from typing import Callable

from st5_jax.data.offline.catalog import RemoteFile

_CHUNK = 1 << 16
USER_AGENT = "st5_jax-data/0.1 (+https://github.com/; dataset fetcher)"


class DownloadError(IOError):
  """One URL failed (HTTP error, connection problem, truncated body)."""


class ChecksumError(DownloadError):
  """Bytes arrived but their sha256 is not the expected one."""


class FetchError(FileNotFoundError):
  """A file could not be obtained from anywhere; the message says where to put a copy."""


def sha256_of(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def download(url: str, dest: str, *, expected_sha256: str | None, timeout: float = 60.0,
             progress: Callable[[int, int | None], None] | None = None) -> str:
  """Downloads `url` to `dest` if its sha256 is `expected_sha256` (None: accept any); returns the sha256."""
  request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
  os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix=".part-", dir=os.path.dirname(os.path.abspath(dest)))
  h = hashlib.sha256()
  received = 0
  total = None
  try:
    with os.fdopen(fd, "wb") as out:
      try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
          length = response.headers.get("Content-Length")
          total = int(length) if length and length.isdigit() else None
          while True:
            try:
              block = response.read(_CHUNK)
            except http.client.IncompleteRead as e:
              received += len(e.partial)
              raise DownloadError(f"{url}: truncated download: received {received} of {total} bytes "
                                  "(connection closed early)") from None
            if not block:
              break
            out.write(block)
            h.update(block)
            received += len(block)
            if progress:
              progress(received, total)
      except urllib.error.HTTPError as e:
        raise DownloadError(f"{url}: HTTP {e.code} {e.reason}") from None
      except urllib.error.URLError as e:
        raise DownloadError(f"{url}: cannot connect ({e.reason})") from None
      except (socket.timeout, TimeoutError) as e:
        raise DownloadError(f"{url}: timed out after {timeout:.0f}s ({received} bytes received)") from e
      except (ConnectionError, http.client.HTTPException) as e:
        raise DownloadError(f"{url}: connection failed after {received} bytes ({e})") from e
    if total is not None and received != total:
      raise DownloadError(f"{url}: truncated download: received {received} of {total} bytes")
    digest = h.hexdigest()
    if expected_sha256 and digest != expected_sha256:
      raise ChecksumError(f"{url}: checksum mismatch: got sha256 {digest} ({received} bytes), expected "
                          f"{expected_sha256}; the file is corrupt, truncated or changed upstream")
    os.replace(tmp, dest)
    return digest
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def _extract_member(archive: str, member: str, dest: str) -> None:
  os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
  tmp = dest + ".part"
  if zipfile.is_zipfile(archive):
    with zipfile.ZipFile(archive) as z, z.open(member) as src, open(tmp, "wb") as out:
      shutil.copyfileobj(src, out)
  else:
    with tarfile.open(archive) as t:
      src = t.extractfile(member)
      if src is None:
        raise KeyError(member)
      with src, open(tmp, "wb") as out:
        shutil.copyfileobj(src, out)
  os.replace(tmp, dest)


@dataclasses.dataclass
class FetchResult:
  relpath: str
  status: str  # present | copied | downloaded
  sha256: str
  origin: str  # path or URL
  verified: bool = True


class Fetcher:
  """Fetches catalog files into `out_dir`; archives are downloaded once per Fetcher."""

  def __init__(self, *, out_dir: str, source_dir: str | None = None, base_url: str | None = None,
               offline: bool = False, trust_unverified: bool = False, timeout: float = 60.0,
               progress_factory: Callable[[str], Callable[[int, int | None], None] | None] | None = None):
    self.out_dir = str(out_dir)
    self.source_dir = str(source_dir) if source_dir else None
    self.base_url = base_url.rstrip("/") if base_url else None
    self.offline = offline
    self.trust_unverified = trust_unverified
    self.timeout = timeout
    self.progress_factory = progress_factory or (lambda name: None)
    self._archives: dict[str, str] = {}
    self._archive_dir: tempfile.TemporaryDirectory | None = None

  def close(self) -> None:
    if self._archive_dir is not None:
      self._archive_dir.cleanup()
      self._archive_dir = None

  def candidate_urls(self, f: RemoteFile) -> list[str]:
    if self.base_url:
      return [f"{self.base_url}/{urllib.parse.quote(f.relpath)}"]
    return list(f.urls)

  def fetch(self, f: RemoteFile, *, download_allowed: bool = True) -> FetchResult:
    """The file from the output folder, the source folder or (download_allowed) a download; else FetchError."""
    dest = os.path.join(self.out_dir, f.relpath)
    tried = []
    if os.path.exists(dest):
      digest = sha256_of(dest)
      if f.sha256 is None or digest == f.sha256:
        return FetchResult(f.relpath, "present", digest, dest, verified=f.sha256 is not None)
      tried.append(f"{dest}: already there but sha256 {digest} is not {f.sha256} (will be replaced)")
    if self.source_dir:
      src = os.path.join(self.source_dir, f.relpath)
      if os.path.exists(src):
        digest = sha256_of(src)
        if f.sha256 is None or digest == f.sha256:
          if os.path.abspath(src) != os.path.abspath(dest):
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            tmp = dest + ".part"
            shutil.copyfile(src, tmp)
            os.replace(tmp, dest)
          return FetchResult(f.relpath, "copied", digest, src, verified=f.sha256 is not None)
        tried.append(f"{src}: local copy has sha256 {digest}, expected {f.sha256}")
      else:
        tried.append(f"{src}: not found")
    urls = self.candidate_urls(f) if download_allowed and not self.offline else []
    if self.offline:
      tried.append("downloads disabled (--offline)")
    for url in urls:
      if f.sha256 is None and not self.trust_unverified:
        tried.append(f"{url}: not downloaded: no known sha256 for this file (pass --trust-unverified to accept "
                     "and record the checksum of what arrives)")
        continue
      try:
        if "#" in url:
          digest = self._fetch_member(url, dest, f.sha256)
        else:
          digest = download(url, dest, expected_sha256=f.sha256, timeout=self.timeout,
                            progress=self.progress_factory(f.relpath))
        return FetchResult(f.relpath, "downloaded", digest, url, verified=f.sha256 is not None)
      except (DownloadError, KeyError, zipfile.BadZipFile, tarfile.TarError) as e:
        tried.append(f"{url}: {e}" if not isinstance(e, DownloadError) else str(e))
    if download_allowed and not urls and not self.offline and not self.base_url:
      tried.append("no public URL with identical bytes (reconstructed file: local-only)")
    raise FetchError(
        f"Cannot get {f.relpath}. Tried:\n  - " + "\n  - ".join(tried) +
        f"\nPut a copy at {dest}, or at {f.relpath} inside another folder and pass that folder as --source "
        "(or ST5_DATA_DIR), or pass --base-url to a mirror with the same relative paths.")

  def _fetch_member(self, url: str, dest: str, expected: str | None) -> str:
    archive_url, member = url.split("#", 1)
    if archive_url not in self._archives:
      if self._archive_dir is None:
        self._archive_dir = tempfile.TemporaryDirectory(prefix="st5-archives-")
      local = os.path.join(self._archive_dir.name, str(len(self._archives)))
      download(archive_url, local, expected_sha256=None, timeout=self.timeout,
               progress=self.progress_factory(os.path.basename(archive_url)))
      self._archives[archive_url] = local
    tmp = dest + ".member"
    try:
      _extract_member(self._archives[archive_url], member, tmp)
      digest = sha256_of(tmp)
      if expected and digest != expected:
        raise ChecksumError(f"{url}: checksum mismatch: got sha256 {digest}, expected {expected}")
      os.replace(tmp, dest)
      return digest
    finally:
      if os.path.exists(tmp):
        os.remove(tmp)
