"""The console's pages, one module per section: policies, models, traffic, evals, keys."""
