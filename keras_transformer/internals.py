"""The one place that reads private attributes of Keras, PyTorch and tensorflow-text.

Each accessor says why the public API does not do, and what the public alternative is
where one exists. None of them hides a rename behind a default: an attribute that a
new version moved raises `InternalsError`, naming the attribute and the installed
version, at the first use (and `tests/test_internals.py` touches every accessor, so
the suite of a new version fails on it first). PyTorch and TensorFlow are imported
only inside the accessors that need them, so this module imports under every backend.
"""

import sys


class InternalsError(RuntimeError):
    """A private attribute this package reads is not where it was: the library changed it.

    Not an AttributeError: a `hasattr` or `getattr(..., default)` up the stack would
    swallow that, and hide the rename this error exists to show.
    """


def _version(library):
    module = sys.modules.get(library)
    return getattr(module, "__version__", "unknown") if module is not None else "not imported"


def _missing(owner, name, library, error):
    return InternalsError(
        f"keras_transformer reads {type(owner).__name__}.{name} of {library}, which "
        f"{library} {_version(library)} does not have ({error}). keras_transformer.internals "
        "lists what it reads and why; this version of the library needs a new accessor there."
    )


def _read(owner, name, library):
    """`owner.<name>`, or InternalsError naming the library's version (never a silent default)."""
    try:
        return getattr(owner, name)
    except AttributeError as error:
        raise _missing(owner, name, library, error) from error


# Keras


def variable_tensors(variables):
    """The backend tensors that hold `variables`' values (PyTorch: a captured graph's inputs).

    Public alternative: `variable.value`, which first looks for a `StatelessScope` and an
    autocast scope at every read, and a captured step reads every weight, every step; no
    scope is open between layer calls, so the stored `_value` is read directly there. A
    variable not yet initialized (`_value` None) goes through `value`.
    """
    try:
        return [variable.value if variable._value is None else variable._value for variable in variables]
    except AttributeError as error:
        raise _missing(variables[0], "_value", "keras", error) from error


def loss_tracker(model):
    """The `Mean` metric that a compiled Keras model's "loss" log reads (`model._loss_tracker`).

    A step written outside Keras' trainer (the captured PyTorch step) must update it as
    Keras' own `train_step` does. Public alternative: none (`model.metrics` lists it
    among the others, without saying which one it is).
    """
    return _read(model, "_loss_tracker", "keras")


def initial_epoch(model):
    """The epoch `fit` starts at: 0, or the one `BackupAndRestore` restored (`model._initial_epoch`).

    In a run over several processes only the chief reads the backup, and the others must
    start at its epoch. Public alternative: none (`fit`'s `initial_epoch` argument is read
    before the callbacks' `on_train_begin`, where `BackupAndRestore` sets this).
    """
    return int(_read(model, "_initial_epoch", "keras") or 0)


def set_initial_epoch(model, epoch):
    """Makes `fit` start at `epoch` (an int), as `BackupAndRestore` does when it restores.

    For the processes that did not restore (see `initial_epoch`); called in `on_train_begin`.
    """
    _read(model, "_initial_epoch", "keras")
    model._initial_epoch = epoch or None


def learning_rate_object(optimizer):
    """What the optimizer was given as its learning rate: the schedule object, or its variable.

    Public alternative: `optimizer.learning_rate`, which is the current *value* (the
    schedule called at the current step), not the schedule whose Python attributes a
    captured update bakes in (`total_steps`) and a callback changes.
    """
    return _read(optimizer, "_learning_rate", "keras")


def construction_strategy(model):
    """The `tf.distribute` strategy a model was made under on TensorFlow, or None (Keras' TF trainer).

    Public alternative: `model.distribute_strategy`, which gives the default strategy
    when there was none, so it cannot say whether the model was made under one.
    """
    return _read(model, "_distribute_strategy", "keras")


def all_layers(model):
    """Every layer inside `model`, nested ones included, the model itself excluded.

    Public alternative: `model.layers`, one level only; Keras has no public recursive walk.
    """
    return list(_read(model, "_flatten_layers", "keras")(include_self=False))


def replace_dtype_policy(layer, policy):
    """Gives `layer` the policy `policy` in place of whatever it holds, a `DTypePolicyMap` included.

    Public alternative: the `layer.dtype_policy` setter, which, when the layer holds a
    map, writes `policy` into the map under the layer's path instead of replacing it.
    """
    _read(layer, "_dtype_policy", "keras")
    layer._dtype_policy = policy


def stored_kernel(dense):
    """A `Dense` layer's kernel as stored: the int8 values of a quantized one, without LoRA.

    Public alternative: `dense.kernel`, which adds the LoRA term when LoRA is on, cast to
    the kernel's dtype: int8 for a quantized layer, where the term would be rounded away.
    """
    return _read(dense, "_kernel", "keras")


# PyTorch


def assert_tensor_metadata_op():
    """The aten overload Keras' `convert_to_tensor` records as a dtype check in a captured graph.

    Removed from captured graphs as a no-op at run time. Public alternative: none (aten's
    underscore ops are internal to PyTorch).
    """
    import torch

    return _read(torch.ops.aten, "_assert_tensor_metadata", "torch").default


def foreach_copy(destinations, sources):
    """`destination.copy_(source)` for each pair, as one fused op (`torch._foreach_copy_`).

    Public alternative: a loop of `copy_`, one kernel a tensor; inside a compiled
    optimizer update the foreach form becomes one fused copy.
    """
    import torch

    _read(torch, "_foreach_copy_", "torch")(destinations, sources)


# JAX


def jax_distributed_client():
    """This process's client of JAX's distributed runtime, or None before `jax.distributed.initialize`.

    Its key-value store is how a process that raises tells the others at once
    (`jax_processes.report_failure`), instead of their waiting for the heartbeat to miss
    it. JAX keeps the client in a private module (`jax._src.distributed.global_state`).
    Public alternative: none (`jax.experimental.multihost_utils` offers collectives, which
    a failed process cannot join).
    """
    try:
        from jax._src import distributed
    except ImportError as error:
        raise InternalsError(
            f"keras_transformer reads jax._src.distributed, which jax {_version('jax')} does not have ({error}). "
            "keras_transformer.internals lists what it reads and why."
        ) from error
    return _read(_read(distributed, "global_state", "jax"), "client", "jax")


# tensorflow-text


def replace_sentencepiece_resource(tokenizer, resource):
    """Makes a `tensorflow_text.SentencepieceTokenizer` run on `resource` instead of its own.

    tf-text's ops read the model through the tokenizer's `_model_resource`, which it
    creates private to an eager kernel; `data.tokenizer` replaces it by a resource under
    a shared name, which a seed reset cannot delete (`data.tokenizer` says more). Checked first,
    so that a tf-text that reads another attribute fails here instead of losing the
    replacement silently. Public alternative: none.
    """
    _read(tokenizer, "_model_resource", "tensorflow_text")
    tokenizer._model_resource = resource


__all__ = [
    "InternalsError",
    "all_layers",
    "assert_tensor_metadata_op",
    "construction_strategy",
    "foreach_copy",
    "initial_epoch",
    "jax_distributed_client",
    "learning_rate_object",
    "loss_tracker",
    "replace_dtype_policy",
    "replace_sentencepiece_resource",
    "set_initial_epoch",
    "stored_kernel",
    "variable_tensors",
]
