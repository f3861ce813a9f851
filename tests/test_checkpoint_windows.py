"""bench/checkpoint_windows.py scores the weights it names: each checkpoint alone, the
final weights, and the mean of the newest N checkpoints.

The decoder is replaced by a probe that reads the model's weights when it is asked to
score, so each row can be checked exactly against the checkpoint files it names.
"""

import json
import os
import pathlib
import sys

import numpy as np
import pytest

from keras_transformer.model.directory import CHECKPOINT_DIR

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import bench.checkpoint_windows as windows  # noqa: E402

SOURCE = "red blue green black white small big old".split()
TARGET = "rot blau gruen schwarz weiss klein gross alt".split()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A finished 6-update run with checkpoints at updates 2, 4 and 6, and a val split."""
    from keras_transformer.train.run import run_training
    from keras_transformer.train.run_config import RunConfig

    data = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(0)
    words = [rng.integers(0, len(SOURCE), size=1 + i % 2) for i in range(60)]
    for split, rows in (("train", words), ("val", words[:4])):
        (data / f"{split}.en").write_text("".join(" ".join(SOURCE[w] for w in ws) + "\n" for ws in rows))
        (data / f"{split}.de").write_text("".join(" ".join(TARGET[w] for w in ws[::-1]) + "\n" for ws in rows))
    config = RunConfig(
        name="windows", output_dir=str(data / "out"), corpus="files", data_dir=str(data),
        validation_split="", test_split="", vocab_size=48, epochs=2, steps_per_epoch=3,
        bleu_every_epochs=0, sample_translations=0, verbose=0, jit_compile=False,
        keep_checkpoints=3, checkpoint_every_steps=2, tokens_per_batch=64,
        model=dict(d_model=16, d_ff=32, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                   max_length=8, dropout=0.0),
        training={"warmup_steps": 2, "learning_rate_scale": 5.0},  # large steps: checkpoints differ
    )
    result = run_training(config)
    return data, pathlib.Path(result.model_dir)


def checkpoint_weights(model, path):
    model.load_weights(path)
    return [np.asarray(w, dtype="float64") for w in model.get_weights()]


def test_each_row_scores_the_weights_it_names(run_dir, tmp_path, monkeypatch):
    from keras_transformer.model.directory import load_model_and_tokenizer

    data, model_dir = run_dir
    seen = []

    def probe(model, tokenizer, sources, references, beam_size, alpha, batch_size):
        seen.append([np.asarray(w, dtype="float64") for w in model.get_weights()])
        return {"bleu": float(len(seen)), "seconds": 0.0}

    monkeypatch.setattr(windows, "score", probe)
    results = tmp_path / "windows.json"
    windows.main([str(data), "--model-dir", str(model_dir), "--direction", "en-de", "--windows", "0,1,3",
                  "--steps", "2,6", "--searches", "1:0.6", "--results", str(results)])

    model, _ = load_model_and_tokenizer(str(model_dir))
    final = [np.asarray(w, dtype="float64") for w in model.get_weights()]
    checkpoints = model_dir / CHECKPOINT_DIR
    step = {n: checkpoint_weights(model, checkpoints / f"step_{n:07d}.weights.h5") for n in (2, 4, 6)}
    assert not np.allclose(step[2][0], step[4][0])  # the checkpoints differ: the means below mean something
    mean = [(a + b + c) / 3 for a, b, c in zip(step[2], step[4], step[6])]
    # Scored in order: steps 2 and 6 alone, then windows 0 (final), 1 (newest) and 3 (all).
    expected = [step[2], step[6], final, step[6], mean]
    assert len(seen) == len(expected)
    for got, want in zip(seen, expected):
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)

    entry = json.loads(results.read_text())["runs"][os.path.normpath(str(model_dir))]
    assert [(r["window"], r["averaged"], r["first"]) for r in entry["windows"]] == [
        (0, 0, None), (1, 1, "step_0000006.weights.h5"), (3, 3, "step_0000002.weights.h5")]
    assert [r["step"] for r in entry["single"]] == [2, 6]
    assert entry["checkpoints"] == 3 and entry["checkpoint_every"] == 2 and entry["final_step"] == 6
    assert results.with_suffix(".png").is_file()


def test_a_missing_checkpoint_is_named_before_anything_is_decoded(run_dir, tmp_path, monkeypatch):
    data, model_dir = run_dir
    monkeypatch.setattr(windows, "score", lambda *args: pytest.fail("decoded"))
    with pytest.raises(SystemExit, match="no checkpoint for step 3 at .*step_0000003.weights.h5"):
        windows.main([str(data), "--model-dir", str(model_dir), "--direction", "en-de", "--steps", "3",
                      "--results", str(tmp_path / "w.json")])


def test_searches_are_beam_alpha_pairs():
    assert windows.parse_searches("4:0.6,6:1.4") == [(4, 0.6), (6, 1.4)]
    with pytest.raises(SystemExit, match="BEAM:ALPHA pairs.*'4'"):
        windows.parse_searches("4")
