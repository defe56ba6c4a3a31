"""The CPU a benchmark ran on, from /proc/cpuinfo, and the llama.cpp build flags it supports.

    cpu = read_cpu_info()                    # CpuInfo(model_name="AMD EPYC ...", flags={"avx2": True, ...})
    cpu.summary                              # "AMD EPYC ... (avx2 fma avx512f ...; no amx_tile)"
    llama_cpp_cmake_args(cpu.all_flags)      # "-DGGML_NATIVE=OFF -DGGML_AVX=ON ..."
    python benchmarks/link_bench/cpuinfo.py --cmake-args    # what `make install-bench` passes as CMAKE_ARGS (stdlib only)

Why the explicit CMake flags: a `GGML_NATIVE=ON` build (llama-cpp-python's default) asks the compiler to
detect the build machine's CPU, and that build crashed on one of our machines; naming each instruction set
from the kernel's own flag list gives a build that uses what the CPU has and nothing it lacks.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

# The instruction-set extensions that matter for CPU inference, as the Linux kernel spells them in `flags`.
REPORTED_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile")

# (kernel flag, llama.cpp CMake option); every option is ON only when its flag is present.
GGML_OPTIONS = (
    ("avx", "GGML_AVX"), ("avx2", "GGML_AVX2"), ("fma", "GGML_FMA"), ("f16c", "GGML_F16C"),
    ("avx512f", "GGML_AVX512"), ("avx512_vnni", "GGML_AVX512_VNNI"), ("avx512_bf16", "GGML_AVX512_BF16"),
    ("avx512vbmi", "GGML_AVX512_VBMI"),
)


@dataclass(frozen=True)
class CpuInfo:
    """One CPU's name and extensions.

    Attributes:
        model_name: the first `model name` line ("unknown" when there is none, e.g. on ARM).
        flags: each of `REPORTED_FLAGS` -> whether the CPU has it.
        all_flags: every flag the kernel lists for the first processor.
    """

    model_name: str
    flags: dict[str, bool]
    all_flags: frozenset[str]

    @property
    def summary(self) -> str:
        """The name, the reported flags it has, and those it lacks: one line for a report caption."""
        have = " ".join(f for f in REPORTED_FLAGS if self.flags[f]) or "none of the reported flags"
        lack = " ".join(f for f in REPORTED_FLAGS if not self.flags[f])
        return f"{self.model_name} ({have}{'; no ' + lack if lack else ''})"

    def to_dict(self) -> dict:
        return {"model_name": self.model_name, "flags": self.flags}


def parse_cpuinfo(text: str) -> CpuInfo:
    """A `CpuInfo` from the text of /proc/cpuinfo; only the first processor's block is read (they agree on x86)."""
    model_name, flags = "unknown", frozenset()
    for line in text.split("\n\n", 1)[0].splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name":
            model_name = " ".join(value.split())
        elif key == "flags":
            flags = frozenset(value.split())
    return CpuInfo(model_name, {f: f in flags for f in REPORTED_FLAGS}, flags)


def read_cpu_info(path: str | Path = "/proc/cpuinfo") -> CpuInfo:
    """`parse_cpuinfo` of `path`; a CpuInfo named "unknown" with no flags where the file does not exist (macOS)."""
    path = Path(path)
    return parse_cpuinfo(path.read_text()) if path.is_file() else parse_cpuinfo("")


def llama_cpp_cmake_args(flags: frozenset[str] | set[str]) -> str:
    """CMAKE_ARGS for building llama-cpp-python: native detection off, each `GGML_OPTIONS` entry ON whose
    kernel flag is in `flags` (options whose flag is absent are left out, so they keep llama.cpp's OFF)."""
    return " ".join(["-DGGML_NATIVE=OFF"] + [f"-D{option}=ON" for flag, option in GGML_OPTIONS if flag in flags])


def main(argv: list[str] | None = None) -> None:
    """`--cmake-args`: print `llama_cpp_cmake_args` for this machine; otherwise print the summary line."""
    cpu = read_cpu_info()
    print(llama_cpp_cmake_args(cpu.all_flags) if "--cmake-args" in (sys.argv[1:] if argv is None else argv) else cpu.summary)


if __name__ == "__main__":
    main()
