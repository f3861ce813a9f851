"""The package's version, `keras_transformer.__version__`, in a leaf module.

Kept out of `__init__` so that a module that records it (a preset's metadata) need not
import the top-level package, which imports every public name.
"""

__version__ = "0.4.0"  # the same as pyproject.toml's
