"""Where a work dir's configuration came from, and every change to it across resumes.

The invocation that starts a run (no committed checkpoint yet) writes `config.gin` and
`operative_config.gin`; later invocations never rewrite them. A resume compares its operative
gin bindings (`gin.operative_config_str()`, parsed into `key -> value`) with the recorded ones:
`operative_config.gin` with the changes of `config_history.json` applied. A change outside
`ALLOWED` is refused with one line that lists each differing binding (`key: old -> new`),
unless the user passes `st5 train --allow_config_change`; an allowed change (paths,
logging, evaluation and checkpoint cadence, the target slice and its mesh) resumes without
the flag. Either way the change is appended to `config_history.json` (step, bindings
before and after, time, host), which `train_config.json` and exported model cards report.
A parameter the record lacks (added to the code since) is no change while it keeps its default.

No gin here: st5_jax.gin_config hands over the config text; train.py reads the history.
"""

from __future__ import annotations

import datetime
import fnmatch
import json
import logging
import re
import socket
from typing import Any

from st5_jax import paths
from st5_jax.checkpoints import native

log = logging.getLogger(__name__)

CONFIG_FILE = "config.gin"
OPERATIVE_FILE = "operative_config.gin"
HISTORY_FILE = "config_history.json"
TRAIN_CONFIG_FILE = "train_config.json"
ALLOW_FLAG = "--allow_config_change"

# Bindings a resume may change without ALLOW_FLAG (scope and module prefixes ignored): where the data is,
# how often the run logs, evaluates and checkpoints, and the slice and mesh it runs on (a different global
# batch size is a change of TrainConfig.global_batch_size, which is not allowed).
ALLOWED = ("options.data_dir", "options.tfds_data_dir", "TrainConfig.log_every", "TrainConfig.eval_every",
           "TrainConfig.checkpoint_every", "TrainConfig.keep_checkpoints", "run.target", "run.rules", "MeshConfig.*",
           "logical_rules.*")
# Paths that may move from one place to another (not appear or disappear: that changes what is read).
ALLOWED_PATH_MOVES = ("DataConfig.cache_dir",)

_BINDING = re.compile(r"^([A-Za-z_][\w./]*)\s*=\s*(.*)$")


class ConfigChangeError(ValueError):
  """A resume with bindings that differ from the recorded ones, without --allow_config_change."""


def parse_bindings(text: str) -> dict[str, str]:
  """`key -> value` of a gin config text (operative_config_str()): comments and imports skipped, a value
  continued over indented lines (or after a trailing backslash) joined, whitespace normalised."""
  out: dict[str, str] = {}
  key, value = None, []
  for line in text.splitlines() + [""]:
    continued = key is not None and (line[:1].isspace() or (value and value[-1].endswith("\\"))) and line.strip()
    if continued:
      value.append(line.strip())
      continue
    if key is not None:
      out[key] = " ".join(" ".join(v.rstrip("\\") for v in value).split())
      key = None
    stripped = line.strip()
    if not stripped or stripped.startswith("#") or stripped.startswith(("import ", "from ")):
      continue
    m = _BINDING.match(line)
    if m:
      key, value = m.group(1), [m.group(2)]
  return out


def allowed(key: str, before: str | None, after: str | None) -> bool:
  """Whether a resume may change `key` from `before` to `after` without ALLOW_FLAG."""
  name = key.rpartition("/")[2]

  def matches(pattern: str) -> bool:
    return fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name, "*." + pattern)

  if any(matches(p) for p in ALLOWED):
    return True
  return any(matches(p) for p in ALLOWED_PATH_MOVES) and before not in (None, "None") and after not in (None, "None")


def read_history(workdir: paths.PathLike) -> list[dict[str, Any]]:
  """The recorded changes, oldest first ([] when none)."""
  path = paths.join(workdir, HISTORY_FILE)
  if not paths.exists(path):
    return []
  return list(json.loads(paths.read_text(path)).get("changes", []))


