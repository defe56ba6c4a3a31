"""Fitting the engine to its traffic: record request shapes, replay them against an engine, search
engine configs for the best throughput under a latency bound, and swap the config of a running engine.
"""
