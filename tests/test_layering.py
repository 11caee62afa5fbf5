"""The package's layering, read from the source: no import circle anywhere (imports inside functions count
too), no import from a folder up to a folder on a higher floor, and the library never imports the teaching
package (guide/) or the command line (cli/)."""

import ast
from pathlib import Path

import attnlab

ROOT = Path(attnlab.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the attnlab modules it imports (at the top or inside a function). ``from pkg import name``
    counts as importing ``pkg.name`` when that is a module, else ``pkg``. A module's own parent packages,
    which Python runs first, are not edges: they are where the module lives, not what it uses."""
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in node.names]
            else:
                continue
            edges |= {t for t in targets if t in modules and t != name and not name.startswith(t + ".")}
        graph[name] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle_anywhere_in_the_package():
    graph = import_graph()
    assert len(graph) > 40 and "attnlab.stack.transformer" in graph["attnlab.stack.hooks"]   # the graph was read at all
    assert circles(graph) == []


def test_the_circle_finder_finds_circles():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_library_never_imports_the_guide_or_the_cli():
    upper = ("attnlab.guide", "attnlab.cli")
    for name, edges in import_graph().items():
        if name == "attnlab.__main__" or name.startswith(upper):
            continue
        bad = sorted(e for e in edges if e.startswith(upper))
        assert not bad, f"{name} imports {bad}"


# The folders' floors, lowest first: a module may import its own folder and any folder on a lower floor.
FLOORS = (
    ("kernels", "_io"),                  # naive, tiled, decode, fused, softmax, masks, the checks; file writing
    ("text", "layer"),                   # tokenizers and n-gram floors; one attention layer
    ("stack",),                          # norms, MLPs, the one Transformer, hooks, sampling
    ("lm", "viz", "distributed"),        # attnlab's own LM and its training; pictures; Dask
    ("models",),                         # every family's loader
    ("interpret", "guide"),              # what trained heads do; the guide's teaching code
    ("cli",),                            # the command line
)


def folder(module: str) -> str:
    """attnlab.kernels.tiled -> kernels; attnlab._io -> _io; attnlab (the curated API) -> ''."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def upward_imports(graph: dict[str, set[str]], floors=FLOORS) -> list[str]:
    floor = {name: i for i, names in enumerate(floors) for name in names}
    bad = []
    for name, edges in sorted(graph.items()):
        if folder(name) in ("", "__main__"):
            continue
        assert folder(name) in floor, f"{name} sits in a folder with no floor: add it to FLOORS"
        bad += [f"{name} -> {e}" for e in sorted(edges)
                if folder(e) and floor[folder(e)] > floor[folder(name)]]
    return bad


def test_no_import_runs_up_the_folder_floors():
    assert upward_imports(import_graph()) == []


def test_the_floor_check_finds_an_upward_import():
    graph = {"attnlab.kernels.naive": {"attnlab.stack.hooks"}, "attnlab.stack.hooks": {"attnlab.kernels.naive"},
             "attnlab.models.gpt2": {"attnlab.layer.config"}}
    assert upward_imports(graph) == ["attnlab.kernels.naive -> attnlab.stack.hooks"]


def test_no_module_sits_flat_beside_the_folders():
    flat = sorted(p.name for p in ROOT.glob("*.py") if p.name not in ("__init__.py", "__main__.py", "_io.py"))
    assert flat == []
