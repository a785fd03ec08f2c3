"""The hand-written mutation check (tests/mutations.py) still applies to today's code.

Its run is slow and outside the default suite (tests/run.sh --mutations); this keeps it runnable: a code
change that moves a mutant's snippet fails here, in the change that moved it, not weeks later.
"""

import dataclasses

import mutations


def test_every_mutant_snippet_occurs_once_and_its_tests_exist():
  assert mutations.stale() == []


def test_the_check_reports_a_moved_snippet():
  moved = dataclasses.replace(mutations.MUTATIONS[0], old="this text occurs nowhere in the file")
  problems = mutations.stale([moved, mutations.MUTATIONS[1]])
  assert len(problems) == 1 and "occurs 0 times" in problems[0] and mutations.MUTATIONS[0].id in problems[0]
