"""The pieces of the comparison with llama.cpp: CPU flags from /proc/cpuinfo text, llama.cpp's CMake flags,
prefill tokens/s from recorded timings, long prompts, the comparison lines and the report's tables."""

from __future__ import annotations

import pytest
from rich.console import Console

from benchmarks.link_bench import TimedRequest, compute_ratios, render_report, summarize
from benchmarks.link_bench.comparison import compare_with_llama_cpp
from benchmarks.link_bench.cpuinfo import REPORTED_FLAGS, llama_cpp_cmake_args, parse_cpuinfo
from benchmarks.link_bench.prefill import PrefillRecord, long_prompts, summarize_prefill

# Two processors of an AVX-512 server without AMX (abridged /proc/cpuinfo); the second block must be ignored.
SAMPLE_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R14  96-Core Processor
flags\t\t: fpu sse2 avx f16c fma avx2 avx512f avx512bw avx512vbmi avx512_vnni avx512_bf16 avx512vl

processor\t: 1
model name\t: Some Other CPU
flags\t\t: fpu amx_tile
"""
AVX2_ONLY = "processor\t: 0\nmodel name\t: Intel(R) Core(TM) i7-8700\nflags\t\t: fpu avx f16c fma avx2\n"


def test_cpuinfo_names_the_cpu_and_its_flags():
    cpu = parse_cpuinfo(SAMPLE_CPUINFO)
    assert cpu.model_name == "AMD EPYC 9R14 96-Core Processor"  # runs of spaces collapsed
    assert cpu.flags == {"avx2": True, "fma": True, "avx512f": True, "avx512bw": True, "avx512_vnni": True,
                         "avx512_bf16": True, "amx_tile": False}
    assert cpu.summary == "AMD EPYC 9R14 96-Core Processor (avx2 fma avx512f avx512bw avx512_vnni avx512_bf16; no amx_tile)"
    assert cpu.to_dict() == {"model_name": cpu.model_name, "flags": cpu.flags}
    empty = parse_cpuinfo("")  # no /proc/cpuinfo (macOS), or an ARM text without the x86 fields
    assert empty.model_name == "unknown" and not any(empty.flags.values()) and list(empty.flags) == list(REPORTED_FLAGS)


def test_cmake_args_turn_on_only_what_the_cpu_has():
    assert llama_cpp_cmake_args(parse_cpuinfo(SAMPLE_CPUINFO).all_flags) == (
        "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON "
        "-DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX512_VBMI=ON")
    assert llama_cpp_cmake_args(parse_cpuinfo(AVX2_ONLY).all_flags) == (
        "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON")
    assert llama_cpp_cmake_args(set()) == "-DGGML_NATIVE=OFF"


def test_prefill_tokens_per_s_uses_the_own_timer_when_there_is_one():
    # ours: 512 tokens in 0.25 s and 0.75 s TTFT -> 1024 tokens / 1.0 s; llama.cpp: eval 0.2 s + 0.3 s, TTFT longer.
    ours = summarize_prefill("link", [PrefillRecord(512, 0.25), PrefillRecord(512, 0.75)])
    assert ours["prefill_tokens_per_s"] == pytest.approx(1024.0) == ours["ttft_prefill_tokens_per_s"]
    assert ours["timer"] == "ttft" and ours["mean_prompt_tokens"] == 512 and ours["num_requests"] == 2
    assert ours["ttft_p50_s"] == pytest.approx(0.5) and ours["ttft_p99_s"] == pytest.approx(0.25 + 0.99 * 0.5)
    theirs = summarize_prefill("llama-cpp", [PrefillRecord(512, 0.30, eval_s=0.2), PrefillRecord(512, 0.40, eval_s=0.3)])
    assert theirs["prefill_tokens_per_s"] == pytest.approx(1024 / 0.5) and theirs["timer"] == "own prompt-eval timer"
    assert theirs["ttft_prefill_tokens_per_s"] == pytest.approx(1024 / 0.7)
    assert summarize_prefill("x", [PrefillRecord(10, 1.0), PrefillRecord(10, 1.0, 0.5)])["timer"] == "mixed"
    with pytest.raises(ValueError):
        PrefillRecord(512, 0.0)
    with pytest.raises(ValueError):
        summarize_prefill("link", [])


def test_long_prompts_are_cut_to_size_from_disjoint_texts():
    render = lambda text: [len(word) for word in text.split()]  # noqa: E731  one token per word
    texts = ["a bb ccc", "dddd eeeee", "f g h i j k", "l m", "n o p q"]
    prompts, used = long_prompts(render, texts, num_prompts=2, num_tokens=4)
    assert prompts == [[1, 2, 3, 4], [1, 1, 1, 1]] and used == 3  # texts 0-1 joined, then text 2 alone
    with pytest.raises(ValueError, match="ran out"):
        long_prompts(render, texts, num_prompts=3, num_tokens=20)


def _result() -> dict:
    # link: c=1 one token every 20 ms after 50 ms; c=4 four times the throughput. llama.cpp: every 10 ms after 40 ms.
    ours = [TimedRequest(30, 11, 0.05, 0.02, 0.25) for _ in range(4)]
    theirs = [TimedRequest(30, 11, 0.04, 0.01, 0.14) for _ in range(4)]
    rows = [summarize("link", 1, ours, wall_s=1.0, peak_rss_mb=600.0), summarize("link", 4, ours, wall_s=0.25, peak_rss_mb=650.0),
            summarize("llama-cpp", 1, theirs, wall_s=0.56, peak_rss_mb=200.0)]
    prefill = [summarize_prefill("link", [PrefillRecord(512, 0.5)]), summarize_prefill("llama-cpp", [PrefillRecord(512, 0.3, 0.25)])]
    memory = {"method": "VmHWM", "link": {"peak_rss_mb": 650.0, "resident_weight_bytes": 540 * 2**20},
              "llama-cpp": {"peak_rss_mb": 200.0, "gguf_bytes": 270 * 2**20, "n_ctx": 4096}}
    result = {"model": "m", "dtype": "float32", "num_prompts": 4, "max_tokens": 11, "machine": {"cpu_count": 2, "load_average_before": [0.5]},
              "cpu": parse_cpuinfo(SAMPLE_CPUINFO).to_dict(), "rows": rows, "prefill": prefill, "memory": memory,
              "warmup": [{"concurrency": 1, "num_requests": 9, "itl_p50_s": 0.03, "itl_p99_s": 0.09}], "warmup_s": 5, "fresh": True,
              "skipped": {}, "errors": {}, "ratios": compute_ratios(rows)}
    result["comparison"] = compare_with_llama_cpp(result)
    return result


def test_comparison_ratios_are_ours_over_llama_cpp():
    lines = {line["metric"]: line for line in _result()["comparison"]}
    decode = lines["decode tok/s per stream (c=1)"]
    assert (decode["link"], decode["llama-cpp"], decode["better"]) == (pytest.approx(50.0), pytest.approx(100.0), "higher")
    assert decode["ratio"] == pytest.approx(0.5)
    # 44 tokens in 0.25 s against 44 in 0.56 s
    assert lines["output tok/s, link c=4 vs llama.cpp one at a time"]["ratio"] == pytest.approx(0.56 / 0.25)
    assert lines["output tok/s, link c=1 vs llama.cpp one at a time"]["ratio"] == pytest.approx(0.56 / 1.0)
    assert lines["prefill tok/s (512-token prompts)"]["ratio"] == pytest.approx((512 / 0.5) / (512 / 0.25))
    assert lines["prefill TTFT p50 (512-token prompts)"]["ratio"] == pytest.approx(0.5 / 0.3)
    assert lines["ITL p50 (c=1)"]["link"] == pytest.approx(20.0) and lines["ITL p99 (c=1)"]["ratio"] == pytest.approx(2.0)
    assert lines["TTFT p50 (c=1)"]["ratio"] == pytest.approx(50 / 40) and lines["TTFT p50 (c=1)"]["better"] == "lower"
    assert lines["peak RSS of the process"]["ratio"] == pytest.approx(3.25)
    weights = lines["weights (ours resident; llama.cpp: the GGUF it maps)"]
    assert (weights["link"], weights["llama-cpp"], weights["ratio"]) == (pytest.approx(540.0), pytest.approx(270.0), pytest.approx(2.0))


def test_comparison_is_empty_without_both_systems_and_keeps_missing_values():
    result = _result()
    assert compare_with_llama_cpp({**result, "rows": [r for r in result["rows"] if r["system"] == "link"], "prefill": []}) == []
    lines = {line["metric"]: line for line in compare_with_llama_cpp({**result, "memory": {}})}
    assert lines["peak RSS of the process"] == {"metric": "peak RSS of the process", "unit": "MiB", "link": None,
                                                "llama-cpp": None, "ratio": None, "better": "lower"}


def test_report_shows_cpu_prefill_warmup_and_the_ratio_column():
    console = Console(width=250, record=True)
    console.print(render_report(_result()))
    text = console.export_text()
    assert "CPU: AMD EPYC 9R14 96-Core Processor; has avx2 fma avx512f avx512bw avx512_vnni avx512_bf16; lacks amx_tile" in text
    assert "ours / llama.cpp" in text and "0.50x" in text and "3.25x" in text  # decode and RSS ratios
    assert "Prefill: long prompts" in text and "own prompt-eval timer" in text and "2048.0" in text  # llama.cpp: 512 / 0.25 s
    assert "warm-up (fresh LINK_HOME)" in text and "90.0" in text  # warm-up ITL p99 90 ms next to 20 ms after
