"""Token-budget batches of a binarized corpus, planned from index arrays.

The batches of `data.pipeline.make_dataset` (pairs bucketed by length, each bucket
batched by a budget of padded tokens, padded to its boundary, section 5.1 of the
paper), made without a pass over the text: the pairs' lengths are read from the
binarized corpus (`data.binarized`), and an epoch is a plan of indices in numpy:

- each bucket's pairs in a random order, cut into batches of the bucket's size, and the
  batches of all buckets in a random order; the random generator is seeded with
  `(seed, epoch)`, so every pair is in exactly one batch of each epoch, and the plan of
  any epoch is made again in a fraction of a second;
- the stream is positioned by its global batch number, `epoch * batches_per_epoch +
  batch`: a resumed run starts at the batch where it stopped and reads nothing before
  it;
- `Shard(index, count)`, one per worker of a multi-worker run: every worker plans the
  same global batches and gathers only its rows of each (rows `index::count`, topped up
  with all-padding rows that the loss ignores to the same row count on every worker),
  so the workers' shares are disjoint, cover the batch, and step together
  (`distributed_dataset`). The global batch is the same for any number of workers.

Memory is the indices (about 12 bytes a pair: lengths, bucket members, one epoch's
order) and the pages of the ids a batch touches; nothing holds the corpus.
"""

import dataclasses
import math

import numpy as np

from keras_transformer.data.pipeline import LengthStats, bucket_batch_sizes, check_batching_arguments
from keras_transformer.special_tokens import BOS_ID, EOS_ID, PAD_ID


# Batches between two releases of the corpus pages read (`BinarizedCorpus.release_pages`).
# Every one: a page fault maps a whole large folio of the page cache (a large share of a
# megabyte for each pair read, on recent kernels), so a few dozen batches of 25k tokens
# held gigabytes more in the process's resident memory; releasing each time makes a
# batch a few times slower to gather, still far ahead of any step that reads it
# (bench/corpus_scale.py measures both).
_RELEASE_EVERY = 1


@dataclasses.dataclass(frozen=True)
class Shard:
    """Which share of every batch a worker reads: rows `index::count`.

    Args:
        index: int, this worker's number, from 0.
        count: int, the number of workers.
    """

    index: int = 0
    count: int = 1

    def __post_init__(self):
        if not (isinstance(self.count, int) and self.count >= 1 and isinstance(self.index, int)
                and 0 <= self.index < self.count):
            raise ValueError(
                "A Shard needs 0 <= index < count, both integers. "
                f"Received: index={self.index!r}, count={self.count!r}"
            )


def distributed_dataset(strategy, make_batches, start=0):
    """The batches of a multi-worker `tf.distribute` strategy, each worker reading only its rows.

    `strategy.distribute_datasets_from_function`: each worker's pipeline is made with its
    `Shard` (from the input context) and hands its devices their parts of the rows, so no
    worker gathers another's (`experimental_distribute_dataset` would have every worker
    make every global batch and split it).

    Args:
        strategy: a `tf.distribute.Strategy` (several workers).
        make_batches: callable from a `Shard` to an `IndexBatches` with that shard.
        start: int, the global batch to start at.
    """

    def dataset_fn(context):
        replicas = context.num_replicas_in_sync // context.num_input_pipelines
        shard = Shard(context.input_pipeline_id, context.num_input_pipelines)
        return make_batches(shard).dataset(start, replicas=replicas)

    return strategy.distribute_datasets_from_function(dataset_fn)


