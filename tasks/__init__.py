"""Sentence-T5 seqio tasks and mixtures: `import tasks` registers them.

The registrations live in st5_jax.data.tasks (importable from anywhere the package
is); this top-level package is where t5x users look for them and re-exports its names.
Register tasks of your own in a module of yours and import it from the gin file
(`import my_tasks`); see docs/data.md.
"""

from st5_jax.data.tasks import *  # noqa: F401,F403  pylint: disable=wildcard-import
from st5_jax.data.tasks import __all__  # noqa: F401
