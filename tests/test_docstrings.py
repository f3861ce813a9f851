"""Every `>>>` example in the package's docstrings runs, as doctest, and prints what it says.

Examples that need what a docstring cannot make in a line (a trained model directory, a
corpus on disk) are written as plain code blocks instead, without `>>>`, so every `>>>`
left is a promise this test keeps. The examples run on one backend (TensorFlow), in a
temporary working directory, with `kt`, `keras`, `np` and `ops` defined.
"""

import doctest
import importlib
import os
import pkgutil

import keras
import numpy as np
import pytest

import keras_transformer as kt

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="docstring examples run on one backend (TensorFlow); their printed values do not depend on it",
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _modules():
    names = []
    for info in pkgutil.walk_packages(kt.__path__, prefix="keras_transformer."):
        if ".cli." in info.name:  # command-line mains: their examples are shell lines
            continue
        names.append(info.name)
    return sorted(names)


def _examples_of(module_name):
    module = importlib.import_module(module_name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    globs = {"kt": kt, "keras": keras, "np": np, "ops": keras.ops}
    return [test for test in finder.find(module, module_name, extraglobs=globs) if test.examples]


MODULES_WITH_EXAMPLES = [name for name in _modules() if _examples_of(name)]


def test_some_modules_have_runnable_examples():
    # A guard against the finder silently finding nothing (e.g. a broken walk).
    assert len(MODULES_WITH_EXAMPLES) >= 8, MODULES_WITH_EXAMPLES


@pytest.mark.parametrize("module_name", MODULES_WITH_EXAMPLES)
def test_docstring_examples_run(module_name, tmp_path, monkeypatch):
    # Examples that read the shipped configs use paths relative to the repository.
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("KT_DOCTEST_TMP", str(tmp_path))
    runner = doctest.DocTestRunner(
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE | doctest.REPORT_ONLY_FIRST_FAILURE,
        verbose=False,
    )
    failures = []
    for test in _examples_of(module_name):
        result = runner.run(test, out=failures.append)
        assert result.failed == 0, f"{test.name}:\n" + "".join(failures)
