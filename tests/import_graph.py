"""The import graph of the product packages, read from the source with `ast` (nothing is imported or run).

    imports = scan(ROOT, PACKAGES)                          # every import of every .py file, as `Import`s
    forbidden(imports, "link", {"evals", "web"})            # the imports by link/ of those packages
    find_cycle(package_graph(imports))                      # None, or one cycle of packages [a, b, ..., a]
    find_cycle(file_graph(imports, "evals"))                # the same between the modules of one package
    find_cycle(unit_graph(imports, "serving"))              # the same between its sub-packages and top modules
    private_imports(ROOT, PACKAGES)                         # `from a import _name` of a scanned module `a`

Every import counts, wherever it is written: at module level, inside a function or under `if TYPE_CHECKING`
(an import deferred to a call is still a dependency), `import a.b`, `from a import b`, relative imports
(resolved against the importing module) and calls of `importlib.import_module` / `__import__` with a literal
name. A script's import of a module beside it (`from routing_agreement import ...` in benchmarks/, whose folder
is on `sys.path` when it runs) resolves to that sibling. tests/test_layering.py states the rules.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable


@dataclass(frozen=True)
class Import:
    """One import statement's dependency: module `source` (its file and line) needs module `target`."""

    source: str
    target: str
    path: Path
    line: int

    @property
    def source_package(self) -> str:
        return self.source.split(".")[0]

    @property
    def target_package(self) -> str:
        return self.target.split(".")[0]

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.source} imports {self.target}"


def module_name(path: Path, root: Path) -> str:
    """"link/policies/router.py" -> "link.policies.router"; a package's __init__.py is the package itself."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _literal_import_call(node: ast.Call) -> str | None:
    """The module name of `importlib.import_module("x")` or `__import__("x", ...)`, when it is a literal."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if name not in ("import_module", "__import__") or not node.args:
        return None
    first = node.args[0]
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None


def _resolve_relative(source: str, is_package: bool, level: int, module: str | None) -> str:
    """`from ..x import y` in `source` -> the absolute name of `..x` (PEP 328)."""
    base = source.split(".") if is_package else source.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def file_imports(path: Path, root: Path, modules: set[str]) -> list[Import]:
    """The imports of one file. `modules` (every scanned module's name) decides whether `from a import b`
    needs the module `a.b` or the name `b` of module `a`."""
    source = module_name(path, root)
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    siblings = {p.stem for p in path.parent.glob("*.py")} - {"__init__"}
    prefix = source.rsplit(".", 1)[0] if "." in source and not is_package else source
    packages = {m.split(".")[0] for m in modules}

    def named(target: str) -> str:
        # a script's `import routing_agreement` is its folder's module, not a top-level package
        top = target.split(".")[0]
        if top in siblings and top not in packages and top not in sys.stdlib_module_names:
            return f"{prefix}.{target}"
        return target

    found: list[Import] = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [named(alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = (_resolve_relative(source, is_package, node.level, node.module) if node.level
                    else named(node.module or ""))
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                targets.append(candidate if candidate in modules else base)
        elif isinstance(node, ast.Call) and (literal := _literal_import_call(node)):
            targets = [named(literal)]
        found += [Import(source, target, path, node.lineno) for target in dict.fromkeys(targets)]
    return found


def scan(root: Path, packages: Iterable[str]) -> list[Import]:
    """Every import of every .py file under `root/<package>` for each of `packages`."""
    paths = sorted(p for package in packages for p in (root / package).rglob("*.py"))
    modules = {module_name(p, root) for p in paths}
    return [found for path in paths for found in file_imports(path, root, modules)]


def private_imports(root: Path, packages: Iterable[str]) -> list[Import]:
    """Every `from a import _name` (absolute or relative) under `root/<package>` where `a` is another scanned
    module and `_name` one of its private names (a leading underscore, not a dunder, not a submodule): code
    that reaches into another file's insides. The `Import`'s target is "a._name"."""
    paths = sorted(p for package in packages for p in (root / package).rglob("*.py"))
    modules = {module_name(p, root) for p in paths}
    found: list[Import] = []
    for path in paths:
        source = module_name(path, root)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = (_resolve_relative(source, path.name == "__init__.py", node.level, node.module) if node.level
                    else node.module or "")
            found += [Import(source, f"{base}.{alias.name}", path, node.lineno) for alias in node.names
                      if base in modules and base != source and alias.name.startswith("_")
                      and not alias.name.startswith("__") and f"{base}.{alias.name}" not in modules]
    return found


def forbidden(imports: Iterable[Import], source_package: str, targets: set[str]) -> list[Import]:
    """The imports by `source_package` of a module of `targets` (package names, or dotted prefixes such as
    "serving.api")."""
    def hits(target: str) -> bool:
        return any(target == t or target.startswith(t + ".") for t in targets)

    return [i for i in imports if i.source_package == source_package and hits(i.target)]


def package_graph(imports: Iterable[Import]) -> dict[str, set[str]]:
    """Package -> the other scanned packages it imports (third-party and standard-library imports dropped)."""
    imports = list(imports)
    packages = {i.source_package for i in imports}
    graph: dict[str, set[str]] = {p: set() for p in packages}
    for i in imports:
        if i.target_package in packages and i.target_package != i.source_package:
            graph[i.source_package].add(i.target_package)
    return graph


def file_graph(imports: Iterable[Import], package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports, for the modules of `package`."""
    own = [i for i in imports if i.source_package == package]
    modules = {i.source for i in own}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for i in own:
        if i.target in modules and i.target != i.source:
            graph[i.source].add(i.target)
    return graph


def unit(module: str) -> str:
    """A module's unit inside its package: "serving.engine.llm_engine" -> "serving.engine" (a sub-package),
    "serving.errors" -> itself (a top-level module), "serving" -> itself (the package's __init__)."""
    return ".".join(module.split(".")[:2])


def unit_graph(imports: Iterable[Import], package: str) -> dict[str, set[str]]:
    """Unit -> the other units of the same package it imports, for the units of `package` (see `unit`):
    the package's sub-packages and top-level modules, each taken whole."""
    own = [i for i in imports if i.source_package == package]
    graph: dict[str, set[str]] = {unit(i.source): set() for i in own}
    for i in own:
        if i.target_package == package and unit(i.target) in graph and unit(i.target) != unit(i.source):
            graph[unit(i.source)].add(unit(i.target))
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as [a, b, ..., a], or None when it has none (depth-first search, nodes sorted so
    the answer does not depend on set order)."""
    state: dict[str, str] = {}  # "open": on the current path, "done": fully explored
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = "done"
        path.pop()
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None
