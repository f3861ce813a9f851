"""Training: the paper's recipe (optimizer, schedule, loss, metrics), callbacks,
checkpoints, precision and the whole run from a TOML config.

`compile`, `schedules`, `losses`, `metrics` and `precision` use keras only and run on
every backend; `run` (the run from corpus to model directory), `callbacks` and
`checkpoints` also read data and translate, so they are imported by name, not here.
"""
