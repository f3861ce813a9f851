"""Argument checks and small helpers shared by the layers.

Messages follow Keras core: they name the argument and the value received.
"""

import keras


def check_positive_int(name, value):
    """Raises ValueError unless `value` is an int > 0 (bools are refused)."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")


def check_rate(name, value):
    """Raises ValueError unless `value` is a number in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"`{name}` must be a number in [0, 1). Received: {name}={value!r}")


def clone_initializer(initializer):
    """A fresh copy, so sub-layers never share one seeded initializer object."""
    initializer = keras.initializers.get(initializer)
    return initializer.__class__.from_config(initializer.get_config())