class IndexBatches:
    """Token-budget, length-bucketed batches of a `BinarizedCorpus`, from index arrays.

    Args:
        corpus: an opened `BinarizedCorpus`.
        max_length, tokens_per_batch, bucket_boundaries, overlong: as in `make_dataset`
            (the budget is of one side's padded tokens; pairs over `max_length` are
            dropped or truncated).
        seed: int, seeds every epoch's plan (with the epoch's number).
        shuffle: bool; False keeps each bucket's pairs in corpus order and the batches
            bucket by bucket (for checks).
        shard: `Shard`, this worker's rows of each batch.

    Attributes:
        stats: `LengthStats` of the corpus (counted from the lengths: no pass over the ids).
        num_batches: int, batches in one epoch (every worker steps through all of them).
    """

    def __init__(self, corpus, *, max_length, tokens_per_batch, bucket_boundaries=None, overlong="drop",
                 seed=0, shuffle=True, shard=Shard()):
        self.boundaries = check_batching_arguments(max_length, tokens_per_batch, bucket_boundaries, overlong)
        self.corpus, self.max_length, self.overlong = corpus, max_length, overlong
        self.seed, self.shuffle, self.shard = seed, shuffle, shard
        self.sizes = bucket_batch_sizes(self.boundaries, tokens_per_batch)
        self._members, over = _bucket_members(corpus.lengths, self.boundaries, max_length, overlong)
        counts = tuple(len(members) for members in self._members)
        self.num_batches = sum(math.ceil(count / size) for count, size in zip(counts, self.sizes))
        self.stats = LengthStats(
            total=len(corpus.lengths), kept=sum(counts), dropped=over if overlong == "drop" else 0,
            truncated=over if overlong == "truncate" else 0, max_length=max_length,
            bucket_boundaries=tuple(self.boundaries), bucket_batch_sizes=tuple(self.sizes),
            bucket_counts=counts, num_batches=self.num_batches,
        )
        self._plan_epoch, self._plan = None, None

    def epoch_plan(self, epoch):
        """`(order, starts, stops, buckets)`: batch i is pairs `order[starts[i]:stops[i]]`, of bucket `buckets[i]`."""
        if self._plan_epoch == epoch:
            return self._plan
        self._plan_epoch, self._plan = None, None  # the last epoch's plan goes before this one is made
        rng = np.random.default_rng([self.seed, epoch])
        order = np.empty(sum(len(members) for members in self._members), self._members[0].dtype)
        stops, buckets, offset = [], [], 0
        for bucket, (members, size) in enumerate(zip(self._members, self.sizes)):
            order[offset:offset + len(members)] = rng.permutation(members) if self.shuffle else members
            bucket_stops = np.minimum(np.arange(size, len(members) + size, size), len(members)) + offset
            stops.append(bucket_stops)
            buckets.append(np.full(len(bucket_stops), bucket, np.int32))
            offset += len(members)
        stops, buckets = np.concatenate(stops), np.concatenate(buckets)
        starts = np.concatenate([[0], stops[:-1]])
        batch_order = rng.permutation(len(stops)) if self.shuffle else np.arange(len(stops))
        self._plan_epoch, self._plan = epoch, (order, starts[batch_order], stops[batch_order], buckets[batch_order])
        return self._plan

    def batch_pairs(self, step):
        """The pair indices of global batch `step` (all rows, every shard's) and its bucket."""
        epoch, batch = divmod(step, self.num_batches)
        order, starts, stops, buckets = self.epoch_plan(epoch)
        return order[starts[batch]:stops[batch]], self.boundaries[buckets[batch]]

    def batch(self, step, shard=None):
        """Global batch `step`: the shard's `({"encoder_inputs", "decoder_inputs"}, labels)`, int32 numpy.

        `shard` defaults to this object's.
        """
        shard = shard or self.shard
        if step % _RELEASE_EVERY == 0:
            self.corpus.release_pages()  # resident memory stays flat over an epoch
        pairs, length = self.batch_pairs(step)
        rows = math.ceil(len(pairs) / shard.count)
        return self._gather(pairs[shard.index::shard.count], length, rows)

    def batches(self, start=0, stop=None, replicas=1):
        """Batches `start, start + 1, ...` (up to `stop`, else without end): epochs follow each other.

        With `replicas` R > 1 (a worker's devices, fed by `distributed_dataset`), each step
        gives R parts of the shard's rows, one per device, in the devices' order.
        """
        step = start
        while stop is None or step < stop:
            for replica in range(replicas):
                yield self.batch(step, Shard(self.shard.index * replicas + replica, self.shard.count * replicas))
            step += 1

    def _gather(self, pairs, length, rows):
        """Padded model inputs of `pairs` at `length`, plus all-padding rows up to `rows`."""
        corpus = self.corpus
        source = _padded(corpus.source_ids, corpus.source_offsets, pairs, length, first=0)
        target = _padded(corpus.target_ids, corpus.target_offsets, pairs, length, first=1)
        # The same cut as data.pipeline: max_length - 1 tokens, then EOS / after BOS.
        source_lengths = np.minimum(corpus.source_offsets[pairs + 1] - corpus.source_offsets[pairs], self.max_length - 1)
        target_lengths = np.minimum(corpus.target_offsets[pairs + 1] - corpus.target_offsets[pairs], self.max_length - 1)
        positions = np.arange(length)
        encoder = np.where(positions < source_lengths[:, None], source, PAD_ID)
        encoder[np.arange(len(pairs)), source_lengths] = EOS_ID
        decoder = np.where((positions >= 1) & (positions <= target_lengths[:, None]), target, PAD_ID)
        decoder[:, 0] = BOS_ID
        labels = np.where(positions < target_lengths[:, None], np.roll(target, -1, axis=1), PAD_ID)
        labels[np.arange(len(pairs)), target_lengths] = EOS_ID
        extra = rows - len(pairs)
        encoder, decoder, labels = (np.pad(a, [(0, extra), (0, 0)]).astype(np.int32) for a in (encoder, decoder, labels))
        return {"encoder_inputs": encoder, "decoder_inputs": decoder}, labels

    def dataset(self, start=0, replicas=1):
        """An endless `tf.data.Dataset` of this shard's batches from global batch `start` (`replicas`: see `batches`)."""
        import tensorflow as tf

        spec = tf.TensorSpec([None, None], tf.int32)
        batches = tf.data.Dataset.from_generator(
            lambda: self.batches(start, replicas=replicas),
            output_signature=({"encoder_inputs": spec, "decoder_inputs": spec}, spec),
        )
        batches = batches.apply(tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY))
        return batches.prefetch(tf.data.AUTOTUNE)


