"""The PNG of an evaluation report: each router's cost-quality curve next to the single models.

    plot_report(evaluate_split(train, test, settings), "routing.png")

Left panel: mean quality against mean USD per request (log axis; symlog when a model is free), each
router's non-decreasing convex hull as a line (its AIQ in the legend) over its operating points as dots
(for cross-validation the mean of the folds' hulls, its legend the printed mean±std, no dots: `mean_report`)
(cascades dotted, hybrids dash-dotted, the oracle and random dashed), the single models as labelled black
points (ensemble columns, e.g. link/moa, as diamonds; each label where it overlaps no other and stays inside the
axes, `place_labels`), the legend beside the axes. Right panel, for a strong/weak pair: quality against the
share of strong-model calls, RouteLLM's view (APGR in the legend). Matplotlib's object API on the Agg
canvas: no pyplot, no global backend, safe headless and from threads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from routers.offline.metrics import nondecreasing_convex_hull


def split_report(report: dict[str, Any]) -> dict[str, Any]:
    """The report to draw from whatever `link router eval` wrote: a split report as it is (with a fixed test
    split, that one); for cross-validation folds (or re-drawn splits alone) their mean (`mean_report`), what the
    printed mean±std table reads.

    Raises:
        ValueError: no split report inside.
    """
    if "routers" in report:
        return report
    for key in ("split", "resplits", "kfold"):
        if isinstance(report.get(key), dict):
            return split_report(report[key])
    for key in ("splits", "folds"):
        if report.get(key):
            return mean_report(report[key])
    raise ValueError("no split report (with 'routers') inside")


def _mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value), as `crossval.summarize` prints them."""
    return float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def mean_report(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One drawable report of several splits' reports (cross-validation folds, re-drawn splits).

    Each router's curve is the mean over the splits of its non-decreasing convex hull (quality at each cost,
    flat after its best point), from the largest of the splits' cheapest costs, where every split has a point,
    on the union of the hulls' vertices (the mean is linear between them, so the line is exact); its "aiq" and
    "apgr" are the means over the splits with "aiq_std"/"apgr_std" their sample standard deviations (the
    printed mean±std). Single models are placed at their mean accuracy and cost; the strong/weak panel is kept
    when every split has the same pair, its curve the mean per threshold. Routers without a curve in every
    split are left out; "num_runs" is the number of splits.
    """
    singles = {m: {key: float(np.mean([r["single_models"][m][key] for r in runs])) for key in ("accuracy", "cost_usd")}
               for m in runs[0]["single_models"]}
    pairs = [r.get("pair") for r in runs]
    out: dict[str, Any] = {"num_test": int(sum(r["num_test"] for r in runs)), "num_runs": len(runs),
                           "cost_range": [min(r["cost_range"][0] for r in runs), max(r["cost_range"][1] for r in runs)],
                           "pair": pairs[0] if all(p == pairs[0] for p in pairs) else None,
                           "ensembles": runs[0].get("ensembles") or [], "single_models": singles, "routers": {}}
    for name in runs[0]["routers"]:
        entries = [r["routers"].get(name) or {} for r in runs]
        if not all(e.get("curve") for e in entries):
            continue
        hulls = [nondecreasing_convex_hull(e["curve"]["cost_usd"], e["curve"]["quality"]) for e in entries]
        start = max(hx[0] for hx, _ in hulls)
        end = max(out["cost_range"][1], max(hx[-1] for hx, _ in hulls))
        grid = np.unique(np.concatenate([[start, end], *(hx[(hx > start) & (hx < end)] for hx, _ in hulls)]))
        entry: dict[str, Any] = {"curve": {"cost_usd": grid.tolist(),
                                           "quality": np.mean([np.interp(grid, hx, hy) for hx, hy in hulls], axis=0).tolist()}}
        entry["aiq"], entry["aiq_std"] = _mean_std([e["aiq"] for e in entries])
        if out["pair"] is not None and all(e.get("apgr") is not None for e in entries):
            entry["apgr"], entry["apgr_std"] = _mean_std([e["apgr"] for e in entries])
        curves = [e.get("threshold_curve") for e in entries]
        if out["pair"] is not None and all(curves) and len({len(c["quality"]) for c in curves}) == 1:
            entry["threshold_curve"] = {key: np.mean([c[key] for c in curves], axis=0).tolist()
                                        for key in ("strong_share", "quality")}
        out["routers"][name] = entry
    return out


def _with_std(name: str, metric: str, entry: dict[str, Any]) -> str:
    """A legend label: "knn (AIQ 0.812)", or for a mean over splits "knn (AIQ 0.812±0.010)", as the table prints."""
    key = metric.lower()
    std = entry.get(f"{key}_std")
    return f"{name} ({metric} {entry[key]:.3f}" + (f"±{std:.3f})" if std is not None else ")")


def _line_style(name: str) -> str:
    if name.startswith("cascade:"):
        return ":"
    if name.startswith("hybrid:"):
        return "-."
    return "--" if name in ("oracle", "random") else "-"


# label offsets from the point, in points, tried in order: right above, right below, left above, left below,
# then further up and down
_OFFSETS = ((4, 4), (4, -10), (-4, 4), (-4, -10), (4, 13), (4, -19), (-4, 13), (-4, -19), (4, 22), (4, -28))


def place_labels(ax, points: list[tuple[str, float, float]], fontsize: float = 7) -> list:
    """Label each (name, x, y) data point, each label at the first offset where it overlaps no label placed
    before it and stays inside the axes (none does: the offset with the least overlap). Call once the axes'
    scales, limits and position are final (e.g. after `fig.draw_without_rendering()`).

    Returns:
        The matplotlib Annotations, in the order of `points`.
    """
    renderer = ax.figure.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    placed, labels = [], []
    for name, x, y in points:
        best = None                                  # (overlapping area in pixels^2, label, its box)
        for dx, dy in _OFFSETS:
            label = ax.annotate(name, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=fontsize,
                                ha="left" if dx > 0 else "right", va="bottom")
            box = label.get_window_extent(renderer)
            cost = sum(_overlap_area(box, other) for other in placed) + box.width * box.height - _overlap_area(box, frame)
            if best is not None and cost >= best[0]:
                label.remove()
                continue
            if best is not None:
                best[1].remove()
            best = (cost, label, box)
            if cost == 0:
                break
        placed.append(best[2])
        labels.append(best[1])
    return labels


def _overlap_area(a, b) -> float:
    width = min(a.x1, b.x1) - max(a.x0, b.x0)
    height = min(a.y1, b.y1) - max(a.y0, b.y0)
    return max(width, 0.0) * max(height, 0.0)


def report_figure(report: dict[str, Any], *, title: str = ""):
    """A matplotlib Figure of `report` (see the module docstring). Routers without a kept curve are skipped."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    report = split_report(report)
    has_pair = report.get("pair") is not None
    fig = Figure(figsize=(13 if has_pair else 8.5, 5.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2 if has_pair else 1, squeeze=False)[0]
    ax = axes[0]
    singles = report["single_models"]
    for number, (name, entry) in enumerate(report["routers"].items()):
        curve = entry.get("curve")
        if not curve:
            continue
        colour = f"C{number % 10}"
        cost, quality = np.asarray(curve["cost_usd"]), np.asarray(curve["quality"])
        if not report.get("num_runs"):            # a mean over splits has no operating points of its own
            ax.scatter(cost, quality, s=6, color=colour, alpha=0.35, zorder=2)
        hx, hy = nondecreasing_convex_hull(cost, quality)
        hx, hy = np.append(hx, max(report["cost_range"][1], hx[-1])), np.append(hy, hy[-1])
        # the hull is linear in cost: sample it densely so it stays true on a log axis
        xs = np.union1d(np.linspace(hx[0], hx[-1], 200), np.geomspace(max(hx[0], 1e-12), max(hx[-1], 1e-12), 200))
        ax.plot(xs, np.interp(xs, hx, hy), color=colour, linewidth=1.6, zorder=3, label=_with_std(name, "AIQ", entry),
                linestyle=_line_style(name))
    costs = [s["cost_usd"] for s in singles.values()]
    ensembles = set(report.get("ensembles") or ())
    for marker, label, members in (("o", "single models", [n for n in singles if n not in ensembles]),
                                   ("D", "ensembles", [n for n in singles if n in ensembles])):
        if members:
            ax.scatter([singles[n]["cost_usd"] for n in members], [singles[n]["accuracy"] for n in members], color="black",
                       marker=marker, s=22, zorder=4, label=label)
    if min(costs) > 0:
        ax.set_xscale("log")
    else:
        positive = [c for c in costs if c > 0]
        ax.set_xscale("symlog", linthresh=min(positive) if positive else 1.0)
    ax.set_xlabel("mean cost per request (USD)")
    ax.set_ylabel("mean quality")
    runs = f", mean of {report['num_runs']} splits" if report.get("num_runs") else ""
    ax.set_title(title or f"cost-quality ({report['num_test']} test prompts{runs})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)   # beside: hides no model
    if has_pair:
        pair = report["pair"]
        bx = axes[1]
        for number, (name, entry) in enumerate(report["routers"].items()):
            curve = entry.get("threshold_curve")
            if not curve:
                continue
            order = np.argsort(curve["strong_share"])
            bx.plot(np.asarray(curve["strong_share"])[order] * 100, np.asarray(curve["quality"])[order], marker=".",
                    color=f"C{number % 10}", label=_with_std(name, "APGR", entry) if entry.get("apgr") is not None else name)
        for model, style in ((pair["strong"], "--"), (pair["weak"], ":")):
            bx.axhline(singles[model]["accuracy"], color="grey", linestyle=style, linewidth=1, label=model)
        bx.set_xlabel(f"calls to {pair['strong']} (%)")
        bx.set_ylabel("mean quality")
        bx.set_title("strong/weak threshold sweep (RouteLLM)")
        bx.grid(alpha=0.3)
        bx.legend(fontsize=7, loc="lower right")
    fig.draw_without_rendering()      # the whole figure is built: the layout and the axes' pixels are final
    place_labels(ax, [(name.split("/")[-1], s["cost_usd"], s["accuracy"])
                      for name, s in sorted(singles.items(), key=lambda kv: kv[1]["cost_usd"])])
    return fig


def plot_report(report: dict[str, Any], path: str | Path, *, title: str = "") -> Path:
    """Write `report_figure(report)` as a PNG at `path` (folders created). Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    report_figure(report, title=title).savefig(path, dpi=120)
    return path
