"""The package's import graph has no loops, and the layers below the objectives import none.

Static: every st5_jax/**/*.py is parsed with `ast` (nothing is imported), and every
`import st5_jax...` / `from st5_jax... import ...` / relative import is collected, at any
level of the file (module top, function bodies, `if TYPE_CHECKING:` blocks alike: a
function-level import that only dodges a loop is still a loop). `from P import X` is an
edge to the module P.X when that module exists, else to P (the package's __init__.py).
A package __init__ that imports lazily by name (`importlib.import_module` over a table of
module names, as st5_jax/data/__init__.py does) gets an edge to each module named there.
Implicit imports of parent packages (importing st5_jax.data.rows runs
st5_jax/data/__init__.py first) are not edges: every module would otherwise loop
through its package.

A loop is a strongly connected component of more than one module, or a module that
imports itself.
"""

from __future__ import annotations

import ast
import pathlib

PACKAGE = "st5_jax"
ROOT = pathlib.Path(__file__).resolve().parent.parent / PACKAGE

# Layers that sit below the training objectives (st5_jax/objectives/): they may be used by
# an objective, never the other way round.
BELOW_OBJECTIVES = ("st5_jax.data", "st5_jax.checkpoints", "st5_jax.model")
OBJECTIVES = "st5_jax.objectives"
# (importer, imported): the first must not import the second, directly or through a chain.
# Checkpoint readers (the SavedModel one included) sit below the exporter; the mesh side
# (partitioning) does not depend on the input pipeline.
LAYERS = (
    ("st5_jax.checkpoints", "st5_jax.export"),
    ("st5_jax.partitioning", "st5_jax.data"),
    ("st5_jax.paths", "st5_jax.data"),
    # The mesh side knows nothing of optimizers: optimizer-state shardings live in optim.state_shardings.
    ("st5_jax.partitioning", "st5_jax.optim"),
)


def _module_name(path: pathlib.Path) -> str:
  parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
  if parts[-1] == "__init__":
    parts.pop()
  return ".".join(parts)


def _modules() -> dict[str, pathlib.Path]:
  return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _imported_names(name: str, path: pathlib.Path) -> list[tuple[str, tuple[str, ...], int]]:
  """(module, imported attribute names, line) for every import of this package in the file."""
  tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
  is_package = path.name == "__init__.py"
  out = []
  uses_import_module = False
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        out.append((alias.name, (), node.lineno))
    elif isinstance(node, ast.ImportFrom):
      if node.level:
        base = name.split(".") if is_package else name.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        module = ".".join(base + ([node.module] if node.module else []))
      else:
        module = node.module or ""
      out.append((module, tuple(a.name for a in node.names), node.lineno))
    elif (isinstance(node, ast.Attribute) and node.attr == "import_module") or (
        isinstance(node, ast.Name) and node.id == "import_module"):
      uses_import_module = True
  if uses_import_module:
    # Lazy imports by name: string constants that name a module of the package.
    for node in ast.walk(tree):
      if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(PACKAGE + "."):
        out.append((node.value, (), node.lineno))
  return [(m, names, line) for m, names, line in out if m == PACKAGE or m.startswith(PACKAGE + ".")]


def import_graph() -> tuple[dict[str, set[str]], dict[str, list[tuple[str, int]]]]:
  """(edges between existing modules, every raw import target per module with its line)."""
  modules = _modules()
  edges: dict[str, set[str]] = {m: set() for m in modules}
  raw: dict[str, list[tuple[str, int]]] = {m: [] for m in modules}
  for name, path in modules.items():
    for module, names, line in _imported_names(name, path):
      raw[name].append((module, line))
      targets = []
      for attr in names:
        raw[name].append((f"{module}.{attr}", line))
        if f"{module}.{attr}" in modules:
          targets.append(f"{module}.{attr}")
        elif module in modules:
          targets.append(module)
      if not names and module in modules:
        targets.append(module)
      for target in targets:
        edges[name].add(target)
  return edges, raw


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
  """Tarjan's algorithm, iterative; components in no particular order."""
  index: dict[str, int] = {}
  low: dict[str, int] = {}
  on_stack: set[str] = set()
  stack: list[str] = []
  components = []
  counter = 0
  for start in sorted(edges):
    if start in index:
      continue
    work = [(start, iter(sorted(edges[start])))]
    index[start] = low[start] = counter
    counter += 1
    stack.append(start)
    on_stack.add(start)
    while work:
      node, children = work[-1]
      for child in children:
        if child not in index:
          index[child] = low[child] = counter
          counter += 1
          stack.append(child)
          on_stack.add(child)
          work.append((child, iter(sorted(edges[child]))))
          break
        if child in on_stack:
          low[node] = min(low[node], index[child])
      else:
        work.pop()
        if work:
          low[work[-1][0]] = min(low[work[-1][0]], low[node])
        if low[node] == index[node]:
          component = []
          while True:
            member = stack.pop()
            on_stack.discard(member)
            component.append(member)
            if member == node:
              break
          components.append(sorted(component))
  return components


