"""Capturing Keras code on PyTorch as an aten graph: `torch.export`, non-strict, then cleaned.

`torch.compile` of Keras' layers breaks its graph inside Keras (NumPy dtype reads in
`convert_to_tensor`, iterators in the tree utilities, `SDPAParams`) and recompiles shared
code per layer. `torch.export` in its non-strict mode instead *runs* the Python once with
fake tensors and records only the aten ops, so Keras' Python costs nothing afterwards.
The captured function must take every changing value as an input (weights through
`keras.StatelessScope`): a tensor it merely reads while tracing becomes a constant.
Used by `train.torch_step` (training) and `inference.torch_decode_step` (decoding).
"""

import torch

from keras_transformer import checks

# Graph nodes that are no-ops at run time: Keras' `convert_to_tensor` records a dtype
# assertion and a same-dtype `.to` for each tensor it touches (the tiny model's graph has
# 1,706 nodes before this pass, 549 after).
_ASSERT_OPS = (torch.ops.aten._assert_tensor_metadata.default,)
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


def capture(module, arguments):
    """`module(*arguments)` as a `torch.fx.GraphModule` of aten ops, no-op nodes removed.

    Host reads of values (the id checks) are off while tracing: fake tensors have none.
    """
    with checks.no_host_reads():
        program = torch.export.export(module, tuple(arguments), strict=False)
    return strip_noop_nodes(program.module())
