"""Performance measurement, in one place.

Two kinds of file live here:

- standalone scripts, run from the repository root (`python benchmarks/bench_generate.py`, `routing_eval.py`,
  `gpu_kernels.py`, ...): each opens with how to run it and what it measures;
- the library behind `link bench` and `link compile`, imported by cli/ and by those scripts:
  `link_bench/` (`link bench serving|gateway`: workloads, servers in pinned subprocesses, load generation,
  reports), `kernel_tuning.py` (`link compile tune`: record a model's shapes on the serving workload, tune
  the kernel variants of its hot buckets) and `config_tuning.py` (`link compile tune-config`: replay a traffic
  mix and keep the engine configuration that serves it best).

Scripts put the repository root first on `sys.path`, so they import `benchmarks.*` like any package. No module
here may share a name with a top-level package (`serving`, `link`, ...): a script's own folder is on `sys.path`
too, and would shadow it.
"""
