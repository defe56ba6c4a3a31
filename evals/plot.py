"""The quality-cost plot of a report: score against cost per 1,000 queries, with the Pareto frontier.

    fig = quality_cost_figure(["a", "b"], costs_per_1k=[0.0, 5.0], scores=[0.6, 0.9], ci=[(0.55, 0.65), (0.86, 0.93)])
    save_png(fig, "report.png")

Matplotlib is used through its object API on the Agg canvas (no pyplot, no global backend), so plotting
works headless and from threads. The x axis is logarithmic; when a model is free (cost 0, local
models) it is symlog instead (linear below the cheapest paid model, log above), so the free model sits
at 0 rather than vanishing from a log axis; when every model is free it is linear from 0 to 1. The axis
never shows negative costs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

FRONTIER_LABEL = "Pareto frontier"


def pareto_frontier(costs: Sequence[float], scores: Sequence[float]) -> list[int]:
    """Indices of the non-dominated points, cheapest first.

    A point is dominated when another costs no more and scores no less, and is strictly better in one;
    of identical points the first is kept. (Sort by cost, then score descending; keep each point that
    beats the best score seen so far.)
    """
    order = sorted(range(len(costs)), key=lambda i: (costs[i], -scores[i], i))
    frontier: list[int] = []
    for i in order:
        if not frontier or scores[i] > scores[frontier[-1]]:
            frontier.append(i)
    return frontier


def _groups_of(groups: Sequence[str] | None, n: int) -> dict[str, list[int]]:
    """Group name -> point indices, in order of appearance (one group "" when `groups` is None)."""
    out: dict[str, list[int]] = {}
    for i in range(n):
        out.setdefault(groups[i] if groups is not None else "", []).append(i)
    return out


def quality_cost_figure(names: Sequence[str], costs_per_1k: Sequence[float], scores: Sequence[float], *,
                        ci: Sequence[tuple[float, float]] | None = None, title: str = "",
                        groups: Sequence[str] | None = None) -> Figure:
    """A figure of `scores` (y, with 95% CI bars when `ci` is given) against `costs_per_1k` (x, USD per
    1,000 queries), each point labelled with its name, and the Pareto frontier as a step line (label
    `FRONTIER_LABEL`) through the non-dominated points, carried on to the largest cost: the best score
    reachable at each budget. Frontier points are red, the others blue.

    `groups` (one name per point, e.g. the suite) draws one frontier per group, each in its group's colour
    (label "Pareto frontier: <group>"); scores of different suites are not comparable. The x axis never
    goes below 0; labels alternate above and below their points (in cost order) so neighbours overlap less."""
    fig = Figure(figsize=(8, 5.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    if ci is not None:
        yerr = [[max(0.0, s - lo) for s, (lo, _) in zip(scores, ci)], [max(0.0, hi - s) for s, (_, hi) in zip(scores, ci)]]
        ax.errorbar(costs_per_1k, scores, yerr=yerr, fmt="none", ecolor="0.6", elinewidth=1, capsize=3,
                    clip_on=False, zorder=2.6)  # above the y spine, where free models sit
    by_group = _groups_of(groups, len(names))
    for number, (group, members) in enumerate(by_group.items()):
        colour = f"C{number}" if groups is not None else None
        cost_of = [costs_per_1k[i] for i in members]
        frontier = [members[j] for j in pareto_frontier(cost_of, [scores[i] for i in members])]
        for i in members:
            point_colour = colour or ("tab:red" if i in frontier else "tab:blue")
            ax.scatter([costs_per_1k[i]], [scores[i]], s=40 if i in frontier else 25, zorder=3, color=point_colour,
                       clip_on=False)
        if frontier:
            xs = [costs_per_1k[i] for i in frontier]
            ys = [scores[i] for i in frontier]
            if max(cost_of) > xs[-1]:  # the best score stays reachable at any larger budget
                xs, ys = xs + [max(cost_of)], ys + [ys[-1]]
            ax.step(xs, ys, where="post", color=colour or "tab:red", linewidth=1.5, zorder=2,
                    label=f"{FRONTIER_LABEL}: {group}" if groups is not None else FRONTIER_LABEL)
    for k, i in enumerate(sorted(range(len(names)), key=lambda i: (costs_per_1k[i], scores[i], i))):
        above = k % 2 == 0
        ax.annotate(names[i], (costs_per_1k[i], scores[i]), xytext=(5, 4 if above else -4), textcoords="offset points",
                    va="bottom" if above else "top", fontsize=8, annotation_clip=False)
    positive = [c for c in costs_per_1k if c > 0]
    if positive and len(positive) == len(costs_per_1k):
        ax.set_xscale("log")
        ax.set_xlim(min(positive) / 1.3, max(positive) * 1.8)  # room for the rightmost point's label
        ax.set_xlabel("cost per 1,000 queries (USD, log axis)")
    elif positive:
        ax.set_xscale("symlog", linthresh=min(positive))
        ax.set_xlim(left=0)  # free models sit on the y axis; markers are not clipped
        ax.set_xlabel("cost per 1,000 queries (USD; symlog axis: linear below the cheapest paid model, 0 = free)")
    else:
        ax.set_xlim(0, 1)  # every model is free: no negative costs on the axis
        ax.set_xlabel("cost per 1,000 queries (USD; every model here is free)")
    ax.set_ylabel("score (mean, 95% CI)")
    ax.set_title(title or "Quality vs cost")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best")  # the corner that hides the fewest points
    return fig


def save_png(fig: Figure, path: str | Path) -> Path:
    """Write `fig` as a PNG at `path` (parent folders created). Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=120)
    return path
