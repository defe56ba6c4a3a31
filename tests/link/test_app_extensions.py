"""The gateway's extensions: web/ mounts the console through an entry point, and no package imports web."""

from __future__ import annotations

import ast
from pathlib import Path

from link.app import APP_EXTENSIONS, create_app, mount_extensions

ROOT = Path(__file__).resolve().parents[2]


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_no_package_imports_web():
    offenders = [f"{path.relative_to(ROOT)}: {name}"
                 for package in ("link", "routers", "serving", "kernels", "evals", "posttrain")
                 for path in sorted((ROOT / package).rglob("*.py"))
                 for name in _imported_modules(path) if name == "web" or name.startswith("web.")]
    assert offenders == []


def test_the_console_is_mounted_through_its_entry_point(tmp_path, monkeypatch):
    monkeypatch.setenv("LINK_HOME", str(tmp_path))
    app = create_app()
    paths = {getattr(route, "path", None) for route in app.routes}
    assert "/console" in paths and "/console/static" in paths
    assert APP_EXTENSIONS == "togetherlink.apps"


def test_mount_extensions_calls_each_registered_mount(monkeypatch):
    import link.app

    calls = []

    class EntryPoint:
        def __init__(self, name):
            self.name = name

        def load(self):
            return lambda app, settings: calls.append((self.name, app, settings))

    monkeypatch.setattr(link.app, "entry_points", lambda group: [EntryPoint("b"), EntryPoint("a")]
                        if group == APP_EXTENSIONS else [])
    assert mount_extensions("APP", "SETTINGS") == ["a", "b"]
    assert calls == [("a", "APP", "SETTINGS"), ("b", "APP", "SETTINGS")]
