"""The serving benchmark's report: one summary row per system and level, the ratios, the Rich tables;
and `show_and_save`, which every benchmark (CLI and scripts) ends with.

    row = summarize("link", 4, records, wall_s=12.0, peak_rss_mb=900.0)
    ratios = compute_ratios(rows)
    show_and_save(render_report(result), result, json_path)      # print the tables, write the JSON
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

from benchmarks.link_bench.timing import TimedRequest, percentile


def show_and_save(renderable, data, json_path: str | Path | None = None) -> None:
    """Print `renderable` (Rich) to stdout at the terminal's width, else at `$COLUMNS`, else (piped, `$COLUMNS`
    unset) 160 columns; write `data` as JSON to `json_path`."""
    from rich.console import Console

    is_sized = sys.stdout.isatty() or os.environ.get("COLUMNS", "").isdigit()
    Console(width=None if is_sized else 160).print(renderable)
    if json_path is not None:
        Path(json_path).write_text(json.dumps(data, indent=2) + "\n")


def ms(seconds: float | None, digits: int = 0) -> str:
    """Seconds as milliseconds text ("-" for None)."""
    return "-" if seconds is None else f"{seconds * 1e3:.{digits}f}"


def summarize(system: str, concurrency: int, records: list[TimedRequest], wall_s: float, peak_rss_mb: float) -> dict:
    """One row of the serving report (see benchmarks/link_bench/serving.py for each field); times in s, memory in MiB."""
    ttfts = [r.ttft_s for r in records]
    itls = [r.itl_s for r in records if r.itl_s is not None]
    num_tokens = sum(r.num_output_tokens for r in records)
    decode_s = sum(r.latency_s - r.ttft_s for r in records)
    return {
        "system": system, "concurrency": concurrency, "num_requests": len(records),
        "mean_prompt_tokens": sum(r.num_prompt_tokens for r in records) / len(records),
        "num_output_tokens": num_tokens, "duration_s": wall_s,
        "output_tokens_per_s": num_tokens / wall_s, "requests_per_s": len(records) / wall_s,
        "decode_tokens_per_s": (num_tokens - len(records)) / decode_s if decode_s > 0 else None,
        "ttft_p50_s": percentile(ttfts, 50), "ttft_p99_s": percentile(ttfts, 99),
        "itl_p50_s": percentile(itls, 50), "itl_p99_s": percentile(itls, 99),
        "latency_p50_s": percentile([r.latency_s for r in records], 50),
        "peak_rss_mb": peak_rss_mb, "requests": [asdict(r) for r in records],
    }


def compute_ratios(rows: list[dict]) -> dict[str, float]:
    """link against each baseline: aggregate tokens/s at link's top concurrency vs the baseline one at a
    time, batch-1 decode speed, and tokens/s at equal concurrency against transformers' static batches."""
    by = {(r["system"], r["concurrency"]): r for r in rows}
    link_levels = sorted(c for s, c in by if s == "link")
    ratios: dict[str, float] = {}
    for base in ("transformers", "llama-cpp"):
        b1 = by.get((base, 1))
        if not link_levels or b1 is None:
            continue
        top = link_levels[-1]
        ratios[f"link c={top} tok/s / {base} c=1 tok/s"] = by[("link", top)]["output_tokens_per_s"] / b1["output_tokens_per_s"]
        if ("link", 1) in by and by[("link", 1)]["decode_tokens_per_s"] and b1["decode_tokens_per_s"]:
            ratios[f"link c=1 decode tok/s / {base} c=1 decode tok/s"] = by[("link", 1)]["decode_tokens_per_s"] / b1["decode_tokens_per_s"]
    engine, llama = by.get(("link-engine", 1)), by.get(("llama-cpp", 1))
    if engine and llama and engine["decode_tokens_per_s"] and llama["decode_tokens_per_s"]:
        ratios["link-engine c=1 decode tok/s / llama-cpp c=1 decode tok/s"] = engine["decode_tokens_per_s"] / llama["decode_tokens_per_s"]
    for c in link_levels:
        if c > 1 and ("transformers", c) in by:
            ratios[f"link c={c} tok/s / transformers c={c} (static batch) tok/s"] = (
                by[("link", c)]["output_tokens_per_s"] / by[("transformers", c)]["output_tokens_per_s"])
    return ratios


def ratio_table(ratios: dict[str, float], title: str):
    """A two-column Rich table: each ratio's name and its value as "N.NNx"."""
    from rich.table import Table

    table = Table(title=title)
    table.add_column("ratio")
    table.add_column("value", justify="right")
    for name, value in ratios.items():
        table.add_row(name, "-" if value is None else f"{value:.2f}x")
    return table


