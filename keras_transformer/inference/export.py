"""SavedModel export for TensorFlow Serving: text in, text out, all in the graph.

`export_saved_model` writes `saved_models/<name>/<version>/`, the layout TensorFlow
Serving watches (it serves the highest integer version under `<name>/`). The graph
holds the sentencepiece tokenizer (tensorflow-text ops, which stock TF Serving links),
the model's variables and its beam search, traced from the same `decoding.py` code
that runs on every backend; no Python function is left in it. Signatures:

- `serving_default`: `text` tf.string `[B]` -> `translation` tf.string `[B]`,
  `score` float32 `[B]`.
- `translate_ids`: `encoder_inputs` int32 `[B, S]` (source ids ending with EOS,
  padded with 0) -> `output_ids` int32 `[B, L]` (ending with EOS, then 0),
  `score` float32 `[B]`: for clients that tokenize themselves.
- `translate_n_best`: `text` tf.string `[B]` -> `translations` tf.string `[B, k]` and
  `scores` float32 `[B, k]`: each sentence's k best hypotheses, best first, scored as
  `serving_default` scores (its first column is `serving_default`'s output). k is fixed
  at export time (`n_best`, by default the beam size). A slot no hypothesis reached
  (the search finished fewer than k, e.g. with a one-token limit) holds "" and -inf;
  an empty input holds "" everywhere, with score 0 first and -inf after.
- `translate_ids_n_best`: `encoder_inputs` as `translate_ids` -> `output_ids` int32
  `[B, k, L]` and `scores` float32 `[B, k]`, the same lists as token ids (0 in
  unreached slots).

A server passes tensors to a signature as they come, whatever shape the signature
declares, so the inputs are declared with any shape and checked in the graph, each
check raising `InvalidArgumentError` with a message that names the input: `text` must
be a vector `[B]`; `encoder_inputs` must be `[B, S]` with `S <= max_length` (a longer
source would be decoded past the positions the model was built for) and ids in
`[0, vocab_size)` (a negative id would wrap around to the end of the embedding table).
The dtype (string, int32) is enforced by TensorFlow at the signature.

A SavedModel that holds tokenizer ops cannot be loaded by a server that lacks them,
whatever signature is called, so `ids_only=True` exports a graph with no
tensorflow-text op at all, whose `serving_default` is `translate_ids` (and which has
`translate_ids_n_best` but not `translate_n_best`).

Tracing the model into a TF graph needs the TensorFlow backend. A model trained
under JAX or PyTorch is exported by loading its `.keras` file (or its
`.weights.h5` into a model built from the same config) in a process started with
`KERAS_BACKEND=tensorflow`; `python -m training.export` does exactly that.
"""

import os
import re
import warnings

import keras

from keras_transformer import checks
from keras_transformer.atomic import write_directory_atomically
from keras_transformer.inference import decoding
from keras_transformer.inference.decoding import MAX_DECODE_EXTRA
from keras_transformer.special_tokens import EOS_ID, PAD_ID
from keras_transformer.model.directory import load_model_and_tokenizer, resolve_search

DEFAULT_BASE_DIR = "saved_models"
DEFAULT_NAME = "transformer"
SERVING_SIGNATURE = "serving_default"
IDS_SIGNATURE = "translate_ids"
N_BEST_SIGNATURE = "translate_n_best"
IDS_N_BEST_SIGNATURE = "translate_ids_n_best"

# Ops that call back into Python: a SavedModel holding one cannot be served.
PYTHON_FUNCTION_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})

_TF_BACKEND_MESSAGE = (
    "SavedModel export needs the TensorFlow backend, but this process runs "
    "KERAS_BACKEND={backend!r}. The model's files load on any backend: save it "
    "(model.save('model.keras'), or model.save_weights('model.weights.h5')) and "
    "export it from a process started with KERAS_BACKEND=tensorflow, e.g. "
    "`KERAS_BACKEND=tensorflow python -m training.export --model-dir DIR`."
)


