"""The outcome table: validation, views, and the .jsonl / .csv round trip."""

from __future__ import annotations

import gzip
import json
import math

import numpy as np
import pytest

from evals.outcomes import OUTCOME_COLUMNS, Outcome, OutcomeTable


def _rows() -> list[Outcome]:
    return [Outcome("p1", "math", "1+1?", "b", 1.0, 0.002, 5, 1, 0.5, "2"),
            Outcome("p1", "math", "1+1?", "a", 0.0, 0.0),
            Outcome("p2", "code", 'say "hi",\nthen stop', "a", 0.25, 0.01, None, 7, None, "hi, there\n|x|",
                    has_tools=True)]


@pytest.mark.parametrize("kwargs, message", [
    ({"score": 1.5}, "score"), ({"score": -0.1}, "score"), ({"score": math.nan}, "score"),
    ({"cost_usd": -1.0}, "cost_usd"), ({"prompt_id": ""}, "prompt_id"), ({"model": ""}, "model"),
])
def test_outcome_rejects_invalid_values(kwargs, message):
    fields = {"prompt_id": "p", "suite": "s", "prompt": "q", "model": "m", "score": 0.5, **kwargs}
    with pytest.raises(ValueError, match=message):
        Outcome(**fields)


def test_from_dict_reads_empty_optional_cells_as_none():
    row = {"prompt_id": 3, "suite": "", "prompt": "q", "model": "m", "score": "1", "cost_usd": "",
           "prompt_tokens": "", "completion_tokens": "4", "latency_s": "", "response": ""}
    o = Outcome.from_dict(row, from_csv=True)
    assert (o.prompt_id, o.score, o.cost_usd, o.prompt_tokens, o.completion_tokens, o.latency_s, o.response) == \
        ("3", 1.0, 0.0, None, 4, None, None)


def test_an_empty_json_answer_is_recorded_and_a_null_one_is_not(tmp_path):
    """Issue 37: "" read as unrecorded made `--answer-check` skip the cascade; only null is unrecorded."""
    base = {"suite": "s", "prompt": "q", "score": 0.0, "cost_usd": 0.0}
    path = tmp_path / "o.jsonl"
    path.write_text("".join(json.dumps({**base, "prompt_id": f"p{i}", "model": "m", **extra}) + "\n"
                            for i, extra in enumerate([{"response": ""}, {"response": None}, {}, {"response": "4"}])))
    assert [o.response for o in OutcomeTable.read(path)] == ["", None, None, "4"]


@pytest.mark.parametrize("cell, needle", [(None, "field 'score' is empty"), ("high", "field 'score'")])
def test_a_bad_score_names_the_field_the_file_and_the_line(tmp_path, cell, needle):
    path = tmp_path / "o.jsonl"
    good = {"prompt_id": "p", "suite": "s", "prompt": "q", "model": "m", "score": 1.0}
    path.write_text(json.dumps(good) + "\n\n" + json.dumps({**good, "prompt_id": "p2", "score": cell}) + "\n")
    with pytest.raises(ValueError, match=f"{path}:3: bad outcome row: {needle}"):
        OutcomeTable.read(path)


def test_rows_without_cost_are_counted_and_rows_without_prompt_text_refused_on_request(tmp_path):
    rows = [Outcome(f"p{i}", "s", f"q{i}", "m", 1.0, 0.5) for i in range(4)]
    table = OutcomeTable(rows)
    path = tmp_path / "o.jsonl"
    records = [json.loads(line) for line in table.write(path).read_text().splitlines()]
    del records[1]["cost_usd"]
    records[2]["cost_usd"] = None
    records[3]["prompt"] = ""
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    read = OutcomeTable.read(path)
    assert [o.cost_usd for o in read] == [0.5, 0.0, 0.0, 0.5]
    assert read.warnings == [f"2 rows of {path} have no cost_usd; read as 0 USD (a free model)"]
    with pytest.raises(ValueError, match=f"{path}:4: bad outcome row: no prompt text \\(field 'prompt'\\)"):
        OutcomeTable.read(path, require_prompt=True)
    # a shipped text-free file reads for replay; a router's reader names it
    shipped = table.write(tmp_path / "shipped.csv.gz", text=False)
    assert [o.prompt for o in OutcomeTable.read(shipped)] == [""] * 4 and OutcomeTable.read(shipped).warnings == []
    with pytest.raises(ValueError, match="no prompt text on any row"):
        OutcomeTable.read(shipped, require_prompt=True)


