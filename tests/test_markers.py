"""The `slow` marker is on every test that loads a real model (SmolLM2, Gemma 3, a model package's GGUF or its
assembled copy) or the all-MiniLM-L6-v2 embedding encoder, so `pytest -m "not slow"` runs in minutes, while
`make test` (no `-m`) still runs every test. Read from the source with `ast`, nothing is imported or run.

A test loads a real model when it requests a fixture that does (REAL_MODEL_FIXTURES, by name wherever defined,
or a fixture of its module or of a conftest.py above it that requests one or calls a loader), or when it, or a
function of its module it calls, calls a loader (LOADERS; not where it fakes the encoder's model) or starts the
engine server in a process (`link engine serve`, whose default model is SmolLM2; its error paths run in-process
through typer's runner and load nothing). ALSO_LOADING names the few the scan cannot see.
Checked against a run that recorded, per test, every open of a model file (main process and children).

    .venv/bin/python -m pytest -q tests/test_markers.py
"""

from __future__ import annotations

import ast
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
# tests/conftest.py's real models, loaded once per session, and the paths of the model packages' GGUF files
REAL_MODEL_FIXTURES = frozenset({"smollm2", "gemma3", "smollm2_fp32", "smollm2_gguf_path", "gemma3_gguf_path"})
# callables that load a real model's weights or the embedding encoder (their first use, for a pool or an embedder)
LOADERS = frozenset({"LLM", "load_model", "EnginePool", "resolve_base", "SentenceTransformer", "gateway_embedder",
                     "default_model_dir", "OnnxEncoder", "Embedder", "run_serving_benchmark"})
# starting a process: with the arguments `engine serve` in its source, the engine server on a real model
PROCESS_STARTERS = frozenset({"Popen", "ServerProcess"})
ENGINE_SERVE = "'engine', 'serve'"
# tests whose loading the scan cannot see (a command or gateway that loads the model in the library it calls), by
# "path::test". A command that only reads a model's tokenizer or file header (`link posttrain sft`'s checks before
# training) loads no model.
ALSO_LOADING = {
    "tests/benchmarks/test_bench.py::test_bench_serving_command_writes_json": "`link bench serving` runs SmolLM2",
    "tests/benchmarks/test_bench_workloads.py::test_bench_serving_mixed_workload_saves_a_mix": "the same",
    "tests/benchmarks/test_bench_workloads.py::test_bench_serving_repetitive_workload_and_an_unknown_one": "the same",
    "tests/cli/test_cli.py::test_chat_answers_one_question_and_reports_the_load_on_stderr": "`link chat` loads SmolLM2",
    "tests/cli/test_cli.py::test_interactive_chat_keeps_history_until_exit": "the same",
    "tests/cli/test_cli_compile_config.py::test_tune_config_replays_the_mix_and_status_shows_the_winner":
        "`link compile tune-config` replays a traffic mix on SmolLM2",
    "tests/cli/test_cli_compile.py::test_tune_recorded_then_status": "`link compile tune` loads SmolLM2 first",
    "tests/cli/test_cli_compile.py::test_tune_refuses_an_unknown_workload_and_missing_counts": "the same",
    "tests/evals/test_targets.py::test_top_logprobs_from_the_real_engine": "an in-process gateway's local SmolLM2",
    "tests/routers/test_routing_share.py::test_shares_per_suite_with_the_requests_tools":
        "benchmarks/routing_share.py embeds the prompts with MiniLM for link-auto's router",
}
# a function that swaps the encoder's model for a fake (`embedder._model = Fake()`, or monkeypatching `embed` or
# the SentenceTransformer class): its loader calls load nothing
FAKED_ENCODER = re.compile(r"\._model = |setattr\([^)]*(embed|SentenceTransformer)", re.IGNORECASE)


@dataclass
class Module:
    """What the scan needs of one test module or conftest.py: its functions and whether it marks all slow."""

    path: Path
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = field(default_factory=dict)
    fixtures: set[str] = field(default_factory=set)
    is_slow: bool = False


