"""`bench/machine.py`'s results files: a write stopped part way leaves the old numbers."""

import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from bench import machine  # noqa: E402


def test_a_results_file_is_replaced_whole_or_left_as_it_was(tmp_path, monkeypatch):
    path = tmp_path / "results" / "search_settings.json"
    machine.write_json(path, {"runs": {"a": [1]}})
    assert json.loads(path.read_text()) == {"runs": {"a": [1]}}
    machine.write_json(path, {"runs": {"a": [1], "b": [2]}})
    assert json.loads(path.read_text()) == {"runs": {"a": [1], "b": [2]}}

    real_write_text = pathlib.Path.write_text

    def killed_half_way(self, text, *args, **kwargs):
        real_write_text(self, text[: len(text) // 2], *args, **kwargs)
        raise KeyboardInterrupt  # the benchmark stopped while writing

    monkeypatch.setattr(pathlib.Path, "write_text", killed_half_way)
    with pytest.raises(KeyboardInterrupt):
        machine.write_json(path, {"runs": {"a": [1], "b": [2], "c": [3]}})
    monkeypatch.undo()
    assert json.loads(path.read_text()) == {"runs": {"a": [1], "b": [2]}}
    assert [p.name for p in path.parent.iterdir()] == ["search_settings.json"]  # no partial file left