@pytest.mark.parametrize("suite, cell, expected", [
    ("gsm8k", None, False), ("bfcl", None, True), ("nestful", "", True), ("bfcl", False, False),
    ("gsm8k", "True", True), ("gsm8k", "false", False), ("mmlu", "1", True), ("bfcl", "0", False),
])
def test_has_tools_is_read_from_the_cell_or_from_the_tool_suites(suite, cell, expected):
    row = {"prompt_id": "p", "suite": suite, "prompt": "q", "model": "m", "score": 1.0}
    if cell is not None:
        row["has_tools"] = cell
    assert Outcome.from_dict(row).has_tools is expected


def test_views_keep_first_appearance_order():
    table = OutcomeTable(_rows())
    assert table.models == ("b", "a") and table.prompt_ids == ("p1", "p2") and len(table) == 3
    assert table.prompts() == {"p1": ("math", "1+1?"), "p2": ("code", 'say "hi",\nthen stop')}
    assert [(o.prompt_id, o.model) for o in table.select(models=["a"])] == [("p1", "a"), ("p2", "a")]
    assert len(table.select(prompt_ids=["p2"], models=["b"])) == 0
    ids, models, scores, costs = table.pivot()
    assert ids == ["p1", "p2"] and models == ["b", "a"]
    np.testing.assert_array_equal(scores, [[1.0, 0.0], [np.nan, 0.25]])
    np.testing.assert_array_equal(costs, [[0.002, 0.0], [np.nan, 0.01]])


def test_duplicates_are_refused():
    with pytest.raises(ValueError, match="duplicate"):
        OutcomeTable(_rows() + [Outcome("p2", "code", "x", "a", 1.0)])
    with pytest.raises(ValueError, match="duplicate"):
        OutcomeTable(_rows()).extend([Outcome("p1", "math", "x", "b", 0.0)])
    assert len(OutcomeTable(_rows()[:1]).extend(_rows()[1:])) == 3


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".jsonl.gz", ".csv.gz"])
def test_write_then_read_round_trips(tmp_path, suffix):
    path = OutcomeTable(_rows()).write(tmp_path / "deep" / f"outcomes{suffix}")
    assert path.exists()
    assert OutcomeTable.read(path).rows == _rows()
    raw = path.read_bytes()
    assert (raw[:2] == b"\x1f\x8b") == suffix.endswith(".gz")  # gzip's magic number
    text = gzip.decompress(raw).decode() if suffix.endswith(".gz") else raw.decode()
    if ".csv" in suffix:
        assert text.splitlines()[0] == ",".join(OUTCOME_COLUMNS)
    else:
        assert json.loads(text.splitlines()[0])["prompt_id"] == _rows()[0].prompt_id


def test_read_names_the_line_of_a_bad_row(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt_id": "p", "model": "m", "score": 1}\n{"prompt_id": "q", "model": "m", "score": 2}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: bad outcome row: score"):
        OutcomeTable.read(path)
    path.write_text('{"prompt_id": "p", "score": 1}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: bad outcome row: missing field 'model'; an outcome row needs"):
        OutcomeTable.read(path)
    csv_path = tmp_path / "bad.csv"
    csv_path.write_text("prompt_id,model,score\np,m,1\nq,m,x\n")
    with pytest.raises(ValueError, match=r"bad\.csv:3"):
        OutcomeTable.read(csv_path)


def test_read_counts_blank_lines_in_jsonl_line_numbers(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt_id": "p", "model": "m", "score": 1}\n\n{"prompt_id": "q", "model": "m", "score": 2}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:3"):
        OutcomeTable.read(path)
