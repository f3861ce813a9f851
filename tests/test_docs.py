"""Every code example in README.md, docs/*.md and saved_models/README.md runs.

Each page's fenced blocks run in order in a working directory of their own, sharing
one Python namespace per page: ```python blocks are executed, and the `kt-*` commands
of ```bash blocks run in this process through the same `main(argv)` the console
scripts call (`python -m training.X` lines too), with `<` and `>` redirections. A block
that cannot run here says why with `<!-- not run: reason -->` above it
(tests/doc_blocks.py has the rules); `test_every_block_runs_or_says_why_not` checks that
no block is left without one or the other.

The working directory holds what the examples read: `saved_models/demo` (the tiny
translation model of tiny_reliability.py, random weights and a real tokenizer, with
two checkpoints added; it stands in for what `make demo` trains, so translations are
nonsense but every call is real), small demo-corpus files (`train.en`, `train.de`,
`test.en`, `test.de`, `sentences.txt`). The examples print what they print; the test
checks that they run, not what the stand-in model translates.

The examples of a page run in one process, so their cost is mostly tracing. They run
under TensorFlow (kt-export and the SavedModel examples need it), except those of
docs/training.md, which train several models, and docs/translating.md, which makes
several translators: they run under PyTorch, eagerly, in the PyTorch session
(`TORCH_PAGES`); the checks of the pages' text run in the TensorFlow
session. Under JAX nothing here runs.
"""

import contextlib
import glob
import io
import importlib
import linecache
import os
import shutil
import sys
import time

import keras
import pytest

BACKEND = keras.backend.backend()
if BACKEND == "jax":
    pytest.skip(
        "the docs examples run once: under KERAS_BACKEND=tensorflow (kt-export and the "
        "SavedModel examples need TensorFlow), docs/training.md's under torch; the other "
        "tests cover JAX",
        allow_module_level=True,
    )

from doc_blocks import (  # noqa: E402
    PYTHON,
    SHELL,
    block_problem,
    extract_blocks,
    relative_links,
    shell_commands,
    tree_paths,
)
from tiny_reliability import tiny_dir  # noqa: E402,F401  (a fixture)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = sorted(os.path.relpath(path, ROOT) for path in glob.glob(os.path.join(ROOT, "docs", "*.md")))
PAGES = ["README.md", *DOCS, os.path.join("saved_models", "README.md")]
NUM_TRAIN_PAIRS = 1000  # enough text for the examples' 400-piece tokenizers
# Pages whose examples run in the PyTorch session: nothing on them needs TensorFlow's
# backend, and eager PyTorch traces nothing, where TensorFlow traces the train step of
# every model the page builds (docs/training.md's took 160 s of the TensorFlow session)
# and compiles a search for every translator and command (docs/translating.md's: 53 s).
TORCH_PAGES = {os.path.join("docs", page) for page in ("training.md", "translating.md", "model.md", "presets.md")}
in_tensorflow_session = pytest.mark.skipif(
    BACKEND != "tensorflow", reason="checks the pages' text: runs once, in the tensorflow session"
)
NUM_TEST_PAIRS = 8


def _blocks(page):
    return extract_blocks(os.path.join(ROOT, page), page)


# ------------------------------------------------------------------ the rules, checked statically
@in_tensorflow_session
def test_every_block_runs_or_says_why_not():
    problems = [problem for page in PAGES for block in _blocks(page) if (problem := block_problem(block))]
    assert not problems, "\n".join(problems)


@in_tensorflow_session
def test_every_command_in_a_run_block_exists():
    """Each `kt-X` or `python -m training.X` of a run block has a keras_transformer/cli module."""
    missing = []
    for page in PAGES:
        for block in _blocks(page):
            if block.lang in SHELL and not block.mark:
                for command in shell_commands(block.text, console=block.lang == "console"):
                    module = os.path.join(ROOT, "keras_transformer", "cli", f"{command.command}.py")
                    if not os.path.isfile(module):
                        missing.append(f"{block.where}: {command.text}")
    assert not missing, "commands without a keras_transformer/cli module:\n" + "\n".join(missing)


@in_tensorflow_session
def test_architecture_page_names_every_module():
    """docs/architecture.md's tree and the modules on disk are the same set.

    A package's `__init__.py` is described by its folder's line, so it may be left out.
    """
    blocks = _blocks(os.path.join("docs", "architecture.md"))
    trees = [b for b in blocks if b.lang == "text" and "keras_transformer/" in b.text]
    assert trees, "docs/architecture.md has no package tree"
    listed = {p for p in tree_paths(trees[0].text) if p.endswith(".py") and not p.endswith("__init__.py")}
    on_disk = {
        os.path.relpath(path, ROOT).replace(os.sep, "/")
        for folder in ("keras_transformer", "training")
        for path in glob.glob(os.path.join(ROOT, folder, "**", "*.py"), recursive=True)
        if os.path.basename(path) != "__init__.py"
    }
    assert sorted(on_disk - listed) == [], "modules missing from docs/architecture.md"
    assert sorted(listed - on_disk) == [], "docs/architecture.md names modules that do not exist"