def _is_slow_mark(node: ast.AST) -> bool:
    """`pytest.mark.slow`, or a list/tuple/call containing it (`pytestmark = [pytest.mark.slow, ...]`)."""
    return any(isinstance(n, ast.Attribute) and n.attr == "slow" and isinstance(n.value, ast.Attribute)
               and n.value.attr == "mark" for n in ast.walk(node))


def _is_fixture(function: ast.AST) -> bool:
    return any("fixture" in ast.unparse(d) for d in getattr(function, "decorator_list", ()))


def read_module(path: Path) -> Module:
    module = Module(path)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            module.is_slow = module.is_slow or _is_slow_mark(node.value)
        functions = [node] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
        if isinstance(node, ast.ClassDef):   # a test class's methods, under "Class.method", with its marks
            functions = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
            if any(_is_slow_mark(d) for d in node.decorator_list):
                for f in functions:
                    f.decorator_list.append(ast.parse("pytest.mark.slow", mode="eval").body)
        for function in functions:
            module.functions[function.name] = function
            if _is_fixture(function):
                module.fixtures.add(function.name)
    return module


def _arguments(function) -> set[str]:
    args = function.args
    return {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)} | {
        ast.literal_eval(e) for d in function.decorator_list if "usefixtures" in ast.unparse(d)
        for e in getattr(d, "args", ()) if isinstance(e, ast.Constant)}


