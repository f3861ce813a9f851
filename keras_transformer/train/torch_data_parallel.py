"""Each step's gradients averaged over the processes of a PyTorch run, bucket by bucket.

Under torchrun (`torch_processes`) every process trains a replica of the model on its
rows of each global batch. For every process to apply the update one process would make
on the whole batch, the gradient must be that of the paper's loss over the global batch:
the mean over ALL its real target tokens. Each process's loss is the mean over its own
`n_p` real tokens, so the global gradient is `sum_p n_p * grad_p / sum_p n_p`: each
process scales its gradient by its count, the scaled gradients and the counts are summed
across the processes in one all-reduce (the count rides along), and each process divides
by the global count. A process holding 2 real tokens weighs 2, not as much as one holding
10 (which plain averaging, DDP's, would do).

`GradientBuckets` does the all-reduce as PyTorch's DistributedDataParallel does: the
gradients are copied into flat buffers of about `BUCKET_BYTES` (25 MB, DDP's default; the
first 1 MB), in
the reverse order of the weights (the order backward makes them), each launched as an
asynchronous all-reduce as soon as its last gradient arrives
(`Tensor.register_post_accumulate_grad_hook`), always in the same order on every
process, so the communication overlaps the rest of the backward pass wherever autograd
runs op by op (Keras' eager step, the captured step's graph run as it is). Under a
compiled backward (`jit_compile=True`: the captured graph compiled, forward and backward
as one autograd node) every gradient arrives at the end, so do the hooks, and the
all-reduces follow the backward pass instead of overlapping it.

`DataParallelStep` is the training step of such a run (`attach` installs it as the
model's `captured_train_step`): the captured step (`train.torch_step`) when it takes the
batch, else the eager step Keras' PyTorch trainer runs, each with the all-reduce between
the backward pass and the optimizer's update. Metrics are global too: each metric
variable's change during the step (its totals and counts) rides in the same all-reduce,
and every process adds the sum, so the logs are those of one process on the whole batch;
the loss's are the global mean (its tracker's change is rebuilt from the global loss).
The learning rate and the step count follow from the same updates. A metric whose state
is not a sum (a maximum, a last value) would not be right this way; the Transformer's
(loss, masked accuracy, perplexity) all are.
"""

import math
import time
import warnings

import keras
import torch
import torch.distributed as dist

from keras_transformer import checks, internals, torch_processes

# The size of one all-reduce, as DistributedDataParallel's default `bucket_cap_mb=25`:
# large enough that each all-reduce moves data at the link's speed. The first bucket (the
# last weights, whose gradients backward makes first) closes at 1 MB, as DDP's does, so the
# first all-reduce starts early in the backward pass: with 25 MB from the start, the
# `small` model's (30 MB) first went out at 91% of the eager backward pass, at 1 MB at 30%
# (`bench/torch_data_parallel.py`).
BUCKET_BYTES = 25 * 2**20
FIRST_BUCKET_BYTES = 2**20
# The extras each step's all-reduce carries before the metric changes: the process's real
# target tokens (its weight), and its loss times that weight.
_WEIGHT, _WEIGHTED_LOSS, _METRICS = 0, 1, 2


