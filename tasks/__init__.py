"""Sentence-T5 seqio tasks and mixtures: `import tasks` registers them.

The registrations live in st5_jax.data.tasks and in each objective's own module
(st5_jax/objectives/: ConSERT's consert_*, SEED-Encoder's st5_seed_*); this top-level
package is where t5x users look for them: it registers all of them and re-exports the
names of st5_jax.data.tasks.
Register tasks of your own in a module of yours and import it from the gin file
(`import my_tasks`); see docs/data.md.
"""

from st5_jax.data.tasks import *  # noqa: F401,F403  pylint: disable=wildcard-import
from st5_jax.data.tasks import __all__  # noqa: F401
from st5_jax.objectives import import_all_tasks as _import_all_tasks

_import_all_tasks()
from st5_jax.objectives.seed_encoder.tasks import QA_TEXT as SEED_QA_TEXT  # noqa: E402,F401
from st5_jax.objectives.seed_encoder.tasks import TFDS_C4 as SEED_TFDS_C4  # noqa: E402,F401
from st5_jax.objectives.seed_encoder.tasks import USER_TEXT as SEED_USER_TEXT  # noqa: E402,F401
