"""The report's PNG: drawn headless from any report `link router eval` writes."""

from __future__ import annotations

import pytest

from routers.plot import plot_report, report_figure, split_report

PNG = b"\x89PNG\r\n\x1a\n"


def report(pair: bool) -> dict:
    models = ["strong", "weak"] if pair else ["a", "b", "c"]
    curve = {"lambda": [0.0, 1.0, 2.0], "cost_usd": [1.0, 0.5, 0.01], "quality": [0.9, 0.85, 0.6],
             "share": [[1, 0], [0.5, 0.5], [0, 1]]}
    routers = {"knn": {"aiq": 0.8, "curve": curve}, "oracle": {"aiq": 0.95, "curve": curve}, "no-curve": {"aiq": 0.5}}
    if pair:
        for entry in routers.values():
            entry["apgr"] = 0.7
            entry["threshold_curve"] = {"strong_share": [1.0, 0.5, 0.0], "quality": [0.9, 0.85, 0.6]}
    return {"num_test": 3, "cost_range": [0.0, 1.0], "pair": {"strong": "strong", "weak": "weak"} if pair else None,
            "single_models": {m: {"accuracy": 0.5 + 0.1 * i, "cost_usd": 0.01 * 10 ** i} for i, m in enumerate(models)},
            "routers": routers}


@pytest.mark.parametrize("pair", [False, True])
def test_plot_report_writes_a_png(tmp_path, pair):
    path = plot_report({"split": report(pair)}, tmp_path / "sub" / "r.png", title="toy")
    assert path.read_bytes()[:8] == PNG
    fig = report_figure(report(pair))
    assert len(fig.axes) == (2 if pair else 1)
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert "knn (AIQ 0.800)" in labels and not any(label.startswith("no-curve") for label in labels)


def test_split_report_finds_the_first_split_and_free_models_plot():
    inner = report(False)
    assert split_report({"kfold": {"folds": [inner, {}]}}) is inner
    assert split_report({"resplits": {"splits": [inner]}}) is inner
    with pytest.raises(ValueError):
        split_report({"nothing": 1})
    free = report(False)
    free["single_models"]["a"]["cost_usd"] = 0.0                 # a free local model: symlog axis
    assert report_figure(free).axes[0].get_xscale() == "symlog"