class _Bucket:
    """One flat buffer: the gradients of `parameters`, then (the last bucket) the step's extras."""

    def __init__(self, parameters, extras, dtype, device):
        self.parameters = parameters
        self.numel = sum(p.numel() for p in parameters)
        self.flat = torch.zeros(self.numel + extras, dtype=dtype, device=device)
        self.views, offset = [], 0
        for p in parameters:
            self.views.append(self.flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        self.gradients = self.flat[:self.numel]
        self.extras = self.flat[self.numel:]
        self.pending = 0
        self.work = None


class GradientBuckets:
    """The gradients of `parameters`, all-reduced across the processes in flat buckets as backward makes them.

    Per step: `start(weight, extras)` before the backward pass, then `finish()` after it,
    which returns the summed extras and leaves each parameter's `.grad` holding the global
    gradient (a view into its bucket): `sum_p weight_p * grad_p / sum_p weight_p`.

    Args:
        parameters: the trainable `torch.Tensor`s, in the model's order.
        extras: int, how many float32 numbers ride along with the gradients: the step's
            weight first (this process's real-token count), then anything to be summed.
        bucket_bytes: int, the size at which a bucket is closed. Defaults to `BUCKET_BYTES`;
            the first closes at `FIRST_BUCKET_BYTES` if that is less.
        group: the process group; defaults to every process.
    """

    def __init__(self, parameters, extras, bucket_bytes=BUCKET_BYTES, group=None):
        checks.check_positive_int("bucket_bytes", bucket_bytes)
        self.parameters = list(parameters)
        self.group = group
        self.buckets = self._make_buckets(extras, bucket_bytes)
        self._where = {}
        for bucket in self.buckets:
            for p, view in zip(bucket.parameters, bucket.views):
                self._where[id(p)] = (bucket, view)
        self._ready = set()
        self._next = 0  # the first bucket not launched yet: buckets go out in order, on every process
        self._in_step = False
        self._weight = None
        self.wait_seconds = 0.0  # time spent waiting for all-reduces that had not finished (for benchmarks)
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_gradient) for p in self.parameters]

    def _make_buckets(self, extras, bucket_bytes):
        groups, current, size = [], [], 0
        for p in reversed(self.parameters):  # backward makes the last weights' gradients first
            cap = min(FIRST_BUCKET_BYTES, bucket_bytes) if not groups else bucket_bytes
            if current and (size + p.numel() * p.element_size() > cap or p.dtype != current[0].dtype
                            or p.device != current[0].device):
                groups.append(current)
                current, size = [], 0
            current.append(p)
            size += p.numel() * p.element_size()
        if current:
            groups.append(current)
        device = groups[-1][0].device if groups else torch_processes.device()
        # The extras (float32) close the last bucket, or, after weights of another type, a bucket of their own.
        if groups and groups[-1][0].dtype == torch.float32:
            last = groups.pop()
        else:
            last = []
        buckets = [_Bucket(group, 0, group[0].dtype, group[0].device) for group in groups]
        return buckets + [_Bucket(last, extras, torch.float32, device)]

    @property
    def extras(self):
        """The last bucket's extras region (float32)."""
        return self.buckets[-1].extras

    def remove(self):
        """Removes the hooks: these parameters no longer feed this object."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def start(self, weight, extras):
        """Opens a step: `weight` (a 0-d tensor) scales this process's gradients; `extras` (1-d, weight first) ride along."""
        if self._in_step:
            self._drain()  # a step whose backward failed midway: its launched all-reduces still complete
        for p in self.parameters:
            p.grad = None  # the last step's views: backward must make fresh gradients, not add to them
        self._weight = weight
        self.extras.copy_(extras)
        for bucket in self.buckets:
            bucket.pending = len(bucket.parameters)
            bucket.work = None
        self._ready.clear()
        self._next = 0
        self._in_step = True
        self._launch_ready()  # buckets without parameters (the extras' own) go at once

    def _on_gradient(self, parameter):
        if not self._in_step:
            raise RuntimeError(
                f"A backward pass ran outside the data-parallel training step of these "
                f"{torch_processes.world_size()} processes: its gradients would not be averaged across "
                "them. Train through model.fit after compile_transformer (or "
                "keras_transformer.train.torch_data_parallel.attach(model) after your own compile)."
            )
        bucket, view = self._where[id(parameter)]
        torch.mul(parameter.grad, self._weight, out=view)
        parameter.grad = None  # the bucket holds it now; finish() points .grad at the result
        self._ready.add(id(parameter))
        bucket.pending -= 1
        self._launch_ready()

    def _launch_ready(self):
        while self._next < len(self.buckets) and self.buckets[self._next].pending == 0:
            bucket = self.buckets[self._next]
            with torch_processes.collectives("averaging the gradients"):
                bucket.work = dist.all_reduce(bucket.flat, group=self.group, async_op=True)
            self._next += 1

    def finish(self):
        """Closes the step: waits for every all-reduce; returns the summed extras (float32, on the device).

        A parameter that got no gradient in this process contributes zeros.
        """
        for bucket in self.buckets:
            for p, view in zip(bucket.parameters, bucket.views):
                if id(p) not in self._ready:
                    view.zero_()
                    bucket.pending -= 1
        self._launch_ready()
        self._drain()
        extras = self.extras
        divisor = torch.clamp(extras[_WEIGHT], min=1.0)
        for bucket in self.buckets:
            if bucket.numel:
                bucket.gradients.div_(divisor.to(bucket.flat.dtype))
            for p, view in zip(bucket.parameters, bucket.views):
                p.grad = view
        return extras

    def _drain(self):
        started = time.perf_counter()
        with torch_processes.collectives("averaging the gradients"):
            for bucket in self.buckets:
                if bucket.work is not None:
                    bucket.work.wait()
                    bucket.work = None
        self.wait_seconds += time.perf_counter() - started
        self._in_step = False


