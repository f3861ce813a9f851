"""Capturing Keras code on PyTorch as an aten graph: `torch.export`, non-strict, then cleaned.

`torch.compile` of Keras' layers breaks its graph inside Keras (NumPy dtype reads in
`convert_to_tensor`, iterators in the tree utilities, `SDPAParams`) and recompiles shared
code per layer. `torch.export` in its non-strict mode instead *runs* the Python once with
fake tensors and records only the aten ops, so Keras' Python costs nothing afterwards.
The captured function must take every changing value as an input (weights through
`keras.StatelessScope`): a tensor it merely reads while tracing becomes a constant.
Used by `train.torch_step` (training), `train.torch_optimizer_update` and
`inference.torch_decode_step` (decoding), each keeping its graphs in a
`graph_cache.GraphCache`.
"""

import os

import torch

from keras_transformer import checks, internals

# The `torch.compile` backend of the compiled paths (`jit_compile=True`'s training step,
# a recurring decoding shape): inductor unless this environment variable names another
# ("aot_eager" runs dynamo and AOTAutograd without inductor's C++ build: the test suite
# sets it, and a machine without a C++ compiler may).
COMPILER_VARIABLE = "KERAS_TRANSFORMER_TORCH_COMPILER"
DEFAULT_COMPILER = "inductor"


def default_compiler():
    """The `torch.compile` backend for compiled graphs: `$KERAS_TRANSFORMER_TORCH_COMPILER`, or inductor."""
    compiler = os.environ.get(COMPILER_VARIABLE, DEFAULT_COMPILER)
    backends = torch.compiler.list_backends(exclude_tags=())
    if compiler not in backends:
        raise ValueError(
            f"{COMPILER_VARIABLE} must name a torch.compile backend, one of {sorted(backends)}. "
            f"Received: {COMPILER_VARIABLE}={compiler!r}"
        )
    return compiler


# Graph nodes that are no-ops at run time: Keras' `convert_to_tensor` records a dtype
# assertion and a same-dtype `.to` for each tensor it touches (most of a captured
# graph's nodes before this pass).
_ASSERT_OPS = (internals.assert_tensor_metadata_op(),)
_TO_OPS = (torch.ops.aten.to.dtype_layout, torch.ops.aten.to.dtype, torch.ops.aten.to.device)


def _is_noop_to(node):
    """True for a `.to` node whose output has its input's dtype, device and layout."""
    source = node.args[0]
    if not isinstance(source, torch.fx.Node):
        return False
    before, after = source.meta.get("val"), node.meta.get("val")
    if before is None or after is None:
        return False
    return before.dtype == after.dtype and before.device == after.device and before.layout == after.layout


def strip_noop_nodes(graph_module):
    """Removes dtype assertions and same-dtype casts from `graph_module`; returns it."""
    graph = graph_module.graph
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target in _ASSERT_OPS:
            graph.erase_node(node)
        elif node.target in _TO_OPS and _is_noop_to(node):
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
    graph.eliminate_dead_code()
    graph_module.recompile()
    return graph_module


class DataDependentError(RuntimeError):
    """The traced Python read a tensor's value (`.item()`, `int()`, `if tensor:`): a graph cannot.

    Raised from PyTorch's `GuardOnDataDependentSymNode`, whose message `torch.export`
    replaces by a pointer to `draft_export`; this one keeps what the tracer said.
    """

    def __init__(self, error):
        said = str(getattr(error, "cond", "") or "")  # the condition, or Keras' re-raised message
        super().__init__(
            "the traced code reads a tensor's value on the host (`.item()`, `float()`, an `if` "
            f"on a tensor), which a graph cannot hold\n{said}".strip()
        )


def capture(module, arguments):
    """`module(*arguments)` as a `torch.fx.GraphModule` of aten ops, no-op nodes removed.

    Host reads of values (the id checks) are off while tracing: fake tensors have none.
    The result has no input checks: its callers key each graph by its inputs' shapes and
    dtypes themselves (`graph_cache.input_key`), and `ExportedProgram.module()`'s checks
    walk every input's pytree at every call, a cost as large as a small step's arithmetic.
    """
    with checks.no_host_reads():
        try:
            program = torch.export.export(module, tuple(arguments), strict=False)
        except torch.fx.experimental.symbolic_shapes.GuardOnDataDependentSymNode as error:
            raise DataDependentError(error) from error
    try:
        checked = program.module(check_guards=False)
    except TypeError:  # a PyTorch before `check_guards`: the same graph, its checks kept
        checked = program.module()
    # A plain GraphModule of the same graph and constants, without the checking hooks.
    return strip_noop_nodes(torch.fx.GraphModule(checked, checked.graph))


def compile_graph(function, compiler):
    """`torch.compile(function)` with `compiler` as the backend, for a graph its caller keys.

    Our callers hold one compiled function per key they check themselves (the inputs'
    shapes, dtypes and devices for a step's graph; the variables for the optimizer's
    update), so dynamo's guards, which check the same things again at every call, are
    dropped. Without guards, a compiled entry must
    never serve another function object of the same code (the optimizer update's closure
    is one code object for every model): `isolate_recompiles` keeps each call's entries
    its own. `fullgraph`: a captured aten graph has nothing to break on, and a break would
    be a bug to see, not to run around. A PyTorch without `isolate_recompiles` keeps the
    guards: slower, never wrong.
    """
    if not _can_drop_guards():
        return torch.compile(function, backend=compiler, dynamic=False, fullgraph=True)
    return torch.compile(
        function,
        backend=compiler,
        dynamic=False,
        fullgraph=True,
        isolate_recompiles=True,
        options={"guard_filter_fn": torch.compiler.skip_all_guards_unsafe},
    )


def _can_drop_guards():
    """Whether this PyTorch has both what `compile_graph` needs to drop guards safely."""
    import inspect

    return hasattr(torch.compiler, "skip_all_guards_unsafe") and (
        "isolate_recompiles" in inspect.signature(torch.compile).parameters
    )

