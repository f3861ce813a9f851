"""The encoder-decoder Transformer as a functional `keras.Model`."""

import contextlib
import gc
import threading

import keras
import numpy as np
from keras import ops

from keras_transformer import checks, internals
from keras_transformer.input_names import MODEL_INPUTS
from keras_transformer.model.config import TransformerConfig
from keras_transformer.model.stacks import build_stacks
from keras_transformer.special_tokens import PAD_ID


@keras.saving.register_keras_serializable(package="keras_transformer")
class Transformer(keras.Model):
    """The Transformer of Vaswani et al., 2017, built with the functional API.

    Inputs are a dict `{"encoder_inputs": int32 [B, S], "decoder_inputs": int32 [B, T]}`
    with pad id 0; the output is float32 logits `[B, T, vocab_size]`. Padding masks are
    derived from the ids, so callers never pass masks; a dict with any other key is
    refused, naming it.

    Besides the functional graph used by `fit`/`predict`, the model exposes the pieces
    that decoding needs, built from the very same layer objects: `encode`,
    `initial_cache` and `decode_step` (one token at a time through the key/value cache).
    The layers are grouped into `encoder_stack` and `decoder_stack` (plain objects that
    run them in order, see `keras_transformer.model.stacks`); the blocks are reachable as
    `encoder_layers` / `decoder_layers` and by name (`model.get_layer("decoder_layer_0")`).

    Args:
        config: `TransformerConfig` (or its dict form, as stored by `get_config`).

    Example:
    >>> config = TransformerConfig.from_preset("tiny", vocab_size=32)
    >>> model = Transformer(config)
    >>> logits = model({"encoder_inputs": keras.ops.ones((2, 5), "int32"),
    ...                 "decoder_inputs": keras.ops.ones((2, 4), "int32")})
    >>> tuple(logits.shape)
    (2, 4, 32)
    """

    def __init__(self, config, name="transformer", **kwargs):
        if isinstance(config, dict):
            config = TransformerConfig.from_dict(config)
        if not isinstance(config, TransformerConfig):
            raise ValueError(
                f"`config` must be a TransformerConfig. Received: {type(config).__name__}"
            )
        dtype = kwargs.pop("dtype", None)
        if dtype is None:
            dtype = config.dtype_policy
        # A quantized model's config holds a `DTypePolicyMap` (see `get_config`): every
        # layer is handed the map and looks its own path up in it when it builds.
        dtype = keras.dtype_policies.get(dtype) if dtype is not None else keras.config.dtype_policy()
        encoder_stack, decoder_stack = build_stacks(config, dtype)

        encoder_inputs = keras.Input(shape=(None,), dtype="int32", name="encoder_inputs")
        decoder_inputs = keras.Input(shape=(None,), dtype="int32", name="decoder_inputs")
        encoder_outputs, encoder_mask = encoder_stack(encoder_inputs)
        logits = decoder_stack(decoder_inputs, encoder_outputs, encoder_mask)
        super().__init__(
            inputs={"encoder_inputs": encoder_inputs, "decoder_inputs": decoder_inputs},
            outputs=logits,
            name=name,
            **kwargs,
        )
        self.config = config
        if isinstance(dtype, keras.dtype_policies.DTypePolicyMap):
            _resolve_policy_map(self)
        # Plain objects: Keras tracks the layers through the functional graph only.
        self.encoder_stack = encoder_stack
        self.decoder_stack = decoder_stack

    def call(self, inputs, training=None, mask=None):
        # Eager calls check token ids and raise, naming the first bad one. Inside
        # compiled functions (fit, predict, tf.function, jax.jit) values are not known:
        # there the token embedding makes an out-of-range id's row NaN, so the outcome
        # is loud (NaN logits, a NaN loss that stops training), never a wrapped-around id.
        if isinstance(inputs, dict):
            _check_input_keys(inputs)
            for key in ("encoder_inputs", "decoder_inputs"):
                if key in inputs and checks.is_concrete(inputs[key]):
                    check_token_ids(inputs[key], self.config.vocab_size, name=key)
        return super().call(inputs, training=training, mask=mask)

    def fit(self, x=None, y=None, *args, **kwargs):
        """`keras.Model.fit`, with `shuffle` defaulting to False for datasets.

        A dataset (`tf.data`, a `PyDataset`, a DataLoader) is shuffled by whoever built
        it (`keras_transformer.data.make_dataset` shuffles, seeded); Keras ignores
        `shuffle` for it and warns on every call about its default of True. Arrays keep
        Keras' default (shuffled). An explicit `shuffle=` is passed through unchanged.
        On TensorFlow the optimizer is built first, so the training step is traced once
        (`_build_optimizer_before_tracing`).
        """
        shuffle_given = "shuffle" in kwargs or len(args) >= _FIT_SHUFFLE_POSITION
        if not shuffle_given and _is_dataset(x):
            kwargs["shuffle"] = False
        self._check_arrays_once(x, y)
        self._build_optimizer_before_tracing()
        return super().fit(x, y, *args, **kwargs)

    def _check_arrays_once(self, x, y):
        """Checks in-memory ids and labels once, before `fit`, where no step can read them.

        Inside the training step values are never read on the host (`checks.no_host_reads`):
        there an out-of-range id makes the loss NaN. Arrays given to `fit` are checked here
        instead, with the named error of a direct call.
        """
        if isinstance(x, dict):
            for key in MODEL_INPUTS:
                if key in x and checks.is_concrete(x[key]):
                    check_token_ids(x[key], self.config.vocab_size, name=key)
        if y is not None and not _is_dataset(y) and checks.is_concrete(y):
            ignore_id = getattr(getattr(self, "loss", None), "ignore_id", PAD_ID)
            checks.check_ids_in_range("y", np.asarray(ops.convert_to_numpy(y)), self.config.vocab_size, ignore_id=ignore_id)

    # PyTorch: the `train.torch_step.CapturedTrainStep` that `compile_transformer` attaches
    # (None: Keras' own step). A callable `batch -> logs, or None for Keras' step`, with `reset()`.
    captured_train_step = None

    def train_step(self, *args):
        """Keras' training step (`(data)`, or `(state, data)` on JAX), with no host reads.

        On PyTorch the `captured_train_step` attached by `compile_transformer`
        (`train.torch_step`) runs when there is one and it takes the batch.
        """
        with checks.no_host_reads():
            if self.captured_train_step is not None:
                logs = self.captured_train_step(args[-1])
                if logs is not None:
                    return logs
            return super().train_step(*args)

    def make_train_function(self, force=False):
        """Keras' `make_train_function`; `force=True` also drops PyTorch's captured graphs.

        A forced rebuild is how a callback says that Python values a compiled step baked
        in have changed (`StepBudgetEstimator` setting the schedule's `total_steps`): the
        captured step and optimizer update bake them in too, so they are captured again.
        """
        if force and self.captured_train_step is not None:
            self.captured_train_step.reset()
        return super().make_train_function(force=force)

    def test_step(self, *args):
        """Keras' evaluation step, with no host reads (see `train_step`)."""
        with checks.no_host_reads():
            return super().test_step(*args)

    def train_on_batch(self, *args, **kwargs):
        """`keras.Model.train_on_batch`; on TensorFlow the optimizer is built first, as in `fit`.

        Its first call traces the training step once instead of twice (see
        `_build_optimizer_before_tracing`), which about halves its time.
        """
        self._build_optimizer_before_tracing()
        return super().train_on_batch(*args, **kwargs)

    def _build_optimizer_before_tracing(self):
        """Creates the optimizer's slots now, on TensorFlow, instead of in the first trace.

        Keras' TensorFlow trainer (without a distribution strategy) leaves the optimizer
        unbuilt until the training step is traced, so its slot variables (Adam's two per
        weight) are created inside `tf.function`, and a function that creates variables is
        traced twice. Built here, on the weights that are trainable when `fit` starts (as
        the first trace would), the step is traced once, and the first `fit` takes about
        half as long. Under a
        strategy Keras builds the optimizer itself, in the strategy's scope; JAX and
        PyTorch build it before their first step too.
        """
        optimizer = getattr(self, "optimizer", None)
        if (
            keras.backend.backend() != "tensorflow"
            or optimizer is None
            or optimizer.built
            or internals.construction_strategy(self) is not None
        ):
            return
        optimizer.build(self.trainable_variables)

    def quantize(self, mode=None, **kwargs):
        """`keras.Model.quantize`, with one garbage collection at the end instead of one per kernel.

        Keras' `Layer.__delattr__` runs `gc.collect()` each time it drops a float kernel
        (to free device memory at once), and `quantize` drops one per `Dense`: in a
        process that has imported TensorFlow each collection walks all of its objects, so
        each `Dense` cost a full collection. The same memory is freed by the single
        collection after the last layer; the quantized model is the same.
        """
        with _collections_deferred():
            result = super().quantize(mode, **kwargs)
        gc.collect()
        return result

    def enable_lora(self, rank, lora_alpha=None):
        """Low-rank adaptation (LoRA) of every `Dense` layer; afterwards only LoRA trains.

        Calls Keras' `Dense.enable_lora` on each projection of attention (query, key,
        value, output) and of the feed-forward network, and on the untied
        `output_projection`: each kernel `W` is frozen and the layer computes with
        `W + (lora_alpha / rank) * A @ B`, with `A [in, rank]` and `B [rank, out]`
        trainable float32 weights (`lora_kernel_a`, `lora_kernel_b`; B starts at zero,
        so the model is unchanged until trained). Every other weight (biases, layer
        norms, embeddings) is frozen too, so `fit` trains the LoRA matrices alone.
        Compile the model after this call: the optimizer is built on the trainable
        weights. Attention's fused projections read `Dense.kernel`, which includes the
        LoRA term; a `Translator` made before this call retraces on its next call;
        `save` writes each kernel with its LoRA term merged in.

        Args:
            rank: int > 0, the rank `r` of the update.
            lora_alpha: number > 0, the update's scale numerator. Defaults to `rank`
                (a scale of 1), Keras' default.

        Raises:
            ValueError: `rank` or `lora_alpha` is not positive, or LoRA is already on.

        Example:
        >>> model = kt.build_transformer(kt.TransformerConfig.from_preset("tiny", vocab_size=32))
        >>> model.enable_lora(4)
        >>> sorted({w.path.rsplit("/", 1)[-1] for w in model.trainable_weights})
        ['lora_kernel_a', 'lora_kernel_b']

        References:
            Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", ICLR 2022.
        """
        checks.check_positive_int("rank", rank)
        if lora_alpha is not None:
            checks.check_positive_number("lora_alpha", lora_alpha)
        # `_flatten_layers` reaches the Dense layers inside the blocks, as Keras' own
        # `Model.quantize` does; `self.layers` lists the top-level layers only.
        denses = [
            layer
            for layer in self._flatten_layers(include_self=False)
            if isinstance(layer, keras.layers.Dense)
        ]
        if any(dense.lora_enabled for dense in denses):
            raise ValueError(
                "LoRA is already enabled on this model; Keras enables it once per layer. "
                f"Received: rank={rank}"
            )
        for dense in denses:
            dense.enable_lora(rank, lora_alpha=lora_alpha)
        lora_weights = {
            id(weight) for dense in denses for weight in (dense.lora_kernel_a, dense.lora_kernel_b)
        }
        for weight in self.weights:
            weight.trainable = id(weight) in lora_weights

    # ----------------------------------------------------------------- pieces
    @property
    def encoder_layers(self):
        """The `EncoderBlock`s, first to last."""
        return list(self.encoder_stack.blocks)

    @property
    def decoder_layers(self):
        """The `DecoderBlock`s, first to last."""
        return list(self.decoder_stack.blocks)

    def encode(self, encoder_inputs, training=False, return_attention_scores=False):
        """Runs the encoder stack: `(outputs [B, S, D], padding_mask [B, S])`.

        With `return_attention_scores`, also a list of `[B, N, S, S]` per layer.
        """
        return self.encoder_stack(
            encoder_inputs, training=training, return_attention_scores=return_attention_scores
        )

    def decode(
        self,
        decoder_inputs,
        encoder_outputs,
        encoder_padding_mask,
        training=False,
        return_attention_scores=False,
        return_states=False,
    ):
        """Teacher-forced decoder pass: logits `[B, T, vocab]` (plus scores if asked).

        With `return_states`, also the final decoder states `[B, T, D]` the logits are
        projected from, last in the returned tuple.
        """
        return self.decoder_stack(
            decoder_inputs,
            encoder_outputs,
            encoder_padding_mask,
            training=training,
            return_attention_scores=return_attention_scores,
            return_states=return_states,
        )

    def initial_cache(self, encoder_outputs, max_target_length):
        """Caches for `decode_step`: zeroed self-attention keys/values, projected encoder.

        Returns `(self_caches, cross_caches)`, tuples with one entry per decoder layer:
        `[B, 2, max_target_length, N, H]` and `[B, 2, S, N, H]`.
        """
        batch = ops.shape(encoder_outputs)[0]
        config = self.config
        zeros_shape = (batch, 2, max_target_length, config.num_heads, config.head_dim)
        self_caches = tuple(
            ops.zeros(zeros_shape, dtype=layer.compute_dtype) for layer in self.decoder_layers
        )
        cross_caches = tuple(
            layer.compute_cross_attention_cache(encoder_outputs) for layer in self.decoder_layers
        )
        return self_caches, cross_caches

    def decode_step(
        self, token_ids, index, self_caches, cross_caches, encoder_padding_mask, return_states=False
    ):
        """Decodes the tokens at position `index` (`[B, 1]` ids) against the caches.

        Returns `(logits [B, vocab] float32, self_caches)` with this step's keys and
        values written at `index`. Equal to the teacher-forced `decode` at that position.
        With `return_states`, also the final decoder states `[B, D]`, last in the tuple.
        """
        return self.decoder_stack.step(
            token_ids, index, self_caches, cross_caches, encoder_padding_mask, return_states=return_states
        )

    # ------------------------------------------------------------ serialization
    def get_config(self):
        config = {"config": self.config.to_dict(), "name": self.name, "trainable": self.trainable}
        policy_map = self._quantized_policy_map()
        if policy_map is not None:
            config["dtype"] = keras.dtype_policies.serialize(policy_map)
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        return cls(TransformerConfig.from_dict(config.pop("config")), **config)

    def _quantized_policy_map(self):
        """A `DTypePolicyMap` of the quantized layers' paths, or None if none is quantized.

        After `model.quantize("int8")` the `Dense` layers inside the blocks hold an int8
        kernel and its scale, but the blocks would rebuild them from their own float
        policy, and loading would find two variables where it expects others. Saving
        each quantized layer's policy under its path (what keras-hub's `Backbone`
        does) lets the rebuilt model build those layers quantized before the weights
        load: the map is passed down as every layer's `dtype`, and a layer reads its
        own entry by `layer.path`.
        """
        policy_map = keras.dtype_policies.DTypePolicyMap(default_policy=self.config.dtype_policy)
        for layer in self._flatten_layers(include_self=False):
            if layer.quantization_mode is None:
                continue
            policy = layer.dtype_policy
            if isinstance(policy, keras.dtype_policies.DTypePolicyMap):
                policy = policy[layer.path]
            # A copy: serializing a map without a default policy blanks its policies' names.
            policy_map[layer.path] = keras.dtype_policies.deserialize(
                keras.dtype_policies.serialize(policy)
            )
        return policy_map if len(policy_map) else None


