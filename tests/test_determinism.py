"""Determinism: the same seed gives the same first epoch, in two fresh processes.

Each run is a subprocess of this session's backend (a fresh process, as a user's rerun
is): the demo's path in small, tokenizer training, the seeded tf.data pipeline, the
tiny Transformer with dropout, the paper's optimizer and schedule, one epoch of
`fit`. On TensorFlow the child calls `tf.config.experimental.enable_op_determinism()`
(which also makes tf.data deterministic). What each backend gave on CPU is recorded in
docs/errors_and_limits.md; the test asserts what held there: bit-identical per-batch
losses and final weights on all three.
"""

import json
import os
import subprocess
import sys
import textwrap

import keras

CHILD = textwrap.dedent(
    """
    import hashlib, itertools, json, sys
    import keras
    import numpy as np
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf
        tf.config.experimental.enable_op_determinism()
    import keras_transformer as kt
    from keras_transformer.data.pipeline import make_dataset

    seed = int(sys.argv[1])
    keras.utils.set_random_seed(seed)
    sentences = [" ".join(words) for words in itertools.product(
        ("cats", "dogs", "birds", "horses", "people"), ("see", "like", "find", "paint"),
        ("houses", "cars", "trees", "gardens", "bread"))]
    pairs = [(s, " ".join(reversed(s.split()))) for s in sentences]
    tokenizer = kt.train_tokenizer(sentences, vocab_size=48, model_type="bpe")
    # One bucket of 16 and 48 pairs: 12 full batches of one shape, so one trace.
    batches, stats = make_dataset(pairs[:48], tokenizer, max_length=16, tokens_per_batch=64,
                                  bucket_boundaries=[16], seed=seed)
    config = kt.TransformerConfig.from_preset(
        "tiny", vocab_size=48, d_model=16, d_ff=32, num_heads=2, num_encoder_layers=1,
        num_decoder_layers=1, dropout=0.1, max_length=16)
    model = kt.build_transformer(config)
    kt.compile_transformer(model, kt.TrainingConfig(warmup_steps=4), jit_compile=keras.backend.backend() == "jax")
    losses = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: losses.append(float(logs["loss"])))
    model.fit(batches, epochs=1, callbacks=[record], verbose=0)
    weights = hashlib.sha256(b"".join(
        np.ascontiguousarray(keras.ops.convert_to_numpy(w)).tobytes() for w in model.weights))
    print(json.dumps({"losses": losses, "weights": weights.hexdigest(), "batches": stats.num_batches}))
    """
)


def _run_twice(tmp_path, seed=7):
    script = tmp_path / "determinism_child.py"
    script.write_text(CHILD)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(sys.path),
        "KERAS_BACKEND": keras.backend.backend(),
        "TF_CPP_MIN_LOG_LEVEL": "3",
    }
    # Both at once: the machine's two cores each take one.
    children = [
        subprocess.Popen([sys.executable, str(script), str(seed)], env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(2)
    ]
    results = []
    for child in children:
        stdout, stderr = child.communicate(timeout=300)
        assert child.returncode == 0, stderr[-3000:]
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    return results


def test_same_seed_gives_the_same_first_epoch_in_two_processes(tmp_path):
    first, second = _run_twice(tmp_path)
    assert len(first["losses"]) == first["batches"] > 5
    assert first["losses"] == second["losses"]  # bit for bit, every batch
    assert first["weights"] == second["weights"]
