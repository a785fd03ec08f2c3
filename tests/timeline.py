"""Summarise a test timeline (ST5_TEST_TIMELINE=FILE tests/run.sh, see tests/conftest.py).

  python tests/timeline.py FILE [--last N]

Prints, per xdist worker, its busy time, its idle time between tests and after its last test
(until the last worker finished), and the tests each worker ran last: where a run's wall time
goes beyond the sum of its tests' durations.
"""

import argparse
import collections
import json


def summarise(rows, last=8):
  t0 = min(r["start"] for r in rows)
  t_end = max(r["end"] for r in rows)
  by_worker = collections.defaultdict(list)
  for r in rows:
    by_worker[r["worker"]].append(r)
  lines = [f"span {t_end - t0:.0f} s from the first test's start to the last one's end; "
           f"{len(rows)} tests, {sum(r['end'] - r['start'] for r in rows):.0f} s of tests"]
  for worker, rs in sorted(by_worker.items()):
    rs.sort(key=lambda r: r["start"])
    busy = sum(r["end"] - r["start"] for r in rs)
    gaps = sum(max(0.0, b["start"] - a["end"]) for a, b in zip(rs, rs[1:]))
    lines.append(f"{worker}: {len(rs)} tests, busy {busy:.0f} s, between tests {gaps:.0f} s, "
                 f"first at +{rs[0]['start'] - t0:.0f} s, done at +{rs[-1]['end'] - t0:.0f} s "
                 f"(idle {t_end - rs[-1]['end']:.0f} s at the end)")
    for r in rs[len(rs) - last:] if last > 0 else []:  # rs[-0:] would be every test
      lines.append(f"    +{r['start'] - t0:6.0f} s {r['end'] - r['start']:6.1f} s  {r['test']}")
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("file")
  parser.add_argument("--last", type=int, default=8, help="tests listed at the end of each worker")
  args = parser.parse_args()
  with open(args.file, encoding="utf-8") as f:
    rows = [json.loads(line) for line in f if line.strip()]
  print(summarise(rows, args.last))


if __name__ == "__main__":
  main()