def _resolve_policy_map(model):
    """Gives each layer of `model` its own policy from the map it was built with.

    The map has done its work once the layers are built (quantized layers created their
    int8 variables). Keras 3.15's `Dense` reads `dtype_policy.quantization_mode` in
    places (its `save_own_variables` among them), which for a map is the default's
    (None), so a loaded model could not be saved again; a plain policy per layer, as
    `quantize` leaves it, avoids that.
    """
    for layer in internals.all_layers(model):
        policy = layer.dtype_policy
        if isinstance(policy, keras.dtype_policies.DTypePolicyMap):
            internals.replace_dtype_policy(layer, policy[layer.path] if layer.path else policy.default_policy)


_GC_PATCH_LOCK = threading.Lock()


@contextlib.contextmanager
def _collections_deferred():
    """`gc.collect` as a no-op inside the block: Keras calls it through the module."""
    with _GC_PATCH_LOCK:
        collect = gc.collect
        gc.collect = lambda *args, **kwargs: 0
        try:
            yield
        finally:
            gc.collect = collect


def _check_input_keys(inputs):
    """Refuses an input dict with keys besides `MODEL_INPUTS`, which the model would ignore.

    Batches of packed pairs (their segment ids and restarting positions) were such keys;
    without this check their pairs would attend to each other, silently.
    """
    unexpected = sorted(set(inputs) - set(MODEL_INPUTS))
    if not unexpected:
        return
    packed = any(key.endswith(("_segment_ids", "_positions")) for key in unexpected)
    raise ValueError(
        f"The Transformer's inputs are {list(MODEL_INPUTS)}. Received other keys too: {unexpected}"
        + ("; sequence packing (segment ids, restarting positions) was removed in keras-transformer 0.4: "
           "batch the pairs unpacked (keras_transformer.data.make_dataset)" if packed else "")
    )


