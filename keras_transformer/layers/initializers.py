"""Initializer copies for sub-layers."""

import keras


def clone_initializer(initializer):
    """A fresh copy, so sub-layers never share one seeded initializer object."""
    initializer = keras.initializers.get(initializer)
    return initializer.__class__.from_config(initializer.get_config())
