"""A sweep's definition: arms (sets of gin bindings), grids, each run's bindings, config key and work dir.

A run's bindings, in the order gin applies them (a later one wins): the gin files, the
`--gin.K=V` flags, the arm's bindings (arms file), the grid's bindings, then
`TrainConfig.seed = S`. Its key is a hash of the whole parsed config (gin.config_str():
every binding of the files, includes expanded, and of the flags); the run dir is
OUT/runs/<arm>/seed<S>.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import re
from typing import Sequence

from st5_jax import paths

SEED_BINDING = "TrainConfig.seed"
_NAME_OK = re.compile(r"[^A-Za-z0-9._=+-]")  # no commas: --only takes a comma-separated list


class SweepError(ValueError):
  """A sweep definition or output folder this command refuses (one line from the CLI)."""


@dataclasses.dataclass(frozen=True)
class Arm:
  """A named set of gin bindings (applied after the base files and flags)."""

  name: str
  bindings: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Run:
  """One arm at one seed: its work dir and the key of its parsed gin config."""

  arm: str
  seed: int
  bindings: tuple[str, ...]  # every binding after the gin files: flags, arm, grid, seed
  dir: str
  key: str
  config: str  # gin.config_str() of the parsed files and bindings

  @property
  def label(self) -> str:
    return f"{self.arm}/seed{self.seed}"


def split_values(text: str) -> list[str]:
  """'a,b' -> ['a', 'b'], but commas inside quotes or brackets stay: "{'x': 1, 'y': 2},'p,q'" is 2 values."""
  out, depth, quote, start = [], 0, None, 0
  for i, ch in enumerate(text):
    if quote:
      if ch == quote:
        quote = None
    elif ch in "'\"":
      quote = ch
    elif ch in "([{":
      depth += 1
    elif ch in ")]}":
      depth -= 1
    elif ch == "," and depth == 0:
      out.append(text[start:i].strip())
      start = i + 1
  out.append(text[start:].strip())
  if quote or depth or any(not v for v in out):
    raise SweepError(f"cannot split {text!r} into values (an empty value, an open quote or bracket)")
  return out


def parse_grid(spec: str) -> tuple[str, list[str]]:
  """'KEY=V1,V2' -> ('KEY', ['V1', 'V2']) (values in gin syntax: strings quoted)."""
  key, eq, values = spec.partition("=")
  key = key.strip()
  if not eq or not key or not values.strip():
    raise SweepError(f"--grid {spec!r}: expected KEY=V1,V2,... (e.g. st5_model.pooling=\"'enc_first','enc_mean'\")")
  return key, split_values(values)


def parse_arms(text: str, source: str = "arms file") -> list[Arm]:
  """An arms file: `[name]` starts an arm, each further line is a gin statement of it.

  Lines starting with `#` are comments; an indented line continues the statement above
  (a dict over several lines). A statement may be a binding, `include 'f.gin'` or `import m`.
  """
  arms: list[Arm] = []
  name, lines = None, []

  def close():
    if name is not None:
      arms.append(Arm(name, tuple(lines)))

  for number, raw in enumerate(text.splitlines(), 1):
    line = raw.rstrip()
    if not line.strip() or line.lstrip().startswith("#"):
      continue
    m = re.fullmatch(r"\[(.+)\]", line.strip())
    if m:
      close()
      name, lines = m.group(1).strip(), []
    elif name is None:
      raise SweepError(f"{source}:{number}: {line.strip()!r} comes before the first [arm name]")
    elif raw[:1].isspace() and lines:
      lines[-1] += " " + line.strip()
    else:
      lines.append(line.strip())
  close()
  if not arms:
    raise SweepError(f"{source}: no arms (an arm starts with a line `[name]`)")
  return arms


def _short(key: str, value: str) -> str:
  """A name part for a grid value: 'st5_model.pooling', "'enc_first'" -> 'pooling=enc_first'."""
  return f"{key.rsplit('.', 1)[-1]}={value.strip(chr(39) + chr(34))}"


def safe_name(name: str) -> str:
  """An arm name usable as a folder name (other characters become _)."""
  return _NAME_OK.sub("_", name)


def expand(arms: Sequence[Arm] | None, grids: Sequence[tuple[str, list[str]]] = ()) -> list[Arm]:
  """Every arm x every point of the grids' product; an arm's bindings come before the grid's.

  Names: the arm's, then `key=value` per grid key (last part of the key), joined by '+'.
  Without arms there is one unnamed arm; without either, one arm 'base'.
  """
  arms = list(arms) if arms else [Arm("", ())]
  out = []
  for arm in arms:
    for point in itertools.product(*[[(k, v) for v in values] for k, values in grids]):
      parts = [arm.name] if arm.name else []
      parts += [_short(k, v) for k, v in point]
      name = safe_name("+".join(parts) or "base")
      out.append(Arm(name, arm.bindings + tuple(f"{k}={v}" for k, v in point)))
  names = [a.name for a in out]
  dupes = sorted({n for n in names if names.count(n) > 1})
  if dupes:
    raise SweepError(f"arm names are not unique: {dupes}")
  return out


def _binds_seed(binding: str) -> bool:
  return re.match(rf"\s*(?:[\w./]*/)?{re.escape(SEED_BINDING)}\s*=", binding) is not None


def run_bindings(flag_bindings: Sequence[str], arm: Arm, seed: int) -> list[str]:
  """The bindings of one run after the gin files: flags, arm (and grid), seed; `{seed}` is replaced."""
  for b in (*flag_bindings, *arm.bindings):
    if _binds_seed(b):
      raise SweepError(f"{b!r}: the sweep binds {SEED_BINDING} itself (--seeds); remove that binding")
  return [b.replace("{seed}", str(seed)) for b in (*flag_bindings, *arm.bindings)] + [f"{SEED_BINDING} = {seed}"]


def config_key(config: str) -> str:
  """The run key: 12 hex digits of the SHA-256 of the parsed gin config."""
  return hashlib.sha256(config.encode("utf-8")).hexdigest()[:12]


def parse_config(gin_files: Sequence[str], bindings: Sequence[str], search_paths: Sequence[str] = ()) -> str:
  """Parses as `st5 train` does; returns gin.config_str() (the config the key hashes)."""
  import gin  # pylint: disable=g-import-not-at-top  (JAX, via gin_config)

  from st5_jax import gin_config  # pylint: disable=g-import-not-at-top

  gin_config.parse_gin(list(gin_files), list(bindings), list(search_paths))
  return gin.config_str()


def plan(gin_files: Sequence[str], flag_bindings: Sequence[str], arms: Sequence[Arm], seeds: Sequence[int],
         out: str, search_paths: Sequence[str] = ()) -> list[Run]:
  """Every arm x seed as a Run (arm-major); parses each run's gin config (a typo fails here, before any run)."""
  runs = []
  for arm in arms:
    for seed in seeds:
      bindings = run_bindings(flag_bindings, arm, seed)
      config = parse_config(gin_files, bindings, search_paths)
      runs.append(Run(arm=arm.name, seed=seed, bindings=tuple(bindings),
                      dir=paths.join(out, "runs", arm.name, f"seed{seed}"), key=config_key(config), config=config))
  return runs