def check_tensorflow_backend():
    """Raises `RuntimeError` (saying how to export instead) unless the backend is TF."""
    backend = keras.backend.backend()
    if backend != "tensorflow":
        raise RuntimeError(_TF_BACKEND_MESSAGE.format(backend=backend))


def _checked_ids(encoder_inputs, max_length, vocab_size):
    """`encoder_inputs`, after in-graph checks of its rank, length and id range."""
    import tensorflow as tf

    rank = tf.debugging.assert_rank(
        encoder_inputs, 2, message="`encoder_inputs` must have shape [batch, length]"
    )
    with tf.control_dependencies([rank]):
        encoder_inputs = _as_rank(encoder_inputs, 2)
    outside = f"`encoder_inputs` holds token ids outside [0, vocab_size={vocab_size})"
    in_range = [
        tf.debugging.assert_less_equal(
            tf.shape(encoder_inputs)[1],
            max_length,
            message=f"`encoder_inputs` is longer than max_length={max_length} "
            f"(at most {max_length - 1} source ids and EOS)",
        ),
        tf.debugging.assert_non_negative(encoder_inputs, message=outside),
        tf.debugging.assert_less(encoder_inputs, tf.constant(vocab_size, tf.int32), message=outside),
    ]
    with tf.control_dependencies(in_range):
        return tf.identity(encoder_inputs)


def _checked_text(text):
    """`text`, after an in-graph check that it is a vector of strings."""
    import tensorflow as tf

    rank = tf.debugging.assert_rank(
        text, 1, message="`text` must be a vector [batch] of strings, one sentence each"
    )
    with tf.control_dependencies([rank]):
        return _as_rank(text, 1)


def _n_best_search(model, beam_size, length_penalty, max_extra, n_best, early_stopping):
    """The search every signature calls: a `tf.function` of `encoder_inputs [B, S]`.

    One search, traced once (the best hypothesis is the first of the n-best list), so
    the SavedModel holds one decoding loop instead of one per signature, and exporting
    traces it once. autograph=False on every function here: plain TensorFlow ops and
    the backend-neutral searches, nothing for AutoGraph to rewrite (compiled.py says
    what converting costs).
    """
    import tensorflow as tf  # Only on the TF backend, checked by export_saved_model.

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)], autograph=False)
    def decode_n_best(encoder_inputs):
        """`[B, n_best, L]` tokens and `[B, n_best]` scores, best first."""
        if beam_size == 1:  # greedy search: its one hypothesis
            tokens, scores = decoding.greedy_decode(model, encoder_inputs, max_extra=max_extra)
            return tokens[:, None], scores[:, None]
        tokens, scores = decoding.beam_decode(
            model,
            encoder_inputs,
            beam_size,
            length_penalty,
            max_extra=max_extra,
            return_all_beams=True,
            early_stopping=early_stopping,
        )
        return tokens[:, :n_best], scores[:, :n_best]

    return decode_n_best


def _text_translators(tokenizer, decode_n_best, max_length):
    """`(translate_text, translate_text_n_best)`: strings `[B]` in, through the tokenizer."""
    import tensorflow as tf

    max_source_tokens = max_length - 1  # room for EOS

    def source_ids(text):
        # Same rules as `Translator`: cut to fit EOS in; `empty` marks no text.
        ids = tokenizer.tokenize(text)[:, :max_source_tokens]
        eos = tf.fill([tf.shape(text)[0], 1], tf.constant(EOS_ID, tf.int32))
        ids = tf.concat([ids, tf.RaggedTensor.from_tensor(eos)], axis=1)
        return ids.to_tensor(default_value=PAD_ID), tf.equal(ids.row_lengths(), 1)

    def translate_text(text):
        # No text -> "" (score 0), as `Translator` does.
        ids, empty = source_ids(_checked_text(text))
        tokens, scores = decode_n_best(ids)
        tokens, scores = tokens[:, 0], scores[:, 0]
        translation = tf.where(empty, "", tokenizer.detokenize(tokens))
        return {"translation": translation, "score": tf.where(empty, 0.0, scores)}

    def translate_text_n_best(text):
        ids, empty = source_ids(_checked_text(text))
        tokens, scores = decode_n_best(ids)  # [B, k, L], [B, k]
        shape = tf.shape(tokens)
        texts = tokenizer.detokenize(tf.reshape(tokens, [-1, shape[2]]))
        texts = tf.reshape(texts, shape[:2])
        reached = tf.math.is_finite(scores)
        translations = tf.where(tf.logical_and(reached, ~empty[:, None]), texts, "")
        # An empty input: one hypothesis "" of score 0, as `Translator` gives.
        first = tf.equal(tf.range(shape[1]), 0)[None, :]
        empty_scores = tf.where(first, 0.0, float("-inf"))
        scores = tf.where(empty[:, None], empty_scores, scores)
        return {"translations": translations, "scores": scores}

    return translate_text, translate_text_n_best


