"""No product file past 400 lines: one idea per file, split by idea when a second one grows in (STYLE.md).
Tests are exempt; a test module that grows past it is a sign to split it too, but not a failure.

    .venv/bin/python -m pytest -q tests/test_file_size.py
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cli", "web", "evals", "posttrain", "benchmarks", "link", "routers", "serving", "kernels", "protocol")
MAX_LINES = 400


def num_lines(path: Path) -> int:
    """Lines of a text file as an editor numbers them (a last line without a newline counts)."""
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_product_file_is_over_the_limit():
    too_long = sorted((num_lines(p), str(p.relative_to(ROOT))) for package in PACKAGES
                      for p in (ROOT / package).rglob("*.py") if num_lines(p) > MAX_LINES)
    assert not too_long, f"over {MAX_LINES} lines; split by idea:\n" + "\n".join(f"{n} {p}" for n, p in too_long)


def test_line_count(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n\ny = 2")
    (tmp_path / "b.py").write_text("")
    assert (num_lines(tmp_path / "a.py"), num_lines(tmp_path / "b.py")) == (3, 0)
