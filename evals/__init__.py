"""Benchmark suites, graders, runners and reports behind `link eval`. (Built in the evals issue.)"""
