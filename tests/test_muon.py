"""`TrainingConfig(optimizer="muon")`: which weights take Muon's step, its size, fit and reload."""

import keras
import numpy as np
import pytest
from conftest import tiny_config
from test_training import copy_task, quick_jit_compile

import keras_transformer as kt
from keras_transformer.train.compile import compile_transformer, make_optimizer
from keras_transformer.train.schedules import TransformerSchedule

# Keras' Muon defaults, which make_optimizer keeps: the quintic Newton-Schulz coefficients,
# 5 iterations, and the update's scale per sqrt(max(rows, columns)).
MUON_A, MUON_B, MUON_C, NS_STEPS, RMS_RATE = 3.4445, -4.7750, 2.0315, 5, 0.2
LEARNING_RATE = 16**-0.5 * 4**-1.5  # eq. 3 at step 1 for d_model 16, warmup 4: 0.03125


def newton_schulz_of_one():
    """Where 5 quintic Newton-Schulz iterations take a singular value of 1 (a rank-1
    matrix after Muon's Frobenius normalization): sigma <- a s + b s^3 + c s^5."""
    sigma = 1.0
    for _ in range(NS_STEPS):
        sigma = MUON_A * sigma + MUON_B * sigma**3 + MUON_C * sigma**5
    return sigma


def test_muon_is_built_from_the_training_config():
    training = kt.TrainingConfig(
        optimizer="muon", warmup_steps=4, adam_beta_1=0.8, adam_beta_2=0.97,
        adam_epsilon=1e-7, clipnorm=1.5, weight_decay=0.1,
    )
    optimizer = make_optimizer(16, training)
    assert isinstance(optimizer, keras.optimizers.Muon)
    assert (optimizer.adam_beta_1, optimizer.adam_beta_2, optimizer.epsilon) == (0.8, 0.97, 1e-7)
    assert optimizer.clipnorm == 1.5
    assert optimizer.adam_lr_ratio == 1.0  # the AdamW-stepped weights follow the schedule too
    assert (optimizer.weight_decay, optimizer.adam_weight_decay) == (0.1, 0.1)
    assert isinstance(optimizer._learning_rate, TransformerSchedule)
    assert optimizer._learning_rate.warmup_steps == 4
    # Without weight decay, neither of Muon's two decays is on (Keras' default is 0.004).
    plain = make_optimizer(16, kt.TrainingConfig(optimizer="muon"))
    assert (plain.weight_decay, plain.adam_weight_decay) == (None, None)


def test_an_unknown_optimizer_is_refused():
    with pytest.raises(ValueError, match=r"`optimizer` must be one of \('adam', 'muon'\)\. Received: optimizer='sgd'"):
        kt.TrainingConfig(optimizer="sgd")


def test_kernels_take_the_orthogonalized_step_and_the_rest_adamw():
    # Every weight gets a gradient of ones. Adam's first step moves each entry by exactly
    # the learning rate (m / sqrt(v) = 1). A ones matrix [n, m] is rank 1, sqrt(n m) u v^T
    # with unit u, v: Muon's step is lr * sigma_5 * 0.2 * sqrt(max(n, m)) * u v^T, each entry
    # lr * sigma_5 * 0.2 * sqrt(max(n, m)) / sqrt(n m), whatever the gradient's size.
    model = kt.build_transformer(tiny_config(share_embeddings=False))
    optimizer = make_optimizer(16, kt.TrainingConfig(optimizer="muon", warmup_steps=4))
    variables = model.trainable_variables
    before = [keras.ops.convert_to_numpy(v) for v in variables]
    optimizer.apply_gradients([(keras.ops.ones(v.shape), v) for v in variables])
    sigma = newton_schulz_of_one()
    muon, adamw = [], []
    for variable, old in zip(variables, before):
        step = old - keras.ops.convert_to_numpy(variable)
        if np.allclose(step, LEARNING_RATE, rtol=1e-5):
            adamw.append(variable.path)
            continue
        rows, columns = variable.shape
        expected = LEARNING_RATE * sigma * RMS_RATE * max(rows, columns) ** 0.5 / (rows * columns) ** 0.5
        np.testing.assert_allclose(step, expected, rtol=1e-4, err_msg=variable.path)
        muon.append(variable.path)
    # The 4 attention projections of each attention block (1 encoder self, decoder self and
    # cross) and the 2 feed-forward kernels of each layer: 16 kernels take Muon's step.
    blocks = ["encoder_layer_0/self_attention", "decoder_layer_0/self_attention", "decoder_layer_0/cross_attention"]
    expected_muon = [f"{b}/{p}/kernel" for b in blocks for p in ("query", "key", "value", "attention_output")]
    expected_muon += [f"{l}/feed_forward/{d}/kernel" for l in ("encoder_layer_0", "decoder_layer_0")
                      for d in ("intermediate_dense", "output_dense")]
    assert sorted(muon) == sorted(expected_muon)
    # AdamW: both token embeddings, the untied output projection, every bias and norm.
    for path in ("encoder_token_embedding/embeddings", "decoder_token_embedding/embeddings",
                 "output_projection/kernel", "output_projection/bias",
                 "encoder_layer_0/self_attention/query/bias", "decoder_layer_0/feed_forward_norm/gamma"):
        assert path in adamw, path
    assert len(muon) + len(adamw) == len(variables)


def test_muon_shrinks_its_kernels_by_the_weight_decay():
    # Zero gradient: the momentum is zero, so Newton-Schulz of a zero matrix is zero and
    # only the decoupled decay moves a kernel: w * (1 - lr * weight_decay), as with AdamW.
    optimizer = make_optimizer(16, kt.TrainingConfig(optimizer="muon", warmup_steps=4, weight_decay=0.25))
    kernel = keras.Variable(np.arange(1.0, 7.0, dtype="float32").reshape(2, 3), name="kernel")
    optimizer.apply_gradients([(keras.ops.zeros((2, 3)), kernel)])
    expected = np.arange(1.0, 7.0).reshape(2, 3) * (1 - LEARNING_RATE * 0.25)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(kernel), expected, rtol=1e-6)


def test_a_muon_model_trains_and_resumes_exactly_after_a_reload(tmp_path):
    model = compile_transformer(
        kt.build_transformer(tiny_config()),
        kt.TrainingConfig(optimizer="muon", warmup_steps=4, learning_rate_scale=0.1),
        jit_compile=quick_jit_compile(),
    )
    inputs, labels = copy_task()
    history = model.fit(inputs, labels, batch_size=8, epochs=2, verbose=0, shuffle=False)
    losses = history.history["loss"]
    assert losses[1] < losses[0] - 0.05, losses
    path = tmp_path / "muon.keras"
    model.save(path)
    reloaded = keras.saving.load_model(path)
    assert isinstance(reloaded.optimizer, keras.optimizers.Muon)
    # The momentum and Adam's moments come back: one more update on each model gives the
    # same weights.
    batch = ({k: v[:8] for k, v in inputs.items()}, labels[:8])
    model.train_on_batch(*batch)
    reloaded.train_on_batch(*batch)
    for original, restored in zip(model.trainable_variables, reloaded.trainable_variables):
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(restored), keras.ops.convert_to_numpy(original), rtol=1e-5, atol=1e-6,
            err_msg=original.path,
        )
