"""Argument checks shared by the whole package, written once.

Messages follow Keras core: they name the argument and the value received
("`num_heads` must be a positive integer. Received: num_heads=0"). Types are strict:
a bool is not an int (True would otherwise pass as 1), and numbers must be finite
(NaN compares false with everything, so a range check alone lets it through).
"""

import contextlib
import dataclasses
import math
import numbers
import sys
import threading
import typing

import numpy as np


def is_int(value):
    """True for an int that is not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value):
    """True for a finite int or float that is not a bool."""
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


def same_objects(first, second):
    """Whether two sequences hold the same objects in the same order.

    By identity: `==` on Keras variables or tensors compares their values elementwise.
    """
    return len(first) == len(second) and all(a is b for a, b in zip(first, second))


def check_positive_int(name, value):
    """Raises ValueError unless `value` is an int > 0."""
    if not is_int(value) or value <= 0:
        raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")


def check_non_negative_int(name, value):
    """Raises ValueError unless `value` is an int >= 0."""
    if not is_int(value) or value < 0:
        raise ValueError(f"`{name}` must be an integer >= 0. Received: {name}={value!r}")


def check_rate(name, value):
    """Raises ValueError unless `value` is a number in [0, 1) (a dropout or smoothing rate)."""
    if not is_number(value) or not 0.0 <= value < 1.0:
        raise ValueError(f"`{name}` must be a number in [0, 1). Received: {name}={value!r}")


def check_positive_number(name, value):
    """Raises ValueError unless `value` is a finite number > 0."""
    if not is_number(value) or value <= 0:
        raise ValueError(f"`{name}` must be a finite number > 0. Received: {name}={value!r}")


def check_non_negative_number(name, value):
    """Raises ValueError unless `value` is a finite number >= 0."""
    if not is_number(value) or value < 0:
        raise ValueError(f"`{name}` must be a finite number >= 0. Received: {name}={value!r}")


def check_bool(name, value):
    """Raises ValueError unless `value` is True or False."""
    if not isinstance(value, bool):
        raise ValueError(f"`{name}` must be True or False. Received: {name}={value!r}")


def is_concrete(value):
    """True for a tensor whose values can be read now, False for one being traced.

    NumPy arrays, lists, eager TensorFlow tensors, JAX arrays and torch tensors are
    concrete; inside `tf.function`, `jax.jit` (so inside compiled `fit` and `predict`)
    and Keras' symbolic build they are not, and a value check must be done in the graph
    or at the data boundary instead.
    """
    if isinstance(value, (np.ndarray, list, tuple, numbers.Number)):
        return True
    if getattr(_host_reads, "disabled", False) or _torch_is_compiling():
        return False
    cls = type(value)
    module, name = cls.__module__, cls.__name__
    return (
        name == "EagerTensor"
        or (module.startswith("jaxlib") and name == "ArrayImpl")
        or (module.startswith("torch") and name == "Tensor")
    )


_host_reads = threading.local()
_host_reads.disabled = False


@contextlib.contextmanager
def no_host_reads():
    """Within it, `is_concrete` says False for device tensors: their checks are left to the graph.

    A training step runs inside it. On PyTorch's eager step every value check would
    otherwise copy a device tensor to the host, a sync that stalls a GPU's queue each
    step; the same guarantee holds without it (an out-of-range id or label makes the
    loss NaN, and `StopOnNaN` stops the run saying why), as inside compiled steps.
    NumPy inputs are still checked, where reading them costs nothing.
    """
    before = getattr(_host_reads, "disabled", False)
    _host_reads.disabled = True
    try:
        yield
    finally:
        _host_reads.disabled = before


def _torch_is_compiling():
    """True while dynamo traces; read from `sys.modules` so this module never imports torch."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.compiler.is_compiling()


def check_ids_in_range(
    name, ids, vocab_size, ignore_id=None, *, what="id", hint="Were they made with another vocabulary?"
):
    """Raises ValueError unless every entry of `ids` (NumPy) is in [0, vocab_size) or is `ignore_id`.

    The message names the first bad id and its position, for labels and token ids alike
    (`what` names one entry, `hint` ends the message).
    """
    ids = np.asarray(ids)
    bad = (ids < 0) | (ids >= vocab_size)
    if ignore_id is not None:
        bad &= ids != ignore_id
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        allowed = "" if ignore_id is None else f" (or ignore_id={ignore_id})"
        raise ValueError(
            f"`{name}` holds {what} {int(ids[where])} at position {where}, outside "
            f"[0, vocab_size={vocab_size}){allowed}. {hint}"
        )


def check_choice(name, value, choices):
    """Raises ValueError unless `value` is one of `choices` (compared by type too: 1 is not True)."""
    if not any(value == choice and type(value) is type(choice) for choice in choices):
        raise ValueError(f"`{name}` must be one of {tuple(choices)}. Received: {name}={value!r}")


def check_type(name, value, annotation):
    """Raises ValueError unless `value` has the dataclass field type `annotation`.

    `annotation` is bool, int, float, str, dict or `Optional` of one of them; ints are
    accepted for float, bools for nothing but bool, and floats must be finite.
    """
    optional = typing.get_origin(annotation) is typing.Union
    if optional:
        if value is None:
            return
        annotation = next(arg for arg in typing.get_args(annotation) if arg is not type(None))
    checks = {
        dict: lambda v: isinstance(v, dict),
        bool: lambda v: isinstance(v, bool),
        int: is_int,
        float: is_number,
        str: lambda v: isinstance(v, str),
    }
    if not checks[annotation](value):
        expected = annotation.__name__ + (" or None" if optional else "")
        if annotation is float:
            expected = "finite " + expected
        raise ValueError(
            f"`{name}` must be of type {expected}. Received: {name}={value!r} "
            f"(type {type(value).__name__})"
        )


def check_dataclass_fields(instance):
    """`check_type` on every field of a dataclass instance (for `__post_init__`)."""
    for field in dataclasses.fields(instance):
        check_type(field.name, getattr(instance, field.name), field.type)


def check_known_keys(what, values, cls):
    """Raises ValueError naming the keys of `values` that are not fields of dataclass `cls`.

    `what` names one key in the message: "Unknown {what}(s): [...]".
    """
    known = {field.name for field in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"Unknown {what}(s): {unknown}. Expected some of: {sorted(known)}")


__all__ = [
    "is_int",
    "is_number",
    "check_positive_int",
    "check_non_negative_int",
    "check_rate",
    "check_positive_number",
    "check_non_negative_number",
    "check_bool",
    "is_concrete",
    "check_ids_in_range",
    "check_choice",
    "check_type",
    "check_dataclass_fields",
    "check_known_keys",
]