def local_weight(model, y):
    """This process's weight in the step's mean: its real target tokens (float32, 0-d).

    For a loss with an `ignore_id` (`LabelSmoothedCrossEntropy`: a mean over the labels
    that are not padding), the labels that are not `ignore_id`; for any other loss (Keras'
    reductions average over every element), the number of label elements.
    """
    leaves = keras.tree.flatten(y)
    labels = keras.ops.convert_to_tensor(leaves[0])
    if len(leaves) == 1 and hasattr(getattr(model, "loss", None), "ignore_id"):
        ignore_id = model.loss.ignore_id
        if ignore_id is not None:
            return torch.sum(labels != ignore_id, dtype=torch.float32)
    return torch.tensor(float(sum(math.prod(keras.ops.shape(leaf)) for leaf in leaves)), device=labels.device)


class DataParallelStep:
    """The training step of a model trained by several processes, gradients averaged across them.

    `model.captured_train_step` of such a run (`attach`): the captured step `inner` when it
    takes the batch, else the eager step of Keras' PyTorch trainer; either way the
    gradients, the loss and the metrics are the global batch's (module docstring).

    Args:
        model: a compiled Transformer on the PyTorch backend.
        inner: the `CapturedTrainStep` (or None: every step eager).
        bucket_bytes: int, `GradientBuckets`' bucket size. Defaults to `BUCKET_BYTES`.
    """

    def __init__(self, model, inner=None, bucket_bytes=BUCKET_BYTES):
        self.model = model
        self.inner = inner
        self.bucket_bytes = bucket_bytes
        self.buckets = None
        self._metrics_count = None
        if inner is not None:
            inner.gradient_sync = self

    def __getattr__(self, name):
        # The captured step's attributes (`captures`, `graphs`, ...), as if it were the step.
        inner = self.__dict__.get("inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)

    def reset(self):
        """Drops the captured step's graphs (`make_train_function(force=True)`)."""
        if self.inner is not None:
            self.inner.reset()

    def __call__(self, data):
        if self.inner is not None and self.inner(data) is not None:
            return self.model.get_metrics_result()  # the metrics as the processes together left them
        return self._eager_step(data)

    # ------------------------------------------------------------ the two halves
    def before_backward(self, y, loss, old_metrics, new_metrics):
        """Opens the step's all-reduce: this process's weight, weighted loss and metric changes."""
        trainable = internals.variable_tensors(self.model.trainable_variables)
        if self.buckets is None or not checks.same_objects(self.buckets.parameters, trainable) \
                or self._metrics_count != len(old_metrics):
            if self.buckets is not None:
                self.buckets.remove()
            self.buckets = GradientBuckets(trainable, _METRICS + len(old_metrics), self.bucket_bytes)
            self._metrics_count = len(old_metrics)
        weight = local_weight(self.model, y)
        changes = [torch.sub(new, old).reshape(-1).float() for new, old in zip(new_metrics, old_metrics)]
        extras = torch.cat([weight.reshape(1), (loss.detach().float() * weight).reshape(1), *changes])
        self.buckets.start(weight, extras)

    def after_backward(self, old_metrics, new_metrics):
        """Closes it: `.grad` holds the global gradients; returns the metrics' new values, global."""
        extras = self.buckets.finish()
        changes = extras[_METRICS:]
        folded = [(old.float() + change).to(old.dtype) for old, change in zip(old_metrics, changes)]
        # The loss tracker adds loss * rows: with the global loss, not the sum of the local ones.
        total, count = self._tracker_positions()
        global_loss = extras[_WEIGHTED_LOSS] / torch.clamp(extras[_WEIGHT], min=1.0)
        folded[total] = (old_metrics[total].float() + global_loss * changes[count]).to(old_metrics[total].dtype)
        return folded

    def _tracker_positions(self):
        tracker = internals.loss_tracker(self.model)
        variables = self.model.metrics_variables
        positions = [next(i for i, v in enumerate(variables) if v is tracked) for tracked in (tracker.total, tracker.count)]
        return positions

    # ------------------------------------------------------------ the eager step
    def _eager_step(self, data):
        """Keras' PyTorch `train_step`, the all-reduce between backward and the update."""
        model = self.model
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        y_pred = model(x, training=True)
        model.zero_grad()
        loss = model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)
        metrics = internals.variable_tensors(model.metrics_variables)
        old = [tensor.detach().clone() for tensor in metrics]
        rows = next(leaf for leaf in keras.tree.flatten(x) if leaf is not None).shape[0]
        internals.loss_tracker(model).update_state(loss.detach(), sample_weight=rows)
        # Before the backward pass (Keras updates them after the update, from the same
        # predictions): their changes ride in the gradients' all-reduce.
        model.compute_metrics(x, y, y_pred.detach(), sample_weight=sample_weight)
        self.before_backward(y, loss, old, metrics)
        trainable = model.trainable_variables
        if trainable:
            model.optimizer.scale_loss(loss).backward()
        else:
            warnings.warn("The model does not have any trainable weights.", stacklevel=2)
        folded = self.after_backward(old, metrics)
        with torch.no_grad():
            for tensor, value in zip(metrics, folded):
                tensor.copy_(value)
            if trainable:
                model.optimizer.apply([v.value.grad for v in trainable], trainable)
        return model.get_metrics_result()


def attach(model, bucket_bytes=BUCKET_BYTES):
    """Makes `model` train with its gradients averaged across the run's processes; returns it.

    `compile_transformer` calls it while several processes run; after your own
    `model.compile`, call it yourself. It wraps the model's `captured_train_step` in a
    `DataParallelStep` and gives every process rank 0's weights. One process alone: nothing.

    Raises:
        ValueError: `model` is not a keras_transformer Transformer (whose `train_step`
            runs `captured_train_step`).
    """
    if not torch_processes.is_multi_process():
        return model
    if not hasattr(type(model), "captured_train_step"):
        raise ValueError(
            "Data parallelism over PyTorch processes runs the training step of a keras_transformer "
            f"Transformer (its captured_train_step). Received: {type(model).__name__}"
        )
    inner = model.captured_train_step
    if isinstance(inner, DataParallelStep):
        inner = inner.inner
    model.captured_train_step = DataParallelStep(model, inner, bucket_bytes)
    torch_processes.broadcast_from_chief(model.variables)
    return model


__all__ = ["BUCKET_BYTES", "FIRST_BUCKET_BYTES", "DataParallelStep", "GradientBuckets", "attach", "local_weight"]
