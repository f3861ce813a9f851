"""Package attributes imported on first use (PEP 562), for packages whose modules load TensorFlow."""

import importlib


def lazy_getattr(package, names, namespace):
    """A module `__getattr__` that imports `names[attr]` (a module path) when `attr` is first read.

    The value is stored in `namespace` (the package's `globals()`), so later reads are plain
    attribute lookups.
    """

    def __getattr__(name):
        if name in names:
            value = getattr(importlib.import_module(names[name]), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
