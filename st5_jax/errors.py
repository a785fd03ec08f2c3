"""The input errors every layer raises: the ground floor of the package, which imports none of it.

Data readers (st5_jax.data.rows), the evaluation sets' readers (st5_jax.evaluation.readers)
and the objectives' tasks raise these, so that neither of data and evaluation imports the
other for them. `st5` prints both as one line (st5_jax.cli.is_user_error).
"""


class BadRowError(ValueError):
  """A bad row in strict mode; the message is `file:line: reason`."""


class InputFileError(FileNotFoundError):
  """An input file or pattern is missing or empty; the message names it."""