def _bucket_members(lengths, boundaries, max_length, overlong, block=1 << 20):
    """Each bucket's pair indices (int32), and the number of pairs over `max_length`.

    Read a block of lengths at a time, so the only arrays as long as the corpus are the
    members themselves (4 bytes a pair).
    """
    index_type = np.int32 if len(lengths) < 2**31 else np.int64
    parts = [[] for _ in boundaries]
    over = 0
    for start in range(0, len(lengths), block):
        part = np.asarray(lengths[start:start + block])
        bucket = np.searchsorted(np.asarray(boundaries, np.int32), np.minimum(part, max_length))
        over += int((part > max_length).sum())
        if overlong == "drop":
            bucket[part > max_length] = len(boundaries)  # past the last bucket: left out
        for index in range(len(boundaries)):
            parts[index].append((np.flatnonzero(bucket == index) + start).astype(index_type))
    return [np.concatenate(part) if part else np.zeros(0, index_type) for part in parts], over


def _padded(ids, offsets, pairs, length, first):
    """`[len(pairs), length]` ids of each pair from column `first` on (beyond it: any value, masked later)."""
    columns = np.arange(length) - first
    if not len(ids):  # every sentence of this side is empty: nothing but what the mask puts there
        return np.zeros((len(pairs), length), np.int32)
    positions = offsets[pairs][:, None] + np.maximum(columns, 0)[None, :]
    return ids[np.minimum(positions, max(len(ids) - 1, 0))].astype(np.int32)


__all__ = ["IndexBatches", "Shard", "distributed_dataset"]
