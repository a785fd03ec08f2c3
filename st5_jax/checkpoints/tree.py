"""Flat parameter dictionaries and their assembly into a model's parameter tree.

Every importer produces `{"encoder/layers_0/attention/query/kernel": array, ...}` in
T5X names (unscanned), plus what it learned about the model. `assemble` checks those
arrays against the model's expected shapes (from `jax.eval_shape`, no allocation),
reports missing and unexpected names, refuses shape mismatches, and stacks per-layer
arrays when the model scans over layers.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
import numpy as np

from st5_jax.configs import ST5Config
from st5_jax.model.st5 import abstract_params, init_params

log = logging.getLogger(__name__)

# An optional tower prefix: asymmetric "separate" towers (st5_jax/model/st5.py) nest a whole tower in each.
_STACKS = r"(?:left_tower/|right_tower/)?(?:encoder|decoder|weak_decoder)"
_LAYER_RE = re.compile(rf"^({_STACKS})/layers_(\d+)/(.*)$")


class ParameterMismatchError(ValueError):
  """Loaded arrays do not fit the model (missing names or wrong shapes)."""


@dataclasses.dataclass
class LoadReport:
  source: str
  loaded: list[str]
  missing_initialised: list[str]  # absent from the source, freshly initialised (allowed)
  unused: list[str]  # present in the source, not part of this model (e.g. the decoder of enc_mean)
  unexpected: list[str]  # present in the source, unknown to any T5 layout

  def summary(self) -> str:
    parts = [f"{len(self.loaded)} arrays loaded from {self.source}"]
    if self.missing_initialised:
      parts.append(f"freshly initialised: {', '.join(self.missing_initialised)}")
    if self.unused:
      parts.append(f"{len(self.unused)} unused by this pooling (e.g. {self.unused[0]})")
    if self.unexpected:
      parts.append(f"unexpected: {', '.join(self.unexpected)}")
    return "; ".join(parts)


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  out = {}
  for k, v in tree.items():
    key = f"{prefix}/{k}" if prefix else str(k)
    if isinstance(v, Mapping):
      out.update(flatten(v, key))
    else:
      out[key] = v
  return out


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
  tree: dict[str, Any] = {}
  for key, v in flat.items():
    node = tree
    *parents, leaf = key.split("/")
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = v
  return tree


def stack_layers(flat: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """`encoder/layers_i/x` -> `encoder/layers/x` stacked on a new leading axis."""
  out, groups = {}, {}
  for key, v in flat.items():
    m = _LAYER_RE.match(key)
    if m:
      groups.setdefault((m[1], m[3]), {})[int(m[2])] = v
    else:
      out[key] = v
  for (stack, rest), by_index in groups.items():
    out[f"{stack}/layers/{rest}"] = np.stack([by_index[i] for i in sorted(by_index)])
  return out


def unstack_layers(flat: Mapping[str, Any]) -> dict[str, Any]:
  """Inverse of `stack_layers`: per-layer names from scanned ones."""
  out = {}
  for key, v in flat.items():
    m = re.match(rf"^({_STACKS})/layers/(.*)$", key)
    if m:
      for i in range(v.shape[0]):
        out[f"{m[1]}/layers_{i}/{m[2]}"] = v[i]
    else:
      out[key] = v
  return out


def _known_t5_name(key: str) -> bool:
  """A part this project writes: the tower's, or a training objective's head (SEED-Encoder's
  `weak_decoder`, ConSERT's `nli_classifier`), reported unused where the model lacks it."""
  return bool(re.match(r"^(left_tower/|right_tower/)?(token_embedder|encoder|decoder|projection_layer|"
                       r"left_projection_layer|right_projection_layer|weak_decoder|layer_attention|"
                       r"nli_classifier)(/|$)", key))


def assemble(config: ST5Config, flat: Mapping[str, np.ndarray], *, source: str,
             fresh_ok: tuple[str, ...] = (), rng: jax.Array | None = None,
             abstract_fn: Callable[[], Any] | None = None, init_fn: Callable[[jax.Array], Any] | None = None,
             ) -> tuple[dict[str, Any], LoadReport]:
  """Builds the (unboxed, numpy float32) parameter tree of `SentenceT5(config)`.

  `fresh_ok` lists name prefixes that may be absent and are then initialised from
  `rng` (e.g. "projection_layer/" when a raw T5 checkpoint starts ST5 training).
  `abstract_fn` / `init_fn` (boxed abstract tree; rng -> boxed parameters) assemble
  another model's tree instead (a training objective's module: the tower plus its heads).
  """
  abstract_fn = abstract_fn or (lambda: abstract_params(config))
  init_fn = init_fn or (lambda key: init_params(config, key))
  abstract = flatten(nn.unbox(abstract_fn()))
  flat = dict(flat)
  scanned = config.t5.scan_layers
  if scanned:
    flat = stack_layers(flat)
  missing = [k for k in abstract if k not in flat]
  fresh = [k for k in missing if k.startswith(fresh_ok)] if fresh_ok else []
  hard_missing = [k for k in missing if k not in fresh]
  extra = sorted(k for k in flat if k not in abstract)
  unused = [k for k in extra if _known_t5_name(k)]
  unexpected = [k for k in extra if not _known_t5_name(k)]
  bad_shapes = [f"{k}: {tuple(np.shape(flat[k]))} in {source}, model expects {tuple(abstract[k].shape)}"
                for k in abstract if k in flat and tuple(np.shape(flat[k])) != tuple(abstract[k].shape)]
  problems = []
  if hard_missing:
    problems.append(f"missing from {source}: {', '.join(hard_missing)}")
  if bad_shapes:
    problems.append("shape mismatch: " + "; ".join(bad_shapes))
  if problems:
    raise ParameterMismatchError(
        f"Cannot load {source} into the model (pooling={config.pooling}, "
        f"embedding_dim={config.embedding_dim}): " + " | ".join(problems) +
        (f" | unexpected names: {', '.join(unexpected)}" if unexpected else ""))
  params = {k: np.asarray(flat[k], np.float32) for k in abstract if k in flat}
  if fresh:
    if rng is None:
      raise ValueError(f"{', '.join(fresh)} must be initialised but no rng was given")
    init = flatten(jax.device_get(nn.unbox(init_fn(rng))))
    params.update({k: np.asarray(init[k], np.float32) for k in fresh})
  report = LoadReport(source, sorted(k for k in abstract if k in flat), fresh, unused, unexpected)
  if unexpected:
    log.warning("Unexpected parameters in %s (not loaded): %s", source, ", ".join(unexpected))
  log.info("%s", report.summary())
  return unflatten(params), report
