"""The built-in suites; each module defines one `Suite` subclass (see `evals.base.SUITES`)."""