def render_report(result: dict):
    """Rich tables: the serving rows, the prefill rows, link's warm-up, link vs llama.cpp, and the ratios."""
    from rich.console import Group
    from rich.markup import escape
    from rich.table import Table

    from benchmarks.link_bench.comparison import comparison_table

    machine, cpu = result["machine"], result.get("cpu")
    caption = [f"{machine['cpu_count']} CPUs; load average (1 min) {machine['load_average_before'][0]:.2f} before, "
               f"{machine.get('load_average_after', [float('nan')])[0]:.2f} after"]
    if cpu:
        have = " ".join(f for f, present in cpu["flags"].items() if present)
        lack = " ".join(f for f, present in cpu["flags"].items() if not present)
        caption.append(f"CPU: {cpu['model_name']}; has {have or '-'}; lacks {lack or '-'}")
    if result.get("memory", {}).get("method"):
        caption.append(result["memory"]["method"])
    caption += [f"{system}: {escape(reason)}" for system, reason in {**result["skipped"], **result["errors"]}.items()]
    table = Table(title=f"Serving {result['model']} ({result['dtype']}): {result['num_prompts']} requests per level, "
                        f"{result['max_tokens']} output tokens each", caption="\n".join(caption))
    for header in ("system", "conc.", "out tok/s", "req/s", "decode tok/s/req", "TTFT p50 ms", "TTFT p99 ms",
                   "ITL p50 ms", "ITL p99 ms", "peak RSS MiB"):
        table.add_column(header, justify="left" if header == "system" else "right")
    for r in result["rows"]:
        table.add_row(r["system"], str(r["concurrency"]), f"{r['output_tokens_per_s']:.1f}", f"{r['requests_per_s']:.2f}",
                      "-" if r["decode_tokens_per_s"] is None else f"{r['decode_tokens_per_s']:.1f}",
                      ms(r["ttft_p50_s"]), ms(r["ttft_p99_s"]), ms(r["itl_p50_s"]), ms(r["itl_p99_s"]), f"{r['peak_rss_mb']:.0f}")
    parts = [table]
    if result.get("prefill"):
        parts.append(prefill_table(result["prefill"]))
    if result.get("warmup"):
        parts.append(warmup_table(result["warmup"], result["rows"], result.get("warmup_s", 0), result.get("fresh", False)))
    if result.get("comparison"):
        parts.append(comparison_table(result["comparison"]))
    if result["ratios"]:
        parts.append(ratio_table(result["ratios"], "Ratios (above 1: link is faster)"))
    return Group(*parts)


def prefill_table(rows: list[dict]):
    """The prefill phase: one row per system (`benchmarks.link_bench.prefill.summarize_prefill`)."""
    from rich.table import Table

    table = Table(title="Prefill: long prompts, max_tokens=1, one at a time")
    for header in ("system", "requests", "prompt tokens", "prefill tok/s", "timer", "TTFT p50 ms", "TTFT p99 ms"):
        table.add_column(header, justify="left" if header in ("system", "timer") else "right")
    for r in rows:
        table.add_row(r["system"], str(r["num_requests"]), f"{r['mean_prompt_tokens']:.0f}", f"{r['prefill_tokens_per_s']:.1f}",
                      r["timer"], ms(r["ttft_p50_s"]), ms(r["ttft_p99_s"]))
    return table


def warmup_table(warmup: list[dict], rows: list[dict], warmup_s: float, fresh: bool):
    """link's ITL during the warm-up traffic next to the measured phase after it, per concurrency."""
    from rich.table import Table

    after = {r["concurrency"]: r for r in rows if r["system"] == "link"}
    table = Table(title=f"link ITL during {warmup_s:g} s of warm-up{' (fresh LINK_HOME)' if fresh else ''} and after")
    for header in ("conc.", "warm-up requests", "warm-up ITL p50 ms", "warm-up ITL p99 ms", "after ITL p50 ms", "after ITL p99 ms"):
        table.add_column(header, justify="right")
    for w in warmup:
        a = after.get(w["concurrency"], {})
        table.add_row(str(w["concurrency"]), str(w["num_requests"]), ms(w["itl_p50_s"], 1), ms(w["itl_p99_s"], 1),
                      ms(a.get("itl_p50_s"), 1), ms(a.get("itl_p99_s"), 1))
    return table
