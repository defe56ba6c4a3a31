"""What `link router eval` prints: each split's metrics table and the mean±std tables of re-drawn splits and
cross-validation folds (the report is `routers.offline.pipeline.run_evaluation`'s)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from cli.tables import print_table

console = Console()


def split_reports(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Every split report of a `run_evaluation` result (fixed split, re-drawn splits, CV folds)."""
    out = [report["split"]] if "split" in report else []
    for key, many in (("resplits", "splits"), ("kfold", "folds")):
        out += (report.get(key) or {}).get(many, [])
    return out


def _fmt(value: Any, total: int = 0) -> str:
    """A metric, or a summary's mean±std (with n/total when some splits lack it)."""
    if value is None:
        return "-"
    if isinstance(value, dict):
        text = f"{value['mean']:.3f}±{value['std']:.3f}"
        return text + (f" ({value['n']}/{total})" if total and value.get("n", total) < total else "")
    return f"{value:.3f}"


# report key -> column header (ref: the best single model on the test prompts)
HEADERS = {"aiq": "AIQ", "accuracy_at_best_cost": "acc @ ref cost", "cost_ratio_at_best_accuracy": "cost/ref @ ref acc",
           "accuracy_at_25pct_best_cost": "acc @ 25% ref cost", "accuracy_at_50pct_best_cost": "acc @ 50% ref cost",
           "auc_within_suite": "AUC in suite", "apgr": "APGR", "cpt50": "CPT(50%)", "cpt80": "CPT(80%)"}


def _metrics_table(title: str, rows: dict[str, dict[str, Any]], keys: list[str], total: int = 0) -> Table:
    keys = [k for k in keys if any(metrics.get(k) is not None for metrics in rows.values())]
    table = Table(title=title)
    table.add_column("router", no_wrap=True)
    for key in keys:
        table.add_column(HEADERS.get(key, key), justify="right")
    for name, metrics in rows.items():
        table.add_row(name, *(_fmt(metrics.get(k), total) for k in keys))
    return table


def print_report(report: dict[str, Any]) -> None:
    keys = ["aiq", "accuracy_at_best_cost", "cost_ratio_at_best_accuracy", "accuracy_at_25pct_best_cost",
            "accuracy_at_50pct_best_cost", "auc_within_suite"]
    pair_keys = ["apgr", "cpt50", "cpt80"]
    if "split" in report:
        split = report["split"]
        ref = split["reference"]
        k = keys + (pair_keys if split["pair"] else [])
        print_table(_metrics_table(f"{split['num_test']} test prompts; best single model {ref['model']}: "
                                   f"accuracy {ref['accuracy']:.3f} at {ref['cost_usd']:.6f} USD/request; "
                                   f"zero router AIQ {split['zero_router']['aiq']:.3f}", split["routers"], k))
        steps = next((m["steps"] for n, m in split["routers"].items() if n.startswith("cascade:")), None)
        if steps:
            console.print(f"cascade:<router> escalates {' -> '.join(steps)} while the router's predicted quality of the "
                          "step is below the threshold (paying the answering step); cascade:oracle is a perfect judge "
                          "(paying every step called)")
        if split.get("ensembles"):
            console.print(f"routers choose among the single models; hybrid:<router> also among {', '.join(split['ensembles'])}")
    for key, runs, title in (("resplits", "splits", "re-drawn splits, mean±std"), ("kfold", "folds", "cross-validation, mean±std")):
        if key in report:
            summary = {n: m for n, m in report[key]["summary"].items() if n != "reference"}
            total = len(report[key][runs])
            print_table(_metrics_table(f"{title} over {total}", summary, keys + pair_keys, total))
    for type_, result in report.get("add_model", {}).items():
        console.print(f"add {result['new_model']} to {type_} from {result['num_labelled']} prompts: AIQ "
                      f"{result['added']['aiq']:.4f} vs full retrain {result['full']['aiq']:.4f} "
                      f"(gap {result['aiq_gap']:+.4f}); its largest routing share {result['new_model_max_share']:.1%}")
