"""One name per idea: no two files of the product define a top-level class of the same name (a reader who meets
`RequestRecord` must not have to ask which one). Read from the source with `ast`, nothing is imported.

    .venv/bin/python -m pytest -q tests/test_names.py
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cli", "web", "evals", "posttrain", "benchmarks", "link", "routers", "serving", "kernels", "protocol")
# name -> why two files may share it (a deliberate pair, e.g. the two sides of one protocol). Keep it tiny.
ALLOWED_SHARED_NAMES: dict[str, str] = {}


def top_level_classes(source: str) -> list[str]:
    """The names of the classes a module defines at its top level, also under a module-level `if` or `try`."""
    names, pending = [], list(ast.parse(source).body)
    while pending:
        node = pending.pop(0)
        if isinstance(node, ast.ClassDef):
            names.append(node.name)
        elif isinstance(node, (ast.If, ast.Try)):
            pending += node.body + node.orelse + getattr(node, "finalbody", []) + [
                statement for handler in getattr(node, "handlers", []) for statement in handler.body]
    return names


def shared_class_names(root: Path, packages: tuple[str, ...]) -> dict[str, list[str]]:
    """Class name -> the files (relative paths, sorted) of every name defined at top level in two files or more."""
    files = defaultdict(set)
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            for name in top_level_classes(path.read_text(encoding="utf-8")):
                files[name].add(str(path.relative_to(root)))
    return {name: sorted(paths) for name, paths in sorted(files.items()) if len(paths) > 1}


def test_no_two_product_files_define_a_class_of_the_same_name():
    shared = {n: paths for n, paths in shared_class_names(ROOT, PACKAGES).items() if n not in ALLOWED_SHARED_NAMES}
    listing = "\n".join(f"{name}: {', '.join(paths)}" for name, paths in shared.items())
    assert not shared, f"rename each to what it is (or allow a deliberate pair with its reason):\n{listing}"


def test_every_allowed_name_is_still_shared():
    stale = set(ALLOWED_SHARED_NAMES) - set(shared_class_names(ROOT, PACKAGES))
    assert not stale, f"no longer defined twice; drop from ALLOWED_SHARED_NAMES: {sorted(stale)}"


def test_the_scan_finds_a_shared_name_and_only_top_level_ones(tmp_path):
    (tmp_path / "a" / "sub").mkdir(parents=True)
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "one.py").write_text("class Record:\n    class Inner: pass\nif True:\n    class Guarded: pass\n")
    (tmp_path / "a" / "sub" / "two.py").write_text("try:\n    import x\nexcept ImportError:\n    class Guarded: pass\n")
    (tmp_path / "b" / "three.py").write_text("class Record: pass\ndef f():\n    class Inner: pass\n")
    assert shared_class_names(tmp_path, ("a", "b")) == {"Guarded": ["a/one.py", "a/sub/two.py"],
                                                        "Record": ["a/one.py", "b/three.py"]}