def recorded_bindings(workdir: paths.PathLike) -> dict[str, str] | None:
  """The bindings the run has now: the first invocation's operative config with every recorded change applied."""
  path = paths.join(workdir, OPERATIVE_FILE)
  if not paths.exists(path):
    return None
  bindings = parse_bindings(paths.read_text(path))
  for entry in read_history(workdir):
    for change in entry["bindings"]:
      if change["after"] is None:
        bindings.pop(change["binding"], None)
      else:
        bindings[change["binding"]] = change["after"]
  return bindings


def differences(before: dict[str, str], after: dict[str, str]) -> list[dict[str, str | None]]:
  """[{binding, before, after}] of every key whose value differs (None: not bound on that side), sorted by key."""
  return [{"binding": k, "before": before.get(k), "after": after.get(k)}
          for k in sorted(set(before) | set(after)) if before.get(k) != after.get(k)]


def describe(change: dict[str, Any]) -> str:
  def show(v):
    return "(unset)" if v is None else v
  return f"{change['binding']}: {show(change['before'])} -> {show(change['after'])}"


def check_and_record(workdir: paths.PathLike, *, config_text: str, operative_text: str, allow_change: bool = False,
                     write: bool = True) -> list[dict[str, Any]]:
  """Records a start (the config files) or checks a resume against the record; returns the changes recorded.

  A work dir without a committed checkpoint starts over: config.gin and operative_config.gin are
  (re)written and an old history removed. A resume with changes outside ALLOWED raises
  ConfigChangeError unless `allow_change`; allowed ones are appended to config_history.json.
  write: False on the processes that are not the lead (they check, the lead writes).
  """
  steps = native.committed_steps(workdir)
  history_path = paths.join(workdir, HISTORY_FILE)
  if not steps or not paths.exists(paths.join(workdir, OPERATIVE_FILE)):
    if write:
      paths.write_text(paths.join(workdir, CONFIG_FILE), config_text)
      paths.write_text(paths.join(workdir, OPERATIVE_FILE), operative_text)
      if not steps and paths.exists(history_path):
        log.warning("%s has no committed checkpoint: the run starts over; removing its old %s.", workdir, HISTORY_FILE)
        paths.path(history_path).unlink()
    return []
  # A parameter the recorded run's code did not have yet, left at its default (not bound in config_text), is
  # not a change: an upgrade that adds a setting (e.g. Contrastive.matryoshka_dims) resumes older work dirs.
  explicit = parse_bindings(config_text)
  changes = [c for c in differences(recorded_bindings(workdir), parse_bindings(operative_text))
             if not (c["before"] is None and c["binding"] not in explicit)]
  if not changes:
    return []
  refused = [c for c in changes if not allowed(c["binding"], c["before"], c["after"])]
  if refused and not allow_change:
    raise ConfigChangeError(
        f"The work dir {workdir} (checkpoint step {steps[-1]}) was trained with other bindings; this command "
        f"changes {'; '.join(describe(c) for c in refused)}. Rerun with the recorded config ({OPERATIVE_FILE} with "
        f"the changes in {HISTORY_FILE}), or pass `st5 train {ALLOW_FLAG}` to resume with the change (it is "
        f"recorded in {HISTORY_FILE}).")
  entry = {"step": steps[-1], "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "host": socket.gethostname(), "allowed_by": ALLOW_FLAG if refused else "allow-list", "bindings": changes}
  log.warning("Resuming %s at step %d with changed bindings (%s): %s; recorded in %s.", workdir, steps[-1],
              entry["allowed_by"], "; ".join(describe(c) for c in changes), HISTORY_FILE)
  if write:
    history = read_history(workdir) + [entry]
    paths.write_text(history_path, json.dumps({"changes": history}, indent=2) + "\n")
  return changes


def write_train_config(workdir: paths.PathLike, config: dict[str, Any], *, resumed: bool) -> None:
  """train_config.json: the config the run started with, and the history of changes (`config_history`).

  A resume keeps the recorded config (a later invocation's values are in the history, not written over it).
  """
  path = paths.join(workdir, TRAIN_CONFIG_FILE)
  record = dict(config)
  if resumed and paths.exists(path):
    record = json.loads(paths.read_text(path))
  record.pop("config_history", None)
  history = read_history(workdir)
  if history:
    record["config_history"] = history
  paths.write_text(path, json.dumps(record, indent=2))