def _translation_module(model, tokenizer, decode_n_best):
    """A `tf.Module` with the model's variables, the tokenizer and the decode functions.

    `tokenizer` None leaves the text functions out (`ids_only`).
    """
    import tensorflow as tf

    max_length = model.config.max_length
    vocab_size = model.config.vocab_size

    def translate_ids(encoder_inputs):
        tokens, scores = decode_n_best(_checked_ids(encoder_inputs, max_length, vocab_size))
        return {"output_ids": tokens[:, 0], "score": scores[:, 0]}

    def translate_ids_n_best(encoder_inputs):
        tokens, scores = decode_n_best(_checked_ids(encoder_inputs, max_length, vocab_size))
        return {"output_ids": tokens, "scores": scores}

    module = tf.Module(name="translation")
    # Tracked, so that the variables and the tokenizer resource the functions capture
    # are saved. The Keras model itself is only closed over: it holds nothing more.
    module.model_variables = list(model.variables)
    # Any shape (None): the rank is checked in the graph, with a message (module docstring).
    ids_spec = [tf.TensorSpec(None, tf.int32, name="encoder_inputs")]
    text_spec = [tf.TensorSpec(None, tf.string, name="text")]
    module.translate_ids = tf.function(translate_ids, input_signature=ids_spec, autograph=False)
    module.translate_ids_n_best = tf.function(translate_ids_n_best, input_signature=ids_spec, autograph=False)
    if tokenizer is not None:
        translate_text, translate_text_n_best = _text_translators(tokenizer, decode_n_best, max_length)
        module.tokenizer = tokenizer
        module.translate_text = tf.function(translate_text, input_signature=text_spec, autograph=False)
        module.translate_text_n_best = tf.function(translate_text_n_best, input_signature=text_spec, autograph=False)
    return module


def _signatures(module, ids_only):
    """The SavedModel's signatures by name: concrete functions of `module`."""
    ids_function = module.translate_ids.get_concrete_function()
    signatures = {
        IDS_SIGNATURE: ids_function,
        IDS_N_BEST_SIGNATURE: module.translate_ids_n_best.get_concrete_function(),
    }
    if ids_only:
        signatures[SERVING_SIGNATURE] = ids_function
    else:
        signatures[SERVING_SIGNATURE] = module.translate_text.get_concrete_function()
        signatures[N_BEST_SIGNATURE] = module.translate_text_n_best.get_concrete_function()
    return signatures


def _as_rank(tensor, rank):
    """`tensor` reshaped to `rank` (1 or 2) dimensions, its last one kept: for after an assert.

    The rank assert raises at run time, with its message. But TensorFlow specializes a
    called function to the shapes it is given and folds shape computations (the batch
    size, a slice, `tf.ensure_shape`) while it optimizes the graph, before any op runs:
    given another rank, those would fail first, with messages that name no input. A
    reshape that keeps every element is valid for any rank, so nothing fails but the
    assert. A valid input (empty ones included) is returned unchanged.
    """
    import tensorflow as tf

    if rank == 1:
        return tf.reshape(tensor, [-1])
    shape = tf.concat([[1], tf.shape(tensor)], axis=0)  # a scalar's is [1]
    return tf.reshape(tensor, tf.stack([tf.reduce_prod(shape[:-1]), shape[-1]]))


