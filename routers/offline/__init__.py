"""Routers offline: recorded outcomes (`data.py`), calibration of the decision rule's knob (`calibration.py`),
evaluation of routers, baselines, cascades and hybrids on held-out prompts (`settings.py`, `evaluate.py`,
`measure.py`, `cascade_eval.py`, `crossval.py`), their metrics (`metrics.py`) and plots (`plot.py`), and
`pipeline.py`, the library side of `link router train|calibrate|add-model|eval`. The gateway never imports
this package at serving time; everything here reads recorded outcome tables.
"""
