"""Batches holding every example twice, for R-Drop (`keras_transformer.train.rdrop`).

R-Drop reads each example twice under different dropout; concatenating a batch with
itself along the batch axis makes the two passes one forward pass of twice the rows,
which is what `RDropCrossEntropy` expects: the first half is one pass, the second the
other. The same tokens are computed on twice, so a step costs about twice as much; the
batch's unique tokens (`tokens_per_batch`) are what they were.
"""

import tensorflow as tf

from keras_transformer.data.packing import graph_function


@graph_function
def duplicate_batch(*batch):
    """`batch` (any nest of tensors with a batch axis, e.g. `(inputs, labels)`) concatenated with itself."""
    twice = tf.nest.map_structure(lambda x: tf.concat([x, x], axis=0), batch)
    return twice if len(twice) > 1 else twice[0]


def duplicate_batches(dataset):
    """`dataset` with each batch concatenated with itself (R-Drop's two passes in one).

    Args:
        dataset: `tf.data.Dataset` of batches, e.g. `({"encoder_inputs": ..., ...}, labels)`
            from `make_dataset`.

    Returns:
        `tf.data.Dataset` of the same structure, each batch `2 * B` rows: rows `i` and
        `B + i` are the same example.

    Example:

    ```python
    train, _ = kt.make_dataset(pairs, tokenizer, tokens_per_batch=1024)
    model.fit(duplicate_batches(train))  # with loss=RDropCrossEntropy(alpha=5.0)
    ```
    """
    if not isinstance(dataset, tf.data.Dataset):
        raise ValueError(
            f"`dataset` must be a tf.data.Dataset of batches. Received: {type(dataset).__name__}"
        )
    return dataset.map(duplicate_batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


__all__ = ["duplicate_batches"]
