"""The wheel runs anywhere: built from the repository, installed outside any checkout, it finds its gin files.

`pip wheel --no-deps --no-build-isolation .` of a copy of the repository's files, installed into
a fresh venv in a temporary folder (the dependencies come from this test venv's site-packages
through a .pth line, so nothing is downloaded), then `st5 train --gin_file st5_tiny_cpu.gin` for
a few steps and `st5 aot --help`, from an empty directory with PYTHONPATH unset.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import site
import subprocess
import sys
import tomllib

import pytest
from xla_env import xla_flags

REPO = pathlib.Path(__file__).resolve().parents[1]


def _declared_packages() -> list[str]:
  return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]


def test_every_package_of_the_checkout_is_declared_and_no_top_level_tasks():
  on_disk = sorted(".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "st5_jax").rglob("__init__.py"))
  declared = _declared_packages()
  missing = [p for p in on_disk if p not in declared]
  assert not missing, f"packages missing from pyproject.toml [tool.setuptools] packages: {missing}"
  assert all(p == "st5_jax" or p.startswith("st5_jax.") for p in declared), declared
  # Every folder of gin files is a (data) package of its own: setuptools ships only declared ones.
  gin_dirs = sorted({".".join(("st5_jax", "gin", *p.parent.relative_to(REPO / "gin").parts))
                     for p in (REPO / "gin").rglob("*.gin")})
  assert not [d for d in gin_dirs if d not in declared], f"gin folders missing from packages: {gin_dirs}"
  # The repository's tasks/ stays (a checkout's `import tasks`) and re-exports st5_jax.tasks.
  assert "from st5_jax.tasks import" in (REPO / "tasks" / "__init__.py").read_text()


def _repo_files() -> list[str]:
  out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, check=True, capture_output=True,
                       text=True).stdout.split("\n")
  return [f for f in out if f and (REPO / f).is_file()]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> pathlib.Path:
  """A fresh venv outside the checkout with the wheel built from the repository's files installed in it."""
  root = tmp_path_factory.mktemp("wheel")
  src = root / "src"
  for f in _repo_files():  # a copy: the build's build/ and egg-info stay out of the checkout
    (src / f).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(REPO / f, src / f)
  dist = root / "dist"
  subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                  "-w", str(dist), str(src)], check=True, capture_output=True, text=True)
  (wheel,) = dist.glob("st5_jax-*.whl")
  venv = root / "venv"
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
  new_site = next((venv / "lib").glob("python3*/site-packages"))
  # The dependencies already installed here (torch, jax, ...): a .pth line adds this venv's site-packages to
  # sys.path without running its .pth files, so its editable st5_jax finder is not loaded.
  (new_site / "zz_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
  subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--no-deps",
                  "--no-index", "-q", str(wheel)], check=True, capture_output=True, text=True)
  return venv


def _env() -> dict[str, str]:
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
  env["XLA_FLAGS"] = xla_flags(1)
  return env


def test_the_wheel_installs_outside_the_checkout_and_carries_its_gin_files(installed):
  names = subprocess.run(["unzip", "-Z1", str(next(installed.parent.glob("dist/*.whl")))], check=True,
                         capture_output=True, text=True).stdout.split()
  shipped = {f"st5_jax/gin/{p.relative_to(REPO / 'gin')}" for p in (REPO / "gin").rglob("*.gin")}
  assert shipped and not shipped - set(names), f"gin files missing from the wheel: {sorted(shipped - set(names))}"
  assert not [n for n in names if n.startswith("tasks/")], "a top-level tasks package was installed"
  probe = ("import importlib.util, st5_jax, st5_jax.gin_config as g; "
           "print(st5_jax.__file__); print(g.shipped_gin_dir()); print(importlib.util.find_spec('tasks'))")
  out = subprocess.run([str(installed / "bin" / "python"), "-c", probe], cwd=installed.parent, env=_env(),
                       check=True, capture_output=True, text=True).stdout.split("\n")
  assert pathlib.Path(out[0]).is_relative_to(installed), out[0]
  assert pathlib.Path(out[1]) == pathlib.Path(out[0]).parent / "gin"
  assert out[2] == "None"


def test_the_installed_wheel_trains_by_gin_name_from_an_empty_directory(installed, tmp_path):
  empty = tmp_path / "empty"
  empty.mkdir()
  st5 = str(installed / "bin" / "st5")
  help_run = subprocess.run([st5, "aot", "--help"], cwd=empty, env=_env(), capture_output=True, text=True)
  assert help_run.returncode == 0 and "--topology" in help_run.stdout, help_run.stderr
  train = subprocess.run(
      [st5, "train", "--gin_file", "st5_tiny_cpu.gin", "--workdir", str(tmp_path / "wd"), "--no_progress",
       "--gin.TrainConfig.num_train_steps=3", "--gin.TrainConfig.eval_every=-1", "--gin.TrainConfig.log_every=1",
       "--gin.TrainConfig.global_batch_size=8"],
      cwd=empty, env=_env(), capture_output=True, text=True, timeout=600)
  assert train.returncode == 0, train.stderr[-3000:]
  assert "step 3/3" in train.stderr, train.stderr[-2000:]
  assert (tmp_path / "wd" / "operative_config.gin").is_file()
  assert os.listdir(empty) == []  # nothing written where the user stood
