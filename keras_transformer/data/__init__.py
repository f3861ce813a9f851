"""Corpora and input pipeline: readers, the built-in demo corpus, tf.data batching."""

from keras_transformer.data.demo_corpus import ambiguous_date_formats
from keras_transformer.data.demo_corpus import date_renderings
from keras_transformer.data.demo_corpus import make_demo_corpus
from keras_transformer.data.demo_corpus import write_demo_corpus
from keras_transformer.data.readers import ReadStats
from keras_transformer.data.readers import load_tfds
from keras_transformer.data.readers import read_parallel_files
from keras_transformer.data.readers import read_tsv
from keras_transformer.data.pipeline import BatchedDataset
from keras_transformer.data.pipeline import LengthStats
from keras_transformer.data.pipeline import bucket_batch_sizes
from keras_transformer.data.pipeline import count_batches
from keras_transformer.data.pipeline import default_bucket_boundaries
from keras_transformer.data.pipeline import make_dataset
