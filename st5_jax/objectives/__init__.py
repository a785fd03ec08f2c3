"""Training objectives, one home each, behind one interface (base.py); the trainer names none.

  contrastive.py    the paper's in-batch softmax (and its SimCSE form)      gin @Contrastive()
  consert/          ConSERT: views, NT-Xent, the joint NLI classifier        gin @ConsertUnsup(), @ConsertJoint()
  seed_encoder/     SEED-Encoder: span corruption + the weak decoder        gin @SeedEncoder()
  align_uniform.py  the walked-through example objective                     gin @AlignUniform()
  distill/          distillation from a teacher cache (st5 distill-cache)     gin @Distill()
  grad_cache.py     GradCache for any loss over per-example embeddings

`REGISTRY` maps names to classes; `get(name_or_objective)` returns an instance.
"""

from __future__ import annotations

from typing import Any

from st5_jax.objectives.base import REGISTRY, SIDES, Feature, InferenceTower, Objective, ObjectiveConfigError, register
from st5_jax.objectives.align_uniform import AlignUniform
from st5_jax.objectives.consert.objective import ConsertJoint, ConsertUnsup
from st5_jax.objectives.contrastive import Contrastive
from st5_jax.objectives.distill.objective import Distill
from st5_jax.objectives.seed_encoder.objective import SeedEncoder

__all__ = ["REGISTRY", "SIDES", "AlignUniform", "ConsertJoint", "ConsertUnsup", "Contrastive", "Distill", "Feature",
           "InferenceTower", "Objective", "ObjectiveConfigError", "SeedEncoder", "default", "get", "import_all_tasks",
           "register"]

# The string values `TrainConfig.objective` took before objectives were configurables (2026-12),
# and what to write instead.
LEGACY_NAMES = {
    "st5": "@Contrastive() (the default; its settings: Contrastive.temperature, .bidirectional, "
           ".label_smoothing, .loss, .hard_negative_weight)",
    "consert_unsup": "@ConsertUnsup() (its settings: ConsertUnsup.view1, .view1_rate, .view2, .view2_rate, "
                     ".temperature, .weight, .shuffle)",
    "consert_joint": "@ConsertJoint() (its settings: ConsertJoint.view1, ..., .nli_classes)",
    "seed_encoder": "@SeedEncoder() (its settings: SeedEncoder.num_layers, .window, .memory, .decoder_loss_weight)",
}


def check_is_objective(value: Any, where: str) -> None:
  """Refuses a value that is not an Objective (the old string form gets its replacement named)."""
  if isinstance(value, str):
    hint = LEGACY_NAMES.get(value)
    raise ObjectiveConfigError(
        f"{where} = {value!r} is the old form: write {where} = {hint}" if hint else
        f"{where} must be an objective such as @Contrastive() (registered: {sorted(REGISTRY)}), got {value!r}")
  if not isinstance(value, Objective):
    raise ObjectiveConfigError(f"{where} must be an Objective (e.g. @Contrastive()), got {type(value).__name__}")


def default() -> Objective:
  """The objective of a run that names none: the paper's in-batch softmax (`TrainConfig.objective`'s default)."""
  return Contrastive()


def get(objective: Any) -> Objective:
  """An Objective instance; a string names a registered one (with its default settings)."""
  if isinstance(objective, Objective):
    return objective
  if isinstance(objective, type) and issubclass(objective, Objective):
    return objective()
  if isinstance(objective, str) and objective in REGISTRY:
    return REGISTRY[objective]()
  raise ObjectiveConfigError(f"Unknown objective {objective!r}; registered: {sorted(REGISTRY)}")


def import_all_tasks() -> None:
  """Registers the seqio tasks every registered objective ships (imports TensorFlow and seqio)."""
  for cls in REGISTRY.values():
    cls().import_tasks()
