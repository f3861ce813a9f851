"""distribute.py and precision.py: engines per backend, data-parallel losses, mixed precision.

The multi-device runs happen in child processes (tests/distributed_child.py), because
device layouts are fixed when a backend starts; each runs in one backend's session only.
"""

import json
import os
import pathlib
import socket
import subprocess
import sys

import keras
import numpy as np
import pytest
from conftest import tiny_config

import distributed_child
from keras_transformer import build_transformer
from keras_transformer import distribute
from keras_transformer.train import precision
from keras_transformer.train.losses import LabelSmoothedCrossEntropy

BACKEND = keras.backend.backend()
REPO = pathlib.Path(__file__).resolve().parents[1]
CHILD = pathlib.Path(distributed_child.__file__)
CHILD_TIMEOUT_S = 300
# Float32 sums in another order (two replicas, an all-reduce) agree to this.
LOSS_RTOL = 1e-5
# Weights after 3 Adam steps from such gradients agree to this (2e-5 to 5e-5 measured): Adam
# divides by the gradient's size, so rounding in tiny gradients moves a weight by up to
# ~1e-4. Weights move by up to 3e-2; averaging each replica's own mean is off by 6e-2.
WEIGHT_ATOL = 5e-4

tensorflow_only = pytest.mark.skipif(
    BACKEND != "tensorflow", reason="tf.distribute runs on the TensorFlow backend"
)


