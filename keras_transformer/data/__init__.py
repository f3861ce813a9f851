"""Corpora and input pipeline: readers, the built-in demo corpus, tf.data batching.

The names below are imported on first use: most of this package is TensorFlow
(tf.data, tensorflow-text), and `data.settings`, which `RunConfig` reads to check a
config, must be importable without loading it.
"""

from keras_transformer.lazy_names import lazy_getattr

# name -> module that defines it.
_LAZY = {
    "ambiguous_date_formats": "keras_transformer.data.demo_corpus",
    "date_renderings": "keras_transformer.data.demo_corpus",
    "make_demo_corpus": "keras_transformer.data.demo_corpus",
    "write_demo_corpus": "keras_transformer.data.demo_corpus",
    "ReadStats": "keras_transformer.data.readers",
    "load_tfds": "keras_transformer.data.readers",
    "read_parallel_files": "keras_transformer.data.readers",
    "read_tsv": "keras_transformer.data.readers",
    "BatchedDataset": "keras_transformer.data.pipeline",
    "LengthStats": "keras_transformer.data.pipeline",
    "bucket_batch_sizes": "keras_transformer.data.pipeline",
    "count_batches": "keras_transformer.data.pipeline",
    "default_bucket_boundaries": "keras_transformer.data.settings",
    "make_dataset": "keras_transformer.data.pipeline",
}


__getattr__ = lazy_getattr("keras_transformer.data", _LAZY, globals())


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = list(_LAZY)