def check_token_ids(token_ids, vocab_size, name="token_ids"):
    """Raises ValueError unless `token_ids` is an integer `[B, L]` array of ids in `[0, vocab_size)`."""
    values = np.asarray(ops.convert_to_numpy(token_ids))
    if not np.issubdtype(values.dtype, np.integer):
        raise ValueError(
            f"`{name}` must hold integer token ids. Received: dtype={values.dtype}. "
            "Tokenize text first; ids are never floats."
        )
    if values.ndim != 2:
        raise ValueError(
            f"`{name}` must have shape [batch, length]. Received: shape={values.shape}"
        )
    checks.check_ids_in_range(
        name, values, vocab_size, what="token id", hint="Was the data tokenized with another vocabulary?"
    )


# `shuffle` is the 7th argument of `keras.Model.fit` after x and y (batch_size, epochs,
# verbose, callbacks, validation_split, validation_data, shuffle).
_FIT_SHUFFLE_POSITION = 7


def _is_dataset(x):
    """True for batched data objects (tf.data, PyDataset, generators), not for arrays."""
    return x is not None and not hasattr(x, "shape") and not isinstance(x, (dict, list, tuple))


def build_transformer(config):
    """Builds the functional Transformer described by `config` (a `TransformerConfig`)."""
    return Transformer(config)
