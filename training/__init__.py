"""`python -m training.<command>` from a clone of the repository: thin entry points.

Each module runs the `main` of `keras_transformer.cli.<command>`, the same function the
installed `kt-<command>` console script runs. The TOML run configs live in `configs/`.
This folder is not installed: a pip install puts only `keras_transformer` into
site-packages.
"""
