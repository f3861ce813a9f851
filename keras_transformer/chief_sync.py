"""ChiefSync: the callback that makes the chief's word final in a run over several processes.

The agreement is the same on every engine; only how a process hears the chief differs
(`jax.experimental.multihost_utils` on JAX, `torch.distributed` on PyTorch), so each
engine's module subclasses it with three transports.
"""

import keras

from keras_transformer import internals


class ChiefSync(keras.callbacks.Callback):
    """The chief's word is final: the state a run resumes from, when it stops, its schedule's total.

    Put it after every other callback. `on_train_begin` (after `BackupAndRestore`, which
    restores a resumed run in the chief only: the others write their files into a scratch
    directory) gives every process the chief's weights, optimizer state and initial epoch.
    At each epoch's start and after each batch and epoch, `model.stop_training` becomes the
    chief's (`TimeBudget` reads each process's own clock: one process stopping a batch
    before another would leave that one waiting), and so does the total of a budgeted
    schedule (`StepBudgetEstimator` times each process's own steps, and the total is baked
    into the step): the learning rate is the chief's. One process alone does nothing.

    Subclasses give `_is_multi_process()`, `_broadcast_variables(variables)` (the chief's
    values into every process's Keras variables, in place) and `_broadcast_ints(values)`
    (the chief's list of ints).
    """

    def on_train_begin(self, logs=None):
        if not self._is_multi_process():
            return
        model = self.model
        if model.optimizer is not None and not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)  # as BackupAndRestore does in the chief
        self._broadcast_variables(list(model.variables) + (list(model.optimizer.variables) if model.optimizer else []))
        # The epoch `fit` starts at, which `BackupAndRestore` sets when it restores.
        (epoch,) = self._broadcast_ints([internals.initial_epoch(model)])
        internals.set_initial_epoch(model, epoch)

    def on_epoch_begin(self, epoch, logs=None):
        self._agree()

    def on_train_batch_end(self, batch, logs=None):
        self._agree()

    def on_epoch_end(self, epoch, logs=None):
        self._agree()

    def _agree(self):
        if not self._is_multi_process():
            return
        schedule = _budget_schedule(self.model)
        stop, total = self._broadcast_ints(
            [int(bool(self.model.stop_training)), -1 if schedule is None else int(schedule.total_steps)]
        )
        self.model.stop_training = bool(stop)
        if schedule is not None and total != schedule.total_steps:
            schedule.total_steps = total
            self.model.make_train_function(force=True)  # the compiled or captured step holds the old total

    def _is_multi_process(self):
        raise NotImplementedError

    def _broadcast_variables(self, variables):
        raise NotImplementedError

    def _broadcast_ints(self, values):
        raise NotImplementedError


def _budget_schedule(model):
    """The optimizer's `BudgetSchedule` (whose total a `StepBudgetEstimator` sets), else None."""
    from keras_transformer.train.budget_estimate import budget_schedule_of

    try:
        return budget_schedule_of(model.optimizer)[0]
    except ValueError:  # another learning rate: nothing estimated, nothing to agree on
        return None