def _describe(component: list[str], edges: dict[str, set[str]]) -> str:
  members = set(component)
  lines = [f"  {m} -> {', '.join(sorted(edges[m] & members))}" for m in component]
  return "loop of " + ", ".join(component) + ":\n" + "\n".join(lines)


def test_graph_sees_known_imports():
  # The scanner itself: a top-level, a function-level, a relative-free `from P import module`
  # and a lazy table import are all edges.
  edges, _ = import_graph()
  assert "st5_jax.paths" in edges["st5_jax"]                       # from st5_jax import paths
  assert "st5_jax.encoder" in edges["st5_jax"]                     # inside __getattr__
  assert "st5_jax.data.iterator" in edges["st5_jax.data"]          # _EXPORTS table
  assert "st5_jax.data.rows" in edges["st5_jax.data.iterator"]     # from st5_jax.data.rows import RowStats


def test_no_import_loops():
  edges, _ = import_graph()
  loops = [c for c in strongly_connected(edges) if len(c) > 1 or c[0] in edges[c[0]]]
  assert not loops, "import loops in st5_jax:\n" + "\n".join(_describe(c, edges) for c in loops)


def test_lower_layers_import_no_objective():
  _, raw = import_graph()
  bad = []
  for module, targets in raw.items():
    if any(module == layer or module.startswith(layer + ".") for layer in BELOW_OBJECTIVES):
      bad += [f"{module}:{line} imports {target}" for target, line in targets
              if target == OBJECTIVES or target.startswith(OBJECTIVES + ".")]
  assert not bad, "\n".join(bad)


def _within(module: str, prefix: str) -> bool:
  return module == prefix or module.startswith(prefix + ".")


def _reachable(edges: dict[str, set[str]], start: str) -> dict[str, str]:
  """{module reachable from start: the module it was reached from}."""
  seen, todo = {start: ""}, [start]
  while todo:
    node = todo.pop()
    for child in sorted(edges[node]):
      if child not in seen:
        seen[child] = node
        todo.append(child)
  return seen


def test_layers():
  edges, _ = import_graph()
  bad = []
  for importer, imported in LAYERS:
    for start in (m for m in edges if _within(m, importer)):
      via = _reachable(edges, start)
      for target in sorted(m for m in via if _within(m, imported)):
        chain, node = [], target
        while node:
          chain.append(node)
          node = via[node]
        bad.append(" -> ".join(reversed(chain)))
  assert not bad, "layering broken:\n" + "\n".join(bad)


def test_runtime_pipeline_does_not_import_offline_preparation():
  # st5_jax/data/offline/ (catalogue, download, `st5 data prepare`, TFDS builders, the overlap
  # report) may use the runtime pipeline, never the other way round; training neither.
  edges, _ = import_graph()
  offline = "st5_jax.data.offline"
  starts = [m for m in edges if (_within(m, "st5_jax.data") and not _within(m, offline)) or m == "st5_jax.train"]
  bad = sorted(f"{start} reaches {m}" for start in starts for m in _reachable(edges, start) if _within(m, offline))
  assert not bad, "\n".join(bad)


def test_only_the_cli_imports_command_modules():
  # st5_jax/commands/ is the top floor (flags, one-line errors): the library (a sweep, the gin layer)
  # never reaches up into it; only the commands themselves and cli.py import it.
  _, raw = import_graph()
  commands = "st5_jax.commands"
  bad = sorted(f"{module}:{line} imports {target}" for module, targets in raw.items()
               if not _within(module, commands) and module != "st5_jax.cli"
               for target, line in targets if _within(target, commands))
  assert not bad, "\n".join(bad)