def _calls_and_texts(function) -> tuple[set[str], str]:
    """The names it calls (`f(...)`, `a.f(...)`) and its source."""
    called = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Call):
            called.add(node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", ""))
    return called, ast.unparse(function)


class Scan:
    """Which test functions load a real model, by directory scope of conftest.py fixtures."""

    def __init__(self, tests: Path = TESTS):
        self.tests = tests
        self.conftests = {p.parent: read_module(p) for p in tests.rglob("conftest.py")}

    def _scopes(self, module: Module) -> list[Module]:
        """The module itself, then the conftest.py files from its folder up to `tests` (nearest first)."""
        scopes, folder = [module], module.path.parent
        while True:
            if folder in self.conftests and self.conftests[folder] is not module:
                scopes.append(self.conftests[folder])
            if folder == self.tests or folder == folder.parent:
                return scopes
            folder = folder.parent

    def loads_real_model(self, module: Module, name: str, scopes: list[Module], seen: set) -> bool:
        """Whether function or fixture `name`, looked up nearest scope first, loads a real model."""
        if name in REAL_MODEL_FIXTURES:   # also where a module redefines one: the names mean the real models
            return True
        owner = next((s for s in scopes if name in s.functions), None)
        if owner is None or (owner.path, name) in seen:
            return False
        seen.add((owner.path, name))
        function = owner.functions[name]
        owner_scopes = scopes[scopes.index(owner):]
        called, source = _calls_and_texts(function)
        if (called & LOADERS or (called & PROCESS_STARTERS and ENGINE_SERVE in source)) and not FAKED_ENCODER.search(source):
            return True
        requested = _arguments(function) if _is_fixture(function) or name.startswith("test") else set()
        # a fixture's own name among its arguments is the one it overrides, one scope further up
        return any(self.loads_real_model(module, n, owner_scopes[1:] if n == name else owner_scopes, seen)
                   for n in requested | (called & set().union(*(s.functions for s in owner_scopes))))

    def unmarked(self) -> list[str]:
        """"path::test" of every test that loads a real model without the slow marker."""
        found = []
        for path in sorted(self.tests.rglob("test_*.py")):
            module = read_module(path)
            if module.is_slow:
                continue
            scopes = self._scopes(module)
            for name, function in module.functions.items():
                if not name.startswith("test") or _is_fixture(function):
                    continue
                if any(_is_slow_mark(d) for d in function.decorator_list):
                    continue
                test_id = f"{path.relative_to(self.tests.parent)}::{name}"
                if test_id in ALSO_LOADING or self.loads_real_model(module, name, scopes, set()):
                    found.append(test_id)
        return found


def test_every_test_that_loads_a_real_model_is_marked_slow():
    found = Scan().unmarked()
    assert not found, ("these tests load a real model or the embedding encoder: add `@pytest.mark.slow` (or the "
                       "module's `pytestmark = pytest.mark.slow`):\n" + "\n".join(found))


def test_every_listed_loading_test_still_exists():
    for test_id in ALSO_LOADING:
        path, name = test_id.split("::")
        assert name in read_module(ROOT / path).functions, f"{test_id} is gone; drop it from ALSO_LOADING"


def test_make_test_runs_the_slow_tests_too():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert any(m.startswith("slow:") for m in config["markers"])
    assert "-m" not in config.get("addopts", "").split() and "not slow" not in config.get("addopts", "")
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    runs = [line.split(" -m pytest", 1)[1] for line in recipe.splitlines() if " -m pytest" in line]
    assert runs and all(" -m " not in run for run in runs) and "not slow" not in recipe
    if len(runs) == 2:  # the Qwen tests in a process of their own: what the first run leaves out, the second runs
        assert runs == [" -q --durations=25 $(addprefix --ignore=,$(QWEN_TESTS)) $(PYTEST_ARGS)",
                        " -q --durations=10 $(QWEN_TESTS) $(PYTEST_ARGS)"]
        qwen = makefile.split("QWEN_TESTS :=", 1)[1].split("\n\n", 1)[0].replace("\\\n", " ").split()
        assert qwen and all((ROOT / path).is_file() for path in qwen), qwen


def test_the_scan_follows_fixtures_helpers_and_conftests(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "conftest.py").write_text("import pytest\n@pytest.fixture\ndef engine(smollm2):\n    return smollm2\n"
                                          "@pytest.fixture\ndef fake():\n    return 1\n")
    (tmp_path / "sub" / "conftest.py").write_text("import pytest\n@pytest.fixture\ndef fake(fake):\n    return LLM('x')\n")
    (tmp_path / "test_top.py").write_text(
        "import pytest\n"
        "def helper():\n    return load_model('m')\n"
        "def test_fixture(engine): pass\n"
        "def test_helper():\n    helper()\n"
        "def test_fake(fake): pass\n"
        "@pytest.mark.slow\ndef test_marked(engine): pass\n"
        "def test_faked(tmp_path):\n    e = Embedder(tmp_path)\n    e._model = Fake()\n"
        "def test_process():\n    Popen(['link', 'engine', 'serve', '--port', '0'])\n"
        "def test_error_path():\n    runner.invoke(app, ['engine', 'serve', '--model', 'nope'])\n"
        "class TestGroup:\n    def test_method(self, smollm2): pass\n")
    (tmp_path / "sub" / "test_sub.py").write_text("def test_fake(fake): pass\n@pytest.fixture\ndef toy():\n"
                                                  "    return 'a toy'\ndef test_toy(toy): pass\n")
    (tmp_path / "sub" / "test_marked.py").write_text("import pytest\npytestmark = [pytest.mark.slow]\n"
                                                     "def test_fake(fake): pass\n")
    assert Scan(tmp_path).unmarked() == [f"{tmp_path.name}/sub/test_sub.py::test_fake",
                                         f"{tmp_path.name}/test_top.py::test_fixture",
                                         f"{tmp_path.name}/test_top.py::test_helper",
                                         f"{tmp_path.name}/test_top.py::test_process",
                                         f"{tmp_path.name}/test_top.py::test_method"]


@pytest.mark.parametrize("source, expected", [("pytestmark = pytest.mark.slow", True),
                                               ("pytestmark = [pytest.mark.gpu, pytest.mark.slow]", True),
                                               ("pytestmark = pytest.mark.gpu", False)])
def test_a_module_mark(tmp_path, source, expected):
    (tmp_path / "test_m.py").write_text(f"import pytest\n{source}\n")
    assert read_module(tmp_path / "test_m.py").is_slow is expected