@in_tensorflow_session
def test_local_links_point_to_files_that_exist():
    broken = []
    for page in [*PAGES, "CHANGELOG.md"]:
        folder = os.path.dirname(os.path.join(ROOT, page))
        for target in relative_links(os.path.join(ROOT, page)):
            if target and not os.path.exists(os.path.join(folder, target)):
                broken.append(f"{page}: {target}")
    assert not broken, "\n".join(broken)


@in_tensorflow_session
def test_readme_and_docs_share_no_text():
    """Each text lives in one place: no long README line is repeated in a docs page."""

    def prose(page):
        with open(os.path.join(ROOT, page), encoding="utf-8") as file:
            text = file.read()
        for block in _blocks(page):
            text = text.replace(block.text, "")
        return {line.strip() for line in text.splitlines() if len(line.strip()) >= 60}

    readme = prose("README.md")
    shared = {page: sorted(readme & prose(page)) for page in PAGES[1:]}
    assert not any(shared.values()), {page: lines for page, lines in shared.items() if lines}


# ------------------------------------------------------------------ running the examples
@pytest.fixture(scope="module")
def demo_corpus():
    from keras_transformer.data import make_demo_corpus

    return make_demo_corpus(num_train=NUM_TRAIN_PAIRS, num_validation=0, num_test=NUM_TEST_PAIRS)


@pytest.fixture(scope="module")
def demo_model_dir(tiny_dir, tmp_path_factory):  # noqa: F811
    """The tiny model directory with two epoch checkpoints, as `make demo` leaves them."""
    directory = tmp_path_factory.mktemp("docs_demo") / "demo"
    shutil.copytree(tiny_dir, directory)
    model = keras.saving.load_model(str(directory / "model.keras"))
    (directory / "checkpoints").mkdir()
    for epoch in (1, 2):
        model.save_weights(str(directory / "checkpoints" / f"epoch_{epoch:03d}.weights.h5"))
    return directory


@pytest.fixture
def workdir(tmp_path, monkeypatch, demo_model_dir, demo_corpus):
    shutil.copytree(demo_model_dir, tmp_path / "saved_models" / "demo")
    for split, pairs in (("train", demo_corpus["train"]), ("test", demo_corpus["test"])):
        for side, lang in enumerate(("en", "de")):
            lines = "".join(pair[side] + "\n" for pair in pairs)
            (tmp_path / f"{split}.{lang}").write_text(lines, encoding="utf-8")
    (tmp_path / "sentences.txt").write_text("on May 29, 2048\nI have five apples\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _run_python(block, namespace):
    filename = f"<{block.where}>"
    linecache.cache[filename] = (len(block.text), None, block.text.splitlines(True), filename)
    exec(compile(block.text, filename, "exec"), namespace)


def _run_shell(block):
    for command in shell_commands(block.text, console=block.lang == "console"):
        main = importlib.import_module(f"keras_transformer.cli.{command.command}").main
        stdin = open(command.stdin, encoding="utf-8").read() if command.stdin else ""
        output = io.StringIO()
        environment = dict(os.environ)  # kt-export sets KERAS_BACKEND for its process
        old_stdin, sys.stdin = sys.stdin, io.StringIO(stdin)
        try:
            with contextlib.redirect_stdout(output):
                status = main(list(command.argv))
        except SystemExit as error:  # argparse refused the arguments
            status = error.code
        finally:
            sys.stdin = old_stdin
            os.environ.clear()
            os.environ.update(environment)
        if command.stdout:
            with open(command.stdout, "w", encoding="utf-8") as file:
                file.write(output.getvalue())
        else:
            print(output.getvalue())
        assert status in (0, None), f"{block.where}: `{command.text}` exited with {status}"


def _session_of(page):
    backend = "torch" if page in TORCH_PAGES else "tensorflow"
    return pytest.param(
        page, marks=pytest.mark.skipif(BACKEND != backend, reason=f"{page}'s examples run in the {backend} session")
    )


@pytest.mark.parametrize("page", [_session_of(page) for page in PAGES])
def test_examples_run(page, workdir):
    namespace = {"__name__": "__docs__"}
    for block in _blocks(page):
        if block.mark == "not run" or block.lang == "text":
            continue
        started = time.monotonic()
        if block.mark == "file":
            target = workdir / block.mark_value
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.text, encoding="utf-8")
        elif block.lang in PYTHON:
            _run_python(block, namespace)
        elif block.lang in SHELL:
            _run_shell(block)
        else:
            pytest.fail(block_problem(block))
        print(f"--- {block.where} ran in {time.monotonic() - started:.1f} s")