def child_env(backend, **extra):
    env = {key: value for key, value in os.environ.items() if key != "TF_CONFIG"}
    env.update(KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2", **extra)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    return env


def run_child(mode, env):
    """Runs `distributed_child.py MODE` and returns its JSON line."""
    result = subprocess.run(
        [sys.executable, str(CHILD), mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stderr[-6000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def tiny_batch(rng, size=2):
    inputs = {
        "encoder_inputs": rng.integers(1, 32, (size, 6)).astype("int32"),
        "decoder_inputs": rng.integers(1, 32, (size, 5)).astype("int32"),
    }
    labels = rng.integers(1, 32, (size, 5)).astype("int32")
    labels[:, -1] = 0  # one padding label per row, ignored by the loss
    return inputs, labels


# ------------------------------------------------------------------ choosing engines
def test_unknown_strategy_name_is_refused():
    with pytest.raises(ValueError, match=r"Unknown strategy 'horovod'. Expected one of"):
        distribute.select_strategy("horovod")
    with pytest.raises(ValueError, match=r"`strategy` must be a name.*Received: strategy=3"):
        distribute.select_strategy(3)


def test_names_the_backend_cannot_run_are_refused_with_the_alternative():
    unsupported = {
        "tensorflow": ("model_parallel", "ModelParallel needs KERAS_BACKEND=jax"),
        "jax": ("mirrored", "use 'data_parallel'"),
        "torch": ("mirrored", "use 'data_parallel' \\(or 'auto'\\) under torchrun"),
    }[BACKEND]
    name, message = unsupported
    with pytest.raises(ValueError, match=message):
        distribute.select_strategy(name)


@pytest.mark.skipif(BACKEND != "torch", reason="the PyTorch backend's strategies")
@pytest.mark.parametrize("name", ["mirrored", "multi_worker", "tpu", "model_parallel"])
def test_torch_refuses_every_strategy_but_torchruns_data_parallel(name):
    with pytest.raises(ValueError, match=rf"Strategy '{name}' is not available on the PyTorch backend.*torchrun"):
        with distribute.distribution_scope(name):
            pass


@pytest.mark.skipif(BACKEND != "torch", reason="the PyTorch backend's strategies")
def test_torch_data_parallel_outside_torchrun_is_refused_naming_torchrun(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match=r"one replica per process started by torchrun.*WORLD_SIZE is not set"):
        distribute.select_strategy("data_parallel")
    monkeypatch.setenv("WORLD_SIZE", "1")  # torchrun --nproc_per_node=1: a world of one, one device
    assert distribute.select_strategy("data_parallel") is None


def test_auto_and_default_on_one_device_give_one_replica():
    for name in ("auto", "default", None):
        with distribute.distribution_scope(name) as engine:
            assert distribute.num_replicas(engine) == 1
            assert "one device" in distribute.describe(engine)
    if BACKEND == "jax":
        assert keras.distribution.distribution() is None


@tensorflow_only
def test_multi_worker_without_tf_config_is_refused(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ValueError, match="reads the cluster from the TF_CONFIG"):
        distribute.select_strategy("multi_worker")


# ------------------------------------------------------------------ chief and batch
@pytest.mark.parametrize(
    "task, cluster, chief",
    [
        ({"type": "chief", "index": 0}, {"chief": ["a:1"], "worker": ["b:1"]}, True),
        ({"type": "worker", "index": 0}, {"chief": ["a:1"], "worker": ["b:1"]}, False),
        ({"type": "worker", "index": 0}, {"worker": ["a:1", "b:1"]}, True),
        ({"type": "worker", "index": 1}, {"worker": ["a:1", "b:1"]}, False),
        ({"type": "evaluator", "index": 0}, {"worker": ["a:1"]}, False),
    ],
)
def test_is_chief_reads_tf_config(monkeypatch, task, cluster, chief):
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": task}))
    assert distribute.is_chief() is chief


def test_is_chief_without_a_cluster_and_bad_tf_config(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert distribute.is_chief() is True  # one process (jax: process 0 of 1)
    monkeypatch.setenv("TF_CONFIG", "{cluster")
    with pytest.raises(ValueError, match=r"TF_CONFIG is not valid JSON.*Received: '\{cluster'"):
        distribute.is_chief()


def test_global_to_replica_batch():
    assert distribute.global_to_replica_batch(25000, 4) == 6250
    assert distribute.global_to_replica_batch(5, 2) == 3  # tf.distribute splits 5 as 3 + 2
    assert distribute.global_to_replica_batch(7, 1) == 7
    with pytest.raises(ValueError, match="A global batch of 1 cannot feed 2 replicas"):
        distribute.global_to_replica_batch(1, 2)
    with pytest.raises(ValueError, match=r"`replicas` must be a positive integer.*replicas=0"):
        distribute.global_to_replica_batch(8, 0)


def test_pad_batches_for_replicas_adds_padding_rows_only():
    import tensorflow as tf

    inputs = {
        "encoder_inputs": [[5, 6], [7, 0], [8, 9]],
        "decoder_inputs": [[1, 4], [1, 3], [1, 2]],
    }
    labels = [[4, 2], [3, 2], [2, 2]]
    first_two = ({key: rows[:2] for key, rows in inputs.items()}, labels[:2])
    batches = tf.data.Dataset.from_tensors((inputs, labels)).concatenate(
        tf.data.Dataset.from_tensors(first_two)
    )
    padded = list(distribute.pad_batches_for_replicas(batches, 2).as_numpy_iterator())
    (x3, y3), (x2, y2) = padded
    np.testing.assert_array_equal(x3["encoder_inputs"], [[5, 6], [7, 0], [8, 9], [0, 0]])
    np.testing.assert_array_equal(x3["decoder_inputs"], [[1, 4], [1, 3], [1, 2], [0, 0]])
    np.testing.assert_array_equal(y3, [[4, 2], [3, 2], [2, 2], [0, 0]])
    np.testing.assert_array_equal(x2["encoder_inputs"], [[5, 6], [7, 0]])  # already even
    np.testing.assert_array_equal(y2, [[4, 2], [3, 2]])
    assert distribute.pad_batches_for_replicas(batches, 1) is batches
    with pytest.raises(ValueError, match="Received: replicas=-2"):
        distribute.pad_batches_for_replicas(batches, -2)


def test_layout_map_shards_the_big_matrices_of_the_real_model():
    config = tiny_config(num_heads=2, share_embeddings=False, gated_ffn=True)
    model = build_transformer(config)
    mesh = keras.distribution.DeviceMesh(
        shape=(1, 2), axis_names=("batch", "model"), devices=["cpu:0", "cpu:1"]
    )
    layout_map = distribute.transformer_layout_map(config, mesh)
    layouts = {weight.path: layout_map[weight.path] for weight in model.weights}
    axes = {path: layout.axes if layout else None for path, layout in layouts.items()}
    columns, rows = (None, "model"), ("model", None)
    for side in ("encoder", "decoder"):
        assert axes[f"{side}_token_embedding/embeddings"] == columns
        for attention in ("self_attention",) + (("cross_attention",) if side == "decoder" else ()):
            for projection in ("query", "key", "value"):
                assert axes[f"{side}_layer_0/{attention}/{projection}/kernel"] == columns
                assert axes[f"{side}_layer_0/{attention}/{projection}/bias"] == ("model",)
            assert axes[f"{side}_layer_0/{attention}/attention_output/kernel"] == rows
            assert axes[f"{side}_layer_0/{attention}/attention_output/bias"] is None
        assert axes[f"{side}_layer_0/feed_forward/intermediate_dense/kernel"] == columns
        # The gate is split like the projection it multiplies, unit for unit.
        assert axes[f"{side}_layer_0/feed_forward/gate_dense/kernel"] == columns
        assert axes[f"{side}_layer_0/feed_forward/gate_dense/bias"] == ("model",)
        assert axes[f"{side}_layer_0/feed_forward/output_dense/kernel"] == rows
        assert axes[f"{side}_layer_0/feed_forward_norm/gamma"] is None
    assert axes["output_projection/kernel"] == rows
    sharded = sum(value is not None for value in axes.values())
    assert sharded == 2 + 1 + 3 * (6 + 1) + 2 * 5  # embeddings, output, attention, FFN (gate included)

    with pytest.raises(ValueError, match=r"`d_ff` must be divisible by the model-parallel size 2"):
        distribute.transformer_layout_map(tiny_config(d_ff=33), mesh)


# ------------------------------------------------------------------ data parallel runs
def test_on_one_device_the_loss_is_its_own_token_mean_to_the_bit():
    mean, count = keras.ops.convert_to_tensor(2.5), keras.ops.convert_to_tensor(4.0)
    assert distribute.replica_share_of_global_mean(mean, count) is mean
    with distribute.distribution_scope("default"):
        assert distribute.replica_share_of_global_mean(mean, count) is mean
    inputs, labels = tiny_batch(np.random.default_rng(0))
    logits = build_transformer(tiny_config())(inputs)
    per_token = keras.ops.convert_to_numpy(LabelSmoothedCrossEntropy().call(labels, logits))
    loss = float(keras.ops.convert_to_numpy(LabelSmoothedCrossEntropy()(labels, logits)))
    np.testing.assert_allclose(loss, per_token.sum() / (labels != 0).sum(), rtol=1e-6)


@pytest.fixture(scope="module")
def mirrored_run():
    """The child's MirroredStrategy runs over two logical CPUs, once for the module."""
    return run_child("mirrored", child_env("tensorflow"))


@tensorflow_only
def test_mirrored_over_two_logical_cpus_matches_one_device(mirrored_run):
    result = mirrored_run
    assert result["replicas"] == 2
    assert result["variable_type"] == "MirroredVariable"
    assert "MirroredStrategy, 2 replicas" in result["describe"]
    np.testing.assert_allclose(result["mirrored"], result["single"], rtol=LOSS_RTOL)
    assert result["single"][2] < result["single"][1]  # steps 2 and 3 train on the same 3 rows
    # Keras 3 fit hands tf.distribute the global batch, and it splits every batch
    # across the replicas, even those of varying size (4 rows, then 3).
    assert result["split"] == [[2, 2], [2, 1]]


@tensorflow_only
def test_mirrored_loss_is_the_mean_over_all_real_tokens_when_replicas_hold_unequal_numbers(
    mirrored_run,
):
    result = mirrored_run
    # Step 1: one replica holds 2 real target tokens, the other 10; steps 2-3: 3 rows
    # split 2 + 1, with 6 and 5. The logged loss and the update are those of one device
    # on the whole batch, not an average of the two replicas' means.
    global_mean, mean_of_replica_means = result["initial"]
    np.testing.assert_allclose(result["single"][0], global_mean, rtol=LOSS_RTOL)
    assert abs(mean_of_replica_means - global_mean) > 100 * LOSS_RTOL * global_mean
    np.testing.assert_allclose(result["mirrored"], result["single"], rtol=LOSS_RTOL)
    assert result["weight_difference"] < WEIGHT_ATOL


@pytest.mark.slow  # 26-71 s here, depending on the load of the shared machine
@tensorflow_only
def test_multi_worker_mirrored_two_processes_on_localhost(tmp_path):
    def reference():  # one device on the uneven batches, computed while the workers train
        uneven_data = distributed_child.dataset(pairs=distributed_child.uneven_batch())
        return distributed_child.fit_losses("default", data=uneven_data)[0]

    results, uneven_reference = _two_workers("multi_worker", reference, WORK_DIR=str(tmp_path))

    for index, result in enumerate(results):
        assert result["engine"] == "KerasMultiWorkerMirroredStrategy"  # what "auto" picked
        assert result["same_engine"]  # the scope reused the strategy made at startup
        assert result["replicas"] == 2
        assert result["is_chief"] is (index == 0)
        assert result["checkpoint"]
        np.testing.assert_allclose(result["losses"], uneven_reference, rtol=LOSS_RTOL)
    assert (tmp_path / "chief" / "model.weights.h5").exists()


@pytest.mark.slow  # two TensorFlow workers, as the test above
@tensorflow_only
def test_multi_worker_workers_read_their_own_rows_of_a_binarized_corpus(tmp_path):
    from keras_transformer.data.binarized import write_binarized
    from keras_transformer.data.index_batches import IndexBatches
    from keras_transformer.data.tokenizer import train_tokenizer

    rng = np.random.default_rng(0)
    words = "ein zwei drei vier haus katze hund baum".split()
    pairs = [(" ".join(rng.choice(words, 1 + i % 4)), " ".join(rng.choice(words, 1 + i % 3))) for i in range(60)]
    tokenizer = train_tokenizer([side for pair in pairs for side in pair], 24)  # ids below the model's 32
    corpus = write_binarized(pairs, tokenizer, str(tmp_path / "corpus"), progress=False)
    whole = IndexBatches(corpus, max_length=8, tokens_per_batch=32)

    def reference():  # one device on the whole batches, computed while the workers train
        return distributed_child.fit_losses("default", data=whole.dataset())[0]

    results, reference = _two_workers("multi_worker_corpus", reference, CORPUS_DIR=corpus.directory)
    assert [result["shard"] for result in results] == [[0, 2], [1, 2]]
    for step in range(distributed_child.STEPS):
        shares = [[tuple(row) for row in result["rows"][step] if any(row)] for result in results]
        assert not set(shares[0]) & set(shares[1])  # disjoint
        full = [tuple(row) for row in whole.batch(step)[0]["encoder_inputs"]]
        assert sorted(shares[0] + shares[1]) == sorted(full)  # together, the whole batch
    for result in results:
        assert result["replicas"] == 2 and result["same_engine"]
        # The step is the one device's on the whole batch: the loss is the mean over both shares.
        np.testing.assert_allclose(result["losses"], reference, rtol=LOSS_RTOL)


@pytest.mark.slow  # ~45 s of CPU in the child (three XLA compilations), more under load
@pytest.mark.skipif(BACKEND != "jax", reason="runs in the jax session")
def test_jax_data_and_model_parallel_over_two_host_devices_match_one_device():
    # Two host devices, beside the session's own flags (conftest.py: cheaper compiling).
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2".strip()
    env = child_env("jax", XLA_FLAGS=flags)
    child = subprocess.Popen(
        [sys.executable, str(CHILD), "jax"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # The one-device references, computed here while the child trains.
        single, _, _ = distributed_child.fit_losses("default")
        odd = distributed_child.dataset(3)
        single_odd, _, _ = distributed_child.fit_losses("default", data=odd)
        uneven_data = distributed_child.dataset(pairs=distributed_child.uneven_batch())
        single_uneven, _, _ = distributed_child.fit_losses("default", data=uneven_data)
        stdout, stderr = child.communicate(timeout=CHILD_TIMEOUT_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, stderr[-6000:]
    result = json.loads(stdout.strip().splitlines()[-1])

    assert result["replicas"] == 2
    np.testing.assert_allclose(result["data_parallel"], single, rtol=LOSS_RTOL)
    assert single[-1] < single[0]
    # One program over the global batch: the mean over all real tokens, however they
    # fall on the devices.
    np.testing.assert_allclose(result["data_parallel_uneven"], single_uneven, rtol=LOSS_RTOL)
    assert result["after_scope"] == "None"  # the scope restored the global distribution

    assert result["model_parallel_replicas"] == 1
    assert result["describe"] == "ModelParallel, mesh (batch=1, model=2): cpu:0, cpu:1"
    np.testing.assert_allclose(result["model_parallel"], single, rtol=LOSS_RTOL)
    assert result["sharding"] == {
        "encoder_layer_0/self_attention/query/kernel": "P(None, 'model')",
        "encoder_layer_0/feed_forward/output_dense/kernel": "P('model', None)",
        "encoder_layer_0/self_attention_norm/gamma": "P(None,)",
    }
    # A batch of 3 padded to 4 rows trains exactly as the 3 pairs on one device.
    np.testing.assert_allclose(result["padded_odd"], single_odd, rtol=LOSS_RTOL)


# ------------------------------------------------------------------ mixed precision
def fit_under_policy(policy, steps=3):
    config = tiny_config(dtype_policy=policy)
    model = build_transformer(config)
    optimizer = precision.loss_scaled_optimizer(keras.optimizers.Adam(1e-2), config)
    model.compile(optimizer=optimizer, loss=LabelSmoothedCrossEntropy())
    inputs, labels = tiny_batch(np.random.default_rng(0))
    history = model.fit(inputs, labels, batch_size=2, epochs=steps, shuffle=False, verbose=0)
    return model, history.history["loss"]


def test_mixed_bfloat16_fit_lowers_the_loss_with_float32_logits_and_weights():
    model, losses = fit_under_policy("mixed_bfloat16")
    assert model.outputs[0].dtype == "float32"  # the logits
    assert {w.dtype for w in model.weights} == {"float32"}
    assert model.get_layer("encoder_layer_0").compute_dtype == "bfloat16"
    assert not isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]


def test_mixed_float16_fit_scales_the_loss_and_lowers_it():
    if BACKEND == "jax":
        pytest.skip("XLA:CPU has no F16 x F16 -> F32 dot_general: mixed_float16 needs a GPU on JAX")
    model, losses = fit_under_policy("mixed_float16")
    assert model.outputs[0].dtype == "float32"  # the logits
    assert model.get_layer("decoder_layer_0").compute_dtype == "float16"
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]


def test_loss_scaled_optimizer_wraps_only_float16():
    adam = keras.optimizers.Adam()
    assert precision.loss_scaled_optimizer(adam, "mixed_bfloat16") is adam
    assert precision.loss_scaled_optimizer(adam, None) is adam  # the global float32 policy
    if BACKEND == "jax":
        with pytest.raises(ValueError, match="cannot run on the JAX backend on CPU"):
            precision.loss_scaled_optimizer(adam, "mixed_float16")
        return
    wrapped = precision.loss_scaled_optimizer(adam, "mixed_float16")
    assert isinstance(wrapped, keras.optimizers.LossScaleOptimizer)
    assert wrapped.inner_optimizer is adam
    assert precision.loss_scaled_optimizer(wrapped, "mixed_float16") is wrapped
    with pytest.raises(ValueError, match="`optimizer` must be a keras.optimizers.Optimizer"):
        precision.loss_scaled_optimizer("adam", "mixed_float16")


def _two_workers(mode, reference, **env):
    """Runs `distributed_child.py mode` as two TensorFlow workers on loopback ports.

    Returns `(each worker's JSON result, reference())`: `reference` runs here while the
    workers train. A worker that failed fails the test with the end of its stderr.
    """
    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    workers = []
    try:
        for index in range(2):
            tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
            workers.append(subprocess.Popen(
                [sys.executable, str(CHILD), mode], env=child_env("tensorflow", TF_CONFIG=tf_config, **env),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            ))
        expected = reference()
        outputs = [worker.communicate(timeout=CHILD_TIMEOUT_S) for worker in workers]
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    for worker, (_, stderr) in zip(workers, outputs):
        assert worker.returncode == 0, stderr[-6000:]
    return [json.loads(stdout.strip().splitlines()[-1]) for stdout, _ in outputs], expected