def export_saved_model(
    model_dir_or_model,
    tokenizer=None,
    *,
    base_dir=DEFAULT_BASE_DIR,
    name=DEFAULT_NAME,
    version=None,
    overwrite=False,
    beam_size=None,
    length_penalty=None,
    max_extra=MAX_DECODE_EXTRA,
    early_stopping=False,
    ids_only=False,
    n_best=None,
):
    """Writes a TF Serving SavedModel to `base_dir/name/version/`; returns that path.

    The SavedModel's signatures are described in the module docstring. It is first
    written to a hidden temporary directory beside the version directory (TF Serving
    ignores names that are not integers), checked to hold no Python-function op, and
    then renamed into place, so a crash mid-write leaves any previous export intact.

    Args:
        model_dir_or_model: a model directory (`model.keras` + `tokenizer.model`) or a
            `keras_transformer.Transformer`.
        tokenizer: the `SubwordTokenizer` (or its path); defaults to the directory's.
        base_dir: str, the root of the TF Serving model tree.
        name: str, the served model's name: one directory-name component.
        version: positive int; defaults to 1 + the highest integer version already
            under `base_dir/name` (1 when there is none).
        overwrite: bool, replace an existing version directory instead of raising.
        beam_size: int, beams per sentence; 1 exports greedy search. Defaults to the
            model directory's search (its run's `eval_beam_size`), else 4 (6.1).
        length_penalty: float, alpha of the length penalty. Defaults to the model
            directory's (`eval_length_penalty`), else 0.6 (6.1).
        max_extra: int, extra output tokens over the source length. Default 50 (6.1).
        early_stopping: bool, stop a sentence's beam search once `beam_size`
            hypotheses have finished after its most probable extension ended
            (`Translator`'s argument). Defaults to False.
        ids_only: bool, leave the tokenizer out: only token-id signatures, loadable
            where tensorflow-text ops are not.
        n_best: int, 1 <= n_best <= beam_size, the hypotheses per sentence of the
            n-best signatures. Defaults to `beam_size` (every beam).

    Returns:
        str, the version directory.

    Raises:
        RuntimeError: the Keras backend is not TensorFlow (the message says what to do).
        FileExistsError: the version directory exists and `overwrite` is False.
        ValueError: bad `name`, `version` or decoding arguments; `n_best` above the
            beam size.

    Example:

    ```python
    export_saved_model("runs/demo/model", name="demo")
    # 'saved_models/demo/1'
    ```
    """
    check_tensorflow_backend()
    _check_name(name)
    model, tokenizer = load_model_and_tokenizer(model_dir_or_model, tokenizer)
    beam_size, length_penalty = resolve_search(model_dir_or_model, beam_size, length_penalty)
    checks.check_positive_int("beam_size", beam_size)
    checks.check_non_negative_number("length_penalty", length_penalty)
    checks.check_non_negative_int("max_extra", max_extra)
    checks.check_bool("early_stopping", early_stopping)
    n_best = _checked_n_best(n_best, beam_size)
    target = _version_directory(base_dir, name, version, overwrite)

    decode_n_best = _n_best_search(model, beam_size, length_penalty, max_extra, n_best, early_stopping)
    module = _translation_module(model, None if ids_only else tokenizer, decode_n_best)
    _write_saved_model(module, _signatures(module, ids_only), target, overwrite)
    _warn_of_xla_ops(target)
    return target


def _version_directory(base_dir, name, version, overwrite):
    """`base_dir/name/version`, the next version when None; refused if it exists unless `overwrite`."""
    model_base = os.path.join(os.fspath(base_dir), name)
    if version is None:
        version = next_version(model_base)
    checks.check_positive_int("version", version)
    target = os.path.join(model_base, str(version))
    if os.path.exists(target) and not overwrite:
        raise FileExistsError(
            f"{target} already exists; pass overwrite=True (--overwrite) to replace it, "
            "or choose another version."
        )
    return target