# The evaluation sets' readers and texts: the one part of st5_jax/evaluation that the data pipeline
# (decontamination) and the objectives' tasks import. Light: no scikit-learn, TensorFlow or JAX.
EVALUATION_LIGHT = ("st5_jax.evaluation.sets", "st5_jax.evaluation.readers", "st5_jax.evaluation.retrieval_readers")
ERRORS = "st5_jax.errors"  # BadRowError, InputFileError: the ground floor


def _chain(via: dict[str, str], target: str) -> str:
  chain = []
  while target:
    chain.append(target)
    target = via[target]
  return " -> ".join(reversed(chain))


def test_data_and_evaluation_depend_one_way():
  # st5_jax/data reaches no module of st5_jax/evaluation but EVALUATION_LIGHT (not the harness, not
  # scikit-learn); no module of st5_jax/evaluation, the light ones included, reaches st5_jax/data.
  edges, _ = import_graph()
  bad = []
  for start in sorted(m for m in edges if _within(m, "st5_jax.data")):
    via = _reachable(edges, start)
    bad += [_chain(via, m) for m in sorted(via) if _within(m, "st5_jax.evaluation") and m not in EVALUATION_LIGHT]
  for start in sorted(m for m in edges if _within(m, "st5_jax.evaluation")):
    via = _reachable(edges, start)
    bad += [_chain(via, m) for m in sorted(via) if _within(m, "st5_jax.data")]
  assert not bad, "data and evaluation depend on each other:\n" + "\n".join(bad)


def test_errors_module_imports_nothing_of_the_package():
  _, raw = import_graph()
  assert not raw[ERRORS], f"{ERRORS} imports " + ", ".join(f"{t} (line {line})" for t, line in raw[ERRORS])


def test_light_evaluation_modules_load_no_heavy_library():
  # At run time too, in a fresh interpreter: importing st5_jax.evaluation.sets runs
  # st5_jax/evaluation/__init__.py, which must stay lazy (no harness, no scikit-learn).
  import json  # pylint: disable=g-import-not-at-top  (this test only)
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  heavy = ("sklearn", "tensorflow", "jax", "st5_jax.evaluation.harness", "st5_jax.data")
  code = (f"import json, sys\nimport {ERRORS}, {', '.join(EVALUATION_LIGHT)}\nheavy = {heavy!r}\n"
          "print(json.dumps(sorted(m for m in sys.modules if any(m == h or m.startswith(h + '.') for h in heavy))))")
  out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120,
                       cwd=ROOT.parent)
  assert out.returncode == 0, out.stderr[-3000:]
  assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def _loaded_after(code: str) -> list[str]:
  """Modules of st5_jax.data.offline that `code` leaves loaded, in a fresh interpreter."""
  import json  # pylint: disable=g-import-not-at-top  (this test only)
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  watched = ("st5_jax.data.offline",)
  code = (f"import json, sys\n{code}\nwatched = {watched!r}\n"
          "print(json.dumps(sorted(m for m in sys.modules if any(m == w or m.startswith(w + '.') for w in watched))))")
  out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=300,
                       cwd=ROOT.parent)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_training_and_its_gin_layer_load_no_offline_module():
  # At run time: `st5 train` imports the gin layer and the trainer and builds the run from a gin file; none of it
  # loads st5_jax/data/offline (mining) unless a refresh (ANCE) runs, which needs it.
  plain = ("import st5_jax.gin_config as g, st5_jax.train\n"
           "g.parse_gin(['st5_tiny_cpu.gin'], [])\nassert g.run_spec().negatives_refresh is None")
  assert _loaded_after(plain) == []
  ance = ("import st5_jax.gin_config as g, st5_jax.train\n"
          "g.parse_gin(['ance_tiny_cpu.gin'], ['NegativesRefresh.seed = 4'])\n"
          "r = g.run_spec().negatives_refresh\n"
          "assert (type(r).__name__, r.every, r.seed) == ('NegativesRefresh', 100, 4)\n"
          "r.mine_config()")  # what a refresh does first: the watcher sees the import
  assert _loaded_after(ance) == ["st5_jax.data.offline", "st5_jax.data.offline.mine"]

