"""The documentation stays short where it must, true to the tree, and free of tracker numbers.

README.md is the front page: at most 150 lines, the two first commands (`make serve`, `make test`) at its top.
ARCHITECTURE.md is a map: every table cell one short line (the detail lives in module docstrings and docs/).
Every repository path written in backticks in ARCHITECTURE.md and docs/*.md exists, and every relative link
in README.md, ARCHITECTURE.md and docs/*.md resolves (to a file, and to a heading when it names one). No
tracker issue numbers ("issue 10", "#34") in product code or in the documents.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
ARCHITECTURE = ROOT / "ARCHITECTURE.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PRODUCT_PACKAGES = ("cli", "web", "evals", "posttrain", "benchmarks", "link", "routers", "serving", "kernels",
                    "protocol")
# Source files of the product scanned for tracker numbers (style sheets, SVGs and scripts are left out: their
# colours are written `#374151`).
PRODUCT_SUFFIXES = {".py", ".yaml", ".yml", ".toml", ".cpp", ".h", ".sh", ".cfg", ".html"}
MAX_README_LINES = 150
README_COMMANDS_WITHIN = 15
MAX_CELL_CHARS = 300

# "issue 10", "issues 4 and 8", "Issue #34", and a bare "#34" (not "gpt#0", an anchor "/#3" or "&#39;").
TRACKER = re.compile(r"\bissues?\s+#?\d+|(?<![\w&/#])#\d+\b", re.IGNORECASE)
# An upstream project's pull request or issue cited as the reason for a choice ("vLLM PR #15297") is not ours.
UPSTREAM = re.compile(r"(vLLM|PyTorch|Triton|llama\.cpp|transformers|SGLang|LiteLLM|RouteLLM|peft|github\.com/\S*)"
                      r"\s+(PR|pull request|issue)\s*$", re.IGNORECASE)
BACKTICKED = re.compile(r"`([^`\n]+)`")
# A relative path: segments of word characters, dots and dashes, separated by slashes; `:name` after a file
# (`link/routes/openai.py:handle`) names something inside it and is dropped.
PATH_LIKE = re.compile(r"^[\w.-]+(/[\w.*-]+)*/?$")
MARKDOWN_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def documents() -> list[Path]:
    return [README, ARCHITECTURE, *DOCS]


def top_level_entries() -> set[str]:
    return {p.name for p in ROOT.iterdir() if not p.name.startswith(".")} | {".ci"}


def repo_paths_in(text: str) -> list[str]:
    """The backticked strings of `text` that name a repository path: a first segment that is a top-level entry
    of the repository and either a trailing slash or a file suffix on the last segment (so a policy name such as
    `link/auto` is not read as a path)."""
    top = top_level_entries()
    paths = []
    for token in BACKTICKED.findall(text):
        token = token.split(":", 1)[0] if re.search(r"\.\w+:", token) else token
        if "/" not in token or not PATH_LIKE.match(token):
            continue
        first, last = token.split("/", 1)[0], token.rstrip("/").rsplit("/", 1)[-1]
        if first not in top:
            continue
        if token.endswith("/") or re.search(r"\.\w+$", last):
            paths.append(token)
    return paths


def path_exists(token: str) -> bool:
    if "*" in token:
        return any(ROOT.glob(token))
    return (ROOT / token).exists()


def heading_anchors(path: Path) -> set[str]:
    """GitHub's anchors for a Markdown file's headings: lower case, punctuation dropped, spaces as dashes."""
    anchors = set()
    in_code = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip().lower()
        anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def tracker_hits(path: Path) -> list[str]:
    hits = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        for match in TRACKER.finditer(line):
            if UPSTREAM.search(line[: match.start()]):
                continue
            hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return hits


def product_files() -> list[Path]:
    files = [ROOT / "Makefile", ROOT / "pyproject.toml", *(ROOT / ".ci").glob("*")]
    for package in PRODUCT_PACKAGES:
        for path in (ROOT / package).rglob("*"):
            if path.is_file() and path.suffix in PRODUCT_SUFFIXES and "vendor" not in path.parts:
                files.append(path)
    return [p for p in files if p.is_file()]


def test_readme_is_short_and_opens_with_the_two_commands():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines, at most {MAX_README_LINES}"
    top = "\n".join(lines[:README_COMMANDS_WITHIN])
    assert "make serve" in top and "make test" in top, (
        f"README.md must give `make serve` and `make test` within its first {README_COMMANDS_WITHIN} lines")
    assert top.index("make serve") < top.index("make test")


def test_makefile_has_the_readme_commands():
    targets = re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert "serve" in targets and "test" in targets


def test_architecture_table_cells_are_short():
    long_cells = []
    for number, line in enumerate(ARCHITECTURE.read_text().splitlines(), 1):
        if not line.startswith("|"):
            continue
        for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]:
            if len(cell.strip()) > MAX_CELL_CHARS:
                long_cells.append(f"line {number}: {len(cell.strip())} chars: {cell.strip()[:60]}...")
    assert not long_cells, "ARCHITECTURE.md cells over %d characters:\n%s" % (MAX_CELL_CHARS, "\n".join(long_cells))


def test_architecture_answers_where_is():
    text = ARCHITECTURE.read_text()
    section = text[text.index("## Where is"):]
    for thing in ("routing rule", "sampling parameter", "kernel variant", "OpenAI field check", "console page"):
        assert thing in section, f"ARCHITECTURE.md's 'Where is ...' does not say where a {thing} is"


def test_backticked_paths_exist():
    missing = []
    for doc in [ARCHITECTURE, *DOCS]:
        for token in repo_paths_in(doc.read_text()):
            if not path_exists(token):
                missing.append(f"{doc.relative_to(ROOT)}: {token}")
    assert not missing, "paths named in the docs that do not exist:\n" + "\n".join(sorted(set(missing)))


def test_relative_links_resolve():
    broken = []
    for doc in documents():
        for target in MARKDOWN_LINK.findall(doc.read_text()):
            if re.match(r"^[a-z]+:", target):
                continue  # http:, https:, mailto:
            file_part, _, anchor = target.partition("#")
            linked = (doc.parent / file_part).resolve() if file_part else doc
            if not linked.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in heading_anchors(linked):
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_no_tracker_numbers_in_docs():
    hits = [hit for doc in documents() for hit in tracker_hits(doc)]
    assert not hits, "tracker numbers in the docs (say what the thing is instead):\n" + "\n".join(hits)


def test_no_tracker_numbers_in_product_code():
    hits = [hit for path in product_files() for hit in tracker_hits(path)]
    assert not hits, "tracker numbers in product code (say what the thing is instead):\n" + "\n".join(hits)


def test_checks_catch_what_they_are_for():
    """The detectors themselves, on hand-written cases (a check that matches nothing would pass vacuously)."""
    assert [m.group(0) for m in TRACKER.finditer("as in issue 10 and issues 4 and 8, see #34")] == [
        "issue 10", "issues 4", "#34"]
    assert not TRACKER.search('{"deployment_id": "gpt#0"}, colour &#39; and /#3')
    assert UPSTREAM.search("vLLM PR ")
    assert repo_paths_in("`serving/engine/scheduler.py`, `link/auto`, `$LINK_HOME/x.db`, `link/routes/openai.py:handle`,"
                         " `routers/offline/`, `runs/bfcl`") == [
        "serving/engine/scheduler.py", "link/routes/openai.py", "routers/offline/"]
    assert {"a-chat-requests-life", "where-is-"} <= heading_anchors(ARCHITECTURE)
