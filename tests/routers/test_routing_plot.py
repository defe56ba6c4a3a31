"""The report's PNG: drawn headless from any report `link router eval` writes."""

from __future__ import annotations

import numpy as np
import pytest

from routers.offline.plot import _overlap_area, place_labels, plot_report, report_figure, split_report

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


def test_split_report_finds_the_split_and_free_models_plot():
    inner = report(False)
    assert split_report({"split": inner, "resplits": {"splits": [report(True)]}}) is inner
    assert split_report({"resplits": {"splits": [inner]}})["routers"]["knn"]["aiq"] == 0.8   # a mean of one
    with pytest.raises(ValueError):
        split_report({"nothing": 1})
    free = report(False)
    free["single_models"]["a"]["cost_usd"] = 0.0                 # a free local model: symlog axis
    assert report_figure(free).axes[0].get_xscale() == "symlog"


def test_model_labels_do_not_overlap_each_other_the_legend_or_the_frame():
    crowded = report(False)                                    # RouterBench's case: models at nearly one point
    crowded["single_models"] = {f"org/model-{i}": {"accuracy": 0.60 + 0.004 * (i % 3), "cost_usd": 3e-4 * (1 + i / 40)}
                                for i in range(6)}
    crowded["single_models"]["far-right-model-with-a-long-name"] = {"accuracy": 0.9, "cost_usd": 1.0}
    fig = report_figure(crowded)
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    labels = [text for text in ax.texts]
    assert sorted(t.get_text() for t in labels) == sorted(["far-right-model-with-a-long-name"] +
                                                          [f"model-{i}" for i in range(6)])
    boxes = [t.get_window_extent(renderer) for t in labels]
    frame = ax.get_window_extent(renderer)
    for i, box in enumerate(boxes):
        assert _overlap_area(box, frame) == pytest.approx(box.width * box.height)      # inside the axes
        assert all(_overlap_area(box, other) == 0 for other in boxes[i + 1:])
    legend = ax.get_legend().get_window_extent(renderer)
    assert legend.x0 > frame.x1                                  # beside the axes: it covers no point


def test_place_labels_overlap_area_by_hand():
    from matplotlib.transforms import Bbox
    assert _overlap_area(Bbox([[0, 0], [4, 2]]), Bbox([[3, 1], [10, 10]])) == 1.0
    assert _overlap_area(Bbox([[0, 0], [1, 1]]), Bbox([[2, 2], [3, 3]])) == 0.0
    fig = report_figure(report(False))
    assert place_labels(fig.axes[0], []) == []


def test_cross_validation_draws_the_mean_of_the_folds_and_its_legend_says_mean_and_std():
    """Issue 37: the k-fold PNG drew the first fold; its legend must read the printed mean±std."""
    folds = []
    for hull, apgr_ in (([0.0, 0.5, 1.0], 0.6), ([0.2, 0.6, 1.0], 0.8)):   # the knn curve's quality at cost 0, 1, 2
        fold = report(True)
        fold["routers"]["knn"] = {"aiq": 0.5 if apgr_ == 0.6 else 0.6, "apgr": apgr_,
                                  "curve": {"lambda": [2, 1, 0], "cost_usd": [0.0, 1.0, 2.0], "quality": hull},
                                  "threshold_curve": {"strong_share": [0.0, 1.0], "quality": [hull[0], hull[2]]}}
        fold["cost_range"] = [0.0, 2.0]
        folds.append(fold)
    fig = report_figure({"kfold": {"folds": folds}}, title="2-fold CV")
    labels = fig.axes[0].get_legend_handles_labels()[1]
    # mean 0.55, sample std |0.5 - 0.6| / sqrt(2) = 0.0707
    assert "knn (AIQ 0.550±0.071)" in labels
    assert "knn (APGR 0.700±0.141)" in fig.axes[1].get_legend_handles_labels()[1]
    line = next(l for l in fig.axes[0].get_lines() if l.get_label().startswith("knn"))
    x, y = line.get_xdata(), line.get_ydata()
    # the mean hull: (0.1, 0.55, 1.0) at costs 0, 1, 2; at 0.5 it is halfway, (0.25 + 0.4) / 2 = 0.325
    for at, expected in ((0.0, 0.1), (0.5, 0.325), (1.0, 0.55), (2.0, 1.0)):
        assert np.interp(at, x, y) == pytest.approx(expected)
    mean = split_report({"kfold": {"folds": folds}})
    assert mean["num_runs"] == 2 and mean["routers"]["knn"]["threshold_curve"]["quality"] == pytest.approx([0.1, 1.0])
    # its area over the common cost range is the mean of the folds' AIQs on these hulls: (0.5 + 0.6) / 2
    from routers.offline.metrics import aiq
    curve = mean["routers"]["knn"]["curve"]
    assert aiq(curve["cost_usd"], curve["quality"], 0.0, 2.0) == pytest.approx(0.55)
