"""Our HTTP engine server (`link`) against llama.cpp (`llama-cpp`) from one serving-benchmark result: one line per
metric with both values and the ratio ours / llama.cpp, and its Rich table.

    lines = compare_with_llama_cpp(result)
    # [{"metric": "decode tok/s per stream (c=1)", "unit": "tok/s", "link": 41.0, "llama-cpp": 80.0,
    #   "ratio": 0.51, "better": "higher"}, ...]
    comparison_table(lines)

The ratio is always ours / llama.cpp; `better` says which way is good (higher for speeds, lower for latencies
and memory). llama.cpp serves one request at a time, so link's output tokens/s at each concurrency above 1 is
set against llama.cpp's sequential tokens/s. A metric missing on either side keeps its line with a None ratio.
"""

from __future__ import annotations

MIB = 2**20


def _line(metric: str, unit: str, ours: float | None, theirs: float | None, better: str) -> dict:
    ratio = ours / theirs if ours is not None and theirs else None
    return {"metric": metric, "unit": unit, "link": ours, "llama-cpp": theirs, "ratio": ratio, "better": better}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def compare_with_llama_cpp(result: dict) -> list[dict]:
    """The comparison lines of `result` (`run_serving_benchmark`'s dict: `rows`, `prefill`, `memory`); [] unless
    both link and llama-cpp produced at least one row."""
    rows = {(r["system"], r["concurrency"]): r for r in result.get("rows", [])}
    systems = {s for s, _ in rows} | {r["system"] for r in result.get("prefill", [])}
    if not {"link", "llama-cpp"} <= systems:
        return []
    ours, theirs = rows.get(("link", 1), {}), rows.get(("llama-cpp", 1), {})
    lines = [_line("decode tok/s per stream (c=1)", "tok/s", ours.get("decode_tokens_per_s"), theirs.get("decode_tokens_per_s"), "higher")]
    for concurrency in sorted(c for s, c in rows if s == "link"):
        lines.append(_line(f"output tok/s, link c={concurrency} vs llama.cpp one at a time", "tok/s",
                           rows[("link", concurrency)]["output_tokens_per_s"], theirs.get("output_tokens_per_s"), "higher"))
    prefill = {r["system"]: r for r in result.get("prefill", [])}
    if prefill:
        tokens = next(iter(prefill.values()))["mean_prompt_tokens"]
        lines.append(_line(f"prefill tok/s ({tokens:.0f}-token prompts)", "tok/s", prefill.get("link", {}).get("prefill_tokens_per_s"),
                           prefill.get("llama-cpp", {}).get("prefill_tokens_per_s"), "higher"))
        lines.append(_line(f"prefill TTFT p50 ({tokens:.0f}-token prompts)", "ms", _ms(prefill.get("link", {}).get("ttft_p50_s")),
                           _ms(prefill.get("llama-cpp", {}).get("ttft_p50_s")), "lower"))
    for key, name in (("ttft_p50_s", "TTFT p50 (c=1)"), ("itl_p50_s", "ITL p50 (c=1)"), ("itl_p99_s", "ITL p99 (c=1)")):
        lines.append(_line(name, "ms", _ms(ours.get(key)), _ms(theirs.get(key)), "lower"))
    memory = result.get("memory", {})
    link_mem, llama_mem = memory.get("link", {}), memory.get("llama-cpp", {})
    lines.append(_line("peak RSS of the process", "MiB", link_mem.get("peak_rss_mb"), llama_mem.get("peak_rss_mb"), "lower"))
    weights, gguf = link_mem.get("resident_weight_bytes"), llama_mem.get("gguf_bytes")
    lines.append(_line("weights (ours resident; llama.cpp: the GGUF it maps)", "MiB", weights and weights / MIB,
                       gguf and gguf / MIB, "lower"))
    return lines


def comparison_table(lines: list[dict]):
    """A Rich table of `compare_with_llama_cpp` lines: metric, unit, link, llama.cpp, ours / llama.cpp, better."""
    from rich.table import Table

    table = Table(title="link (HTTP server) vs llama.cpp (in-process), same GGUF")
    for header in ("metric", "unit", "link", "llama.cpp", "ours / llama.cpp", "better"):
        table.add_column(header, justify="left" if header in ("metric", "unit", "better") else "right")
    for line in lines:
        cells = ["-" if line[k] is None else f"{line[k]:.1f}" for k in ("link", "llama-cpp")]
        table.add_row(line["metric"], line["unit"], *cells, "-" if line["ratio"] is None else f"{line['ratio']:.2f}x", line["better"])
    return table
