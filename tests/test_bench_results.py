"""`bench/machine.py`'s results files: a write stopped part way leaves the old numbers."""

import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from bench import machine  # noqa: E402


def test_a_results_file_is_replaced_whole_or_left_as_it_was(tmp_path, monkeypatch):
    path = tmp_path / "results" / "memory_settings.json"
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
    assert [p.name for p in path.parent.iterdir()] == ["memory_settings.json"]  # no partial file left


def test_a_memory_grid_adds_each_row_as_it_is_decoded_and_keeps_other_entries(tmp_path):
    from bench.memory_settings import add_row

    results = tmp_path / "memory_settings.json"
    info = {"direction": "en-de", "memory_keys": 10}
    add_row(results, "runs/a/", info, {"neighbors": 16, "bleu": 40.1})
    add_row(results, "runs/b", {**info, "memory_keys": 20}, {"neighbors": 8, "bleu": 30.0})
    entry = add_row(results, "runs/a", {**info, "memory_keys": 11}, {"neighbors": 32, "bleu": 40.3})
    # "runs/a/" and "runs/a" are one model directory: its rows in decoding order.
    assert [row["neighbors"] for row in entry["val_grid"]] == [16, 32]
    payload = json.loads(results.read_text())
    assert payload["runs"]["runs/a"] == entry and entry["memory_keys"] == 11
    assert payload["runs"]["runs/b"]["val_grid"] == [{"neighbors": 8, "bleu": 30.0}]
