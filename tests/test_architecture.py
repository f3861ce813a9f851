"""The package's import graph: no cycles, and each layer imports only those below it.

Read statically with `ast` from `keras_transformer/**/*.py`: every `import` and
`from ... import` of a package module, at module level or inside a function (a lazy
import is still a dependency: it runs on first use), and `importlib.import_module`
of a literal name. An edge goes to the module named, or, for `from package import
name` where `name` is not a submodule, to the package's `__init__`. Importing a
submodule also runs its parents' `__init__`; that edge is left out, or the top-level
package, which imports the public names, would close a cycle with every module.
Nothing is imported, so the checks run in milliseconds on any backend.
"""

import ast
import glob
import os

PACKAGE = "keras_transformer"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The layers from the bottom up: a subpackage may not import these (lazily or not).
# `model.directory` may load a directory's tokenizer (`data`, `marian`); training may
# translate (validation BLEU, `inference`); nothing below `cli` imports a command.
FORBIDDEN = {
    "layers": ("model", "data", "train", "inference", "marian", "cli"),
    "model": ("train", "inference", "cli"),
    "data": ("model", "train", "inference", "marian", "cli"),
    "marian": ("train", "inference", "cli"),
    "inference": ("train", "cli"),
    "train": ("cli",),
}
# Modules that hold names defined once (file names, input names, paper constants) so
# that any layer may import them: they import no package module at all.
LEAVES = ("file_names", "input_names", "interrupts", "search_defaults", "special_tokens", "version")


def _module_name(path):
    relative = os.path.relpath(path, ROOT)[: -len(".py")].replace(os.sep, ".")
    return relative.removesuffix(".__init__")


def _modules():
    """{module name: path} of every module of the package, packages as their `__init__`."""
    paths = glob.glob(os.path.join(ROOT, PACKAGE, "**", "*.py"), recursive=True)
    return {_module_name(path): path for path in paths}


def _imported_names(module, path):
    """(dotted name, line) for each import in the file, relative imports resolved."""
    with open(path, encoding="utf-8") as file:
        tree = ast.parse(file.read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parent + ([node.module] if node.module else []))
            for alias in node.names:
                yield f"{base}.{alias.name}", node.lineno  # a submodule, or a name in `base`
        elif (
            isinstance(node, ast.Call)
            and ast.unparse(node.func) in ("importlib.import_module", "import_module")
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            yield node.args[0].value, node.lineno


def _import_graph():
    """{module: {imported package module: first line}}."""
    modules = _modules()
    graph = {}
    for module, path in modules.items():
        edges = {}
        for name, line in _imported_names(module, path):
            while name and name not in modules:  # `a.b.name` where `name` is no module: `a.b`
                name = name.rpartition(".")[0]
            if name and name != module:
                edges.setdefault(name, line)
        graph[module] = edges
    return graph


def _find_cycle(graph):
    """One cycle as a list of modules `[a, b, ..., a]`, or None."""
    state = {}  # module -> "open" while on the path, "done" once every path from it is checked
    path = []

    def visit(module):
        state[module] = "open"
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[module] = "done"
        path.pop()
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def _describe(cycle, graph):
    return " -> ".join(
        f"{module} (line {graph[module][target]})" for module, target in zip(cycle, cycle[1:])
    ) + f" -> {cycle[-1]}"


def test_the_graph_is_read_whole():
    """The reader finds what it must: lazy imports, relative imports, `from package import name`."""
    graph = _import_graph()
    assert len(graph) > 50
    # a lazy import inside a function
    assert "keras_transformer.data.tokenizer" in graph["keras_transformer.model.directory"]
    # `from keras_transformer.model import TransformerConfig` is an edge to the package
    assert "keras_transformer.model" in graph["keras_transformer"]
    # `from keras_transformer.layers import masks` is an edge to the submodule
    assert "keras_transformer.layers.masks" in graph["keras_transformer.layers"]


def test_find_cycle_reports_the_path():
    graph = {"a": {"b": 3}, "b": {"c": 5}, "c": {"a": 7}, "d": {"a": 1}}
    cycle = _find_cycle(graph)
    assert cycle == ["a", "b", "c", "a"]
    assert _describe(cycle, graph) == "a (line 3) -> b (line 5) -> c (line 7) -> a"
    assert _find_cycle({"a": {"b": 1}, "b": {}, "c": {"a": 2, "b": 3}}) is None


def test_no_import_cycles():
    graph = _import_graph()
    cycle = _find_cycle(graph)
    assert cycle is None, f"import cycle: {_describe(cycle, graph)}"


def test_each_layer_imports_only_those_below_it():
    graph = _import_graph()
    wrong = []
    for module, edges in sorted(graph.items()):
        parts = module.split(".")
        forbidden = FORBIDDEN.get(parts[1], ()) if len(parts) > 1 else ()
        for target, line in sorted(edges.items()):
            target_parts = target.split(".")
            if len(target_parts) > 1 and target_parts[1] in forbidden:
                wrong.append(f"{module} (line {line}) imports {target}")
    assert not wrong, "imports of a higher layer:\n" + "\n".join(wrong)


def test_leaf_modules_import_no_package_module():
    graph = _import_graph()
    leaves = {f"{PACKAGE}.{name}": graph[f"{PACKAGE}.{name}"] for name in LEAVES}
    assert leaves == {name: {} for name in leaves}
