"""Concurrency: a loaded SavedModel shared by threads answers as it does alone.

A `Translator` shared by four threads is tested in test_translator.py; this is the
same for what TF Serving and in-process TensorFlow users hold, the loaded SavedModel.
TensorFlow runs concurrent calls of a loaded function in parallel (there is no lock),
so this checks that no state (the tokenizer resource, the decoding loop's tensors)
leaks from one call into another.
"""

import concurrent.futures

import keras
import pytest
from tiny_reliability import greedy_export, tiny_dir  # noqa: F401  (session fixtures)
from tiny_translation import pick_sentences

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow", reason="SavedModel export needs the TensorFlow backend"
)

REPEATS = 3  # calls per thread, so the threads' calls overlap


def _translate(serve, batch):
    import tensorflow as tf

    outputs = serve(text=tf.constant(batch))
    translations = [text.decode("utf-8") for text in outputs["translation"].numpy()]
    return translations, outputs["score"].numpy().tolist()


def test_loaded_saved_model_shared_by_four_threads_gives_sequential_results(greedy_export, tiny_dir):
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  Registers the tokenizer ops of the graph.

    from keras_transformer.data.tokenizer import SubwordTokenizer

    _, export_dir = greedy_export
    serve = tf.saved_model.load(export_dir).signatures["serving_default"]
    sentences = pick_sentences(SubwordTokenizer.load(tiny_dir), count=8)
    jobs = [sentences, sentences[::-1], sentences[2:3] + [""], sentences[:4] + ["🐈 家"]]
    sequential = [_translate(serve, job) for job in jobs]
    assert all(any(translations) for translations, _ in sequential)  # real text is compared

    def worker(job):
        return [_translate(serve, job) for _ in range(REPEATS)]

    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        parallel = list(pool.map(worker, jobs))
    for expected, results in zip(sequential, parallel):
        assert results == [expected] * REPEATS
