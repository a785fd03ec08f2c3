"""Sentence-T5 seqio tasks and mixtures, for checkouts: `import tasks` registers them.

The repository layout t5x users expect; it re-exports st5_jax.tasks, which is what an
installed st5_jax provides (the wheel installs no top-level `tasks` module).
"""

from st5_jax.tasks import *  # noqa: F401,F403  pylint: disable=wildcard-import
from st5_jax.tasks import __all__  # noqa: F401
