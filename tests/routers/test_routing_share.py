"""benchmarks/routing_share.py run as a user would, on the shipped `link/auto` router and real suite items, with a
fresh $LINK_HOME (given the test session's exported encoder graphs where it has them: exporting is
tests/routers/test_onnx_encoder.py's subject, and costs this run about 8 s of CPU)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def fresh_home(tmp_path: Path) -> Path:
    """An empty $LINK_HOME holding copies of the session's ONNX graphs of the encoder (none: the script exports them)."""
    from serving.paths import cache_dir

    home = tmp_path / "home"
    (home / "cache" / "embeddings").mkdir(parents=True)
    for graph in cache_dir("embeddings").glob("*.onnx"):
        shutil.copy(graph, home / "cache" / "embeddings" / graph.name)
    return home


@pytest.mark.slow
def test_shares_per_suite_with_the_requests_tools(tmp_path, data_dir):
    router = ROOT / "routers" / "trained" / "link-auto.safetensors"
    out = tmp_path / "shares.json"
    env = {**os.environ, "LINK_HOME": str(fresh_home(tmp_path))}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "routing_share.py"), "--router", str(router),
                           "--router", str(router), "--suite", "gsm8k:test:6", "--suite", "bfcl:test:5",
                           "--data-dir", str(data_dir), "--json", str(out)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    gsm8k, bfcl = result["suites"]["gsm8k:test:6"], result["suites"]["bfcl:test:5"]
    assert (gsm8k["num_requests"], gsm8k["has_tools"]) == (6, 0)
    assert (bfcl["num_requests"], bfcl["has_tools"]) == (5, 5)           # BFCL's chat requests carry tools
    for entry in (gsm8k, bfcl):
        assert len(entry["shares"]) == 2 and entry["shares"][0] == entry["shares"][1]
        assert sum(entry["shares"][0].values()) == pytest.approx(1.0)
        assert set(entry["shares"][0]) <= {"smollm2-135m-instruct", "gemma-3-270m"}
        assert entry["same_as_first"] == [1.0]                            # the same file decides the same
