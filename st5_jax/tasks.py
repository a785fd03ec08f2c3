"""Every Sentence-T5 seqio task and mixture: `import st5_jax.tasks` registers them all.

The registrations live in st5_jax.data.tasks and in each objective's own module
(st5_jax/objectives/: ConSERT's consert_*, SEED-Encoder's st5_seed_*); this module is
where t5x users look for them: importing it registers all of them, and it re-exports the
names of st5_jax.data.tasks. The repository's top-level `tasks/` package re-exports this
module for checkouts; an installed wheel carries only `st5_jax`, so no generic top-level
`tasks` module is installed beside a user's own.
Register tasks of your own in a module of yours and import it from the gin file
(`import my_tasks`); see docs/data.md.
"""

from st5_jax.data.tasks import *  # noqa: F401,F403  pylint: disable=wildcard-import
from st5_jax.data.tasks import __all__ as _DATA_TASKS
from st5_jax.objectives import import_all_tasks as _import_all_tasks

_import_all_tasks()
from st5_jax.objectives.seed_encoder.tasks import QA_TEXT as SEED_QA_TEXT  # noqa: E402,F401
from st5_jax.objectives.seed_encoder.tasks import TFDS_C4 as SEED_TFDS_C4  # noqa: E402,F401
from st5_jax.objectives.seed_encoder.tasks import USER_TEXT as SEED_USER_TEXT  # noqa: E402,F401

__all__ = [*_DATA_TASKS, "SEED_QA_TEXT", "SEED_TFDS_C4", "SEED_USER_TEXT"]