def _write_saved_model(module, signatures, target, overwrite):
    """Saves `module` to `target` atomically, refusing a graph that calls back into Python."""
    import tensorflow as tf

    def write(directory):
        tf.saved_model.save(module, directory, signatures=signatures)
        python_ops = saved_model_op_types(directory) & PYTHON_FUNCTION_OPS
        if python_ops:  # pragma: no cover - would be a bug in the traced code
            raise RuntimeError(
                f"The traced graph holds Python-function ops {sorted(python_ops)}, which "
                "TensorFlow Serving cannot run; nothing was exported."
            )

    write_directory_atomically(target, write, overwrite=overwrite)


def _warn_of_xla_ops(target):
    """Warns when the SavedModel at `target` holds XLA ops, which stock TF Serving does not run."""
    xla_ops = sorted(op for op in saved_model_op_types(target) if op.startswith("Xla"))
    if xla_ops:
        warnings.warn(
            f"The SavedModel at {target} holds XLA ops {xla_ops}. TensorFlow runs them "
            "through XLA's on-demand compiler, which stock TensorFlow Serving disables "
            "(tensorflow/serving#2217); serve it with --xla_cpu_compilation_enabled=true "
            "or export from a version whose cache update avoids ops.slice_update.",
            UserWarning,
            stacklevel=3,
        )


def next_version(model_base):
    """1 + the highest integer-named directory under `model_base` (1 if none)."""
    if not os.path.isdir(model_base):
        return 1
    versions = [
        int(entry)
        for entry in os.listdir(model_base)
        if entry.isdigit() and os.path.isdir(os.path.join(model_base, entry))
    ]
    return max(versions, default=0) + 1


def saved_model_op_types(export_dir):
    """The set of op types in a SavedModel's graphs, its function library included."""
    from tensorflow.core.protobuf import saved_model_pb2

    saved_model = saved_model_pb2.SavedModel()
    with open(os.path.join(export_dir, "saved_model.pb"), "rb") as file:
        saved_model.ParseFromString(file.read())
    op_types = set()
    for meta_graph in saved_model.meta_graphs:
        op_types.update(node.op for node in meta_graph.graph_def.node)
        for function in meta_graph.graph_def.library.function:
            op_types.update(node.op for node in function.node_def)
    return op_types


def _checked_n_best(n_best, beam_size):
    """`n_best`, or `beam_size` when None; ValueError naming both when above it."""
    if n_best is None:
        return beam_size
    checks.check_positive_int("n_best", n_best)
    if n_best > beam_size:
        raise ValueError(
            "`n_best` must be at most the beam size: a search returns no more hypotheses "
            f"than it keeps. Received: n_best={n_best}, beam_size={beam_size}"
        )
    return n_best


def translate_with_saved_model(export_dir, sentences):
    """Translations and scores of `sentences` through an exported SavedModel.

    Loads `export_dir` with `tf.saved_model.load` (no Keras, no model code) and calls
    its `serving_default` signature, as a server would.

    Returns:
        `(translations, scores)`: lists of str and float.
    """
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  Registers the tokenizer ops the graph uses.

    loaded = tf.saved_model.load(export_dir)
    outputs = loaded.signatures[SERVING_SIGNATURE](text=tf.constant(list(sentences), tf.string))
    translations = [text.decode("utf-8") for text in outputs["translation"].numpy()]
    return translations, [float(score) for score in outputs["score"].numpy()]


def _check_name(name):
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*", name):
        raise ValueError(
            "`name` must be one directory name of letters, digits, '_', '-' or '.', not "
            f"starting with '.' or '-'. Received: name={name!r}"
        )


__all__ = [
    "DEFAULT_BASE_DIR",
    "DEFAULT_NAME",
    "SERVING_SIGNATURE",
    "IDS_SIGNATURE",
    "N_BEST_SIGNATURE",
    "IDS_N_BEST_SIGNATURE",
    "PYTHON_FUNCTION_OPS",
    "check_tensorflow_backend",
    "export_saved_model",
    "next_version",
    "saved_model_op_types",
    "translate_with_saved_model",
]
