"""No import circle in ``python/mqbench``.

The check reads the sources with ``ast`` (nothing is imported) and builds the graph of imports
between mqbench's own modules. Its rules:

* An edge ``a -> b`` is an ``import b`` / ``from b import name`` in module ``a``, relative
  imports resolved. ``from p import n`` is an edge to ``p.n`` when ``p/n.py`` (or ``p/n/``)
  exists, else to ``p``. Importing ``p.n`` also runs ``p/__init__.py``; that implicit edge to
  the parent package is not counted (every submodule would otherwise close a circle with a
  package ``__init__`` that imports it, which is how packages are meant to work).
* A module importing itself is skipped: ``from mqbench import _C`` in ``mqbench/__init__.py``
  names the compiled extension, which has no source here.
* Imports under ``if TYPE_CHECKING:`` are not executed and are not counted.
* An import is *module-level* when it runs as the module is imported (at the top, or inside a
  top-level ``try`` / ``if`` / class body) and *lazy* when it sits in a function body.

Both kinds count. A circle of module-level imports fails at import time for whichever module
is imported first; a circle closed by a lazy import imports fine, but it still makes its modules
one unit that cannot be read, moved or tested apart, and the lazy import exists only to hide the
circle. So a lazy import is fine for a heavy or optional dependency (onnxscript, scipy) or for a
module that only the caller's first use needs, and never to close a circle:
``test_no_import_circle`` fails on any circle and says which of its imports are lazy.
"""
import ast
import os
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_DIR = os.path.normpath(os.path.join(HERE, "..", "..", "..", "python", "mqbench"))


def _module_name(root, path):
    rel = os.path.relpath(path, os.path.dirname(root))[:-len(".py")].split(os.sep)
    if rel[-1] == "__init__":
        rel = rel[:-1]
    return ".".join(rel)


def _is_type_checking(node):
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_graph(root):
    """{module: [(imported module, lazy, line)]} over the package at ``root``, and {module: path}."""
    paths = {}
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                paths[_module_name(root, path)] = path
    top = os.path.basename(root)

    def known(name):
        # `import a.b.c` where c is not a module of ours (an attribute, the extension): its
        # longest prefix that is.
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in paths.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
        package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
        edges = []

        def visit(node, lazy):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and _is_type_checking(child):
                    for stmt in child.orelse:
                        visit(stmt, lazy)
                    continue
                child_lazy = lazy or isinstance(
                    child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                targets = []
                if isinstance(child, ast.Import):
                    targets = [a.name for a in child.names]
                elif isinstance(child, ast.ImportFrom):
                    if child.level:
                        parts = package.split(".")
                        parts = parts[:len(parts) - (child.level - 1)]
                        source = ".".join(parts + ([child.module] if child.module else []))
                    else:
                        source = child.module or ""
                    targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in paths else source
                               for a in child.names]
                for target in targets:
                    if target == top or target.startswith(top + "."):
                        target = known(target)
                        if target is not None and target != module:
                            edges.append((target, lazy, child.lineno))
                visit(child, child_lazy)

        visit(tree, False)
        graph[module] = edges
    return graph, paths


def _components(adjacency):
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for start in sorted(adjacency):
        if start in index:
            continue
        work = [(start, iter(sorted(adjacency[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = counter
                    counter += 1
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(adjacency[succ]))))
                    advanced = True
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            if advanced:
                continue
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
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _one_cycle(adjacency, component):
    """A shortest circle through the first module of ``component``, as a list of modules."""
    start, members = component[0], set(component)
    parents, frontier = {start: None}, [start]
    while frontier:
        following = []
        for node in frontier:
            for succ in sorted(adjacency[node]):
                if succ == start:
                    path = [node]
                    while parents[path[-1]] is not None:
                        path.append(parents[path[-1]])
                    return list(reversed(path)) + [start]
                if succ in members and succ not in parents:
                    parents[succ] = node
                    following.append(succ)
        frontier = following
    raise AssertionError(f"no circle through {start} in {component}")


def import_circles(root, include_lazy):
    """Circles of the package at ``root``, each described on one line per import."""
    graph, paths = import_graph(root)
    adjacency = {m: {t for t, lazy, _ in edges if include_lazy or not lazy}
                 for m, edges in graph.items()}
    circles = []
    for component in _components(adjacency):
        cycle = _one_cycle(adjacency, component)
        steps = []
        for a, b in zip(cycle, cycle[1:]):
            lazy, line = min((lazy, line) for t, lazy, line in graph[a]
                             if t == b and (include_lazy or not lazy))
            rel = os.path.relpath(paths[a], os.path.dirname(os.path.dirname(root)))
            steps.append(f"  {a} -> {b}  ({rel}:{line}{', lazy, in a function' if lazy else ''})")
        circles.append(f"{' -> '.join(cycle)} ({len(component)} modules in the circle's "
                       f"component: {', '.join(component)})\n" + "\n".join(steps))
    return circles


def test_no_import_circle_at_module_level():
    circles = import_circles(PACKAGE_DIR, include_lazy=False)
    assert not circles, ("import circles of module-level imports in python/mqbench (the first "
                         "module imported fails):\n" + "\n".join(circles))


def test_no_import_circle():
    circles = import_circles(PACKAGE_DIR, include_lazy=True)
    assert not circles, (
        "import circles in python/mqbench, counting imports inside functions (move what both "
        "sides need to a leaf module; see this file's docstring):\n" + "\n".join(circles))


def test_the_graph_sees_the_package():
    graph, paths = import_graph(PACKAGE_DIR)
    assert len(paths) > 80
    # One edge of each kind, known to exist: a module-level absolute import, a relative one and
    # a lazy one (export_onnx imports the dynamo translations only when asked for).
    assert ("mqbench.onnx", False) in {
        (t, lazy) for t, lazy, _ in graph["mqbench"]}
    assert any(not lazy for t, lazy, _ in graph["mqbench.deploy.common"]
               if t == "mqbench.deploy._io")
    assert any(lazy for t, lazy, _ in graph["mqbench.onnx.symbolic"]
               if t == "mqbench.onnx.dynamo")


def _write(root, files):
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(textwrap.dedent(text))


def test_the_check_finds_circles(tmp_path):
    root = str(tmp_path / "mqbench")
    _write(root, {
        "__init__.py": "from mqbench import _C\nfrom mqbench import a\n",
        "a.py": "from .b import f\n",
        "b.py": "import mqbench.c as c\n",
        "c.py": "def g():\n    from mqbench.a import h\n",
        "d.py": "from mqbench import e\n",
        "e.py": "try:\n    from mqbench.d import x\nexcept ImportError:\n    pass\n",
        "t.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from mqbench.u import y\n",
        "u.py": "import mqbench.t\n",
        "sub/__init__.py": "from . import leaf\n",
        "sub/leaf.py": "import mqbench.sub.other\n",
        "sub/other.py": "",
    })
    module_level = import_circles(root, include_lazy=False)
    assert len(module_level) == 1 and module_level[0].startswith("mqbench.d -> mqbench.e -> mqbench.d")
    assert "mqbench/e.py:2)" in module_level[0]
    with_lazy = import_circles(root, include_lazy=True)
    # Not circles: t <-> u (TYPE_CHECKING), sub -> sub.leaf -> sub.other (parent package),
    # mqbench -> mqbench._C (no source).
    assert len(with_lazy) == 2
    lazy_one = [c for c in with_lazy if c.startswith("mqbench.a ->")][0]
    assert lazy_one.startswith("mqbench.a -> mqbench.b -> mqbench.c -> mqbench.a")
    assert "mqbench/c.py:2, lazy, in a function)" in lazy_one


def test_the_moved_names_stay_where_users_import_them():
    """The names the circles' fixes moved to leaf modules are the same objects at their old
    public paths, and the export format is one state for both exporters."""
    from mqbench import custom_symbolic_opset as cso
    from mqbench.onnx import common as _onnx_format
    from mqbench.deploy import common
    from mqbench.deploy._io import read_onnx

    for name in ("DOMAIN", "CUSTOM_OPSETS", "FORMATS", "MIN_OPSET", "DEFAULT_OPSET",
                 "DYNAMO_OPSET", "export_format", "get_export_format", "set_export_format"):
        assert getattr(cso, name) is getattr(_onnx_format, name), name
    assert set(cso.SYMBOLICS) == set(_onnx_format.EXPORTED_OPS)
    with cso.export_format("qdq"):
        assert _onnx_format.get_export_format() == "qdq"
    assert cso.get_export_format() == "mqbench"
    assert "parse_qparams" in common.__all__ and callable(common.parse_qparams)
    assert common.read_onnx is read_onnx
