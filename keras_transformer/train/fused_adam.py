"""`FusedAdam`: Keras' Adam, with each weight's update as one kernel on TensorFlow.

Keras' `Adam.update_step` is written in `keras.ops`, so on TensorFlow each weight's
update runs as ~10 separate element-wise ops, each a full pass over the weight and its
two moments in memory, where TensorFlow's own `ResourceApplyAdam` kernel (the one
`tf.compat.v1.train.AdamOptimizer` used) does the same arithmetic in one pass.
Decoupled weight decay is one scaled subtraction per weight with the learning rate read
once, where Keras' reads the schedule again for every weight. The training step saves
less than the update does, as TensorFlow already overlaps some of the update with the
backward pass (docs/benchmarks.md, "Adam's update as one kernel", has the numbers).

The arithmetic is Keras' Adam's, term for term:
`m += (g - m)(1 - beta_1)`, `v += (g^2 - v)(1 - beta_2)`,
`w -= lr * sqrt(1 - beta_2^t) / (1 - beta_1^t) * m / (sqrt(v) + epsilon)`; the results
agree with `keras.optimizers.Adam` to float32 rounding (tests/test_fused_adam.py).
`clipnorm` clips each gradient to that norm as Keras does, with one reduction and one
multiply per weight in place of Keras' ten small ops. Everything else is Keras':
global_clipnorm and clipvalue, gradient accumulation, EMA, loss scaling, serialization
(`keras.saving.load_model` after `import keras_transformer`).

The fused path runs on TensorFlow for dense float gradients outside a
`tf.distribute` strategy; AMSGrad, sparse gradients (`IndexedSlices`), distributed
variables and the JAX and PyTorch backends take Keras' own `update_step`, unchanged.
`make_optimizer` gives it on TensorFlow only: on PyTorch, `keras.optimizers.Adam` is
Keras' faster PyTorch Adam (all weights at once, `torch._foreach` ops), which a subclass
does not become.

This module itself imports `keras` only: TensorFlow is imported on the TensorFlow
backend, when the first update is traced.
"""

import keras

# ResourceApplyAdam's float types.
_FUSED_DTYPES = ("float16", "bfloat16", "float32", "float64")


@keras.saving.register_keras_serializable(package="keras_transformer")
class FusedAdam(keras.optimizers.Adam):
    """`keras.optimizers.Adam` whose update is one TensorFlow kernel per weight.

    Takes exactly `keras.optimizers.Adam`'s arguments and computes the same update
    (to float32 rounding). On TensorFlow, each dense weight's update is TensorFlow's
    fused `ResourceApplyAdam` kernel, `clipnorm` computes all the gradients' norms as
    one vector, and decoupled weight decay reads the learning rate once a step;
    elsewhere (JAX, PyTorch, AMSGrad, sparse gradients, a `tf.distribute` strategy) it
    is Keras' Adam.

    Example:
    >>> optimizer = FusedAdam(learning_rate=1e-3, beta_2=0.98, epsilon=1e-9)
    >>> weight = keras.Variable([1.0, -2.0])
    >>> optimizer.apply([keras.ops.convert_to_tensor([0.5, 0.5])], [weight])
    >>> [round(float(w), 4) for w in keras.ops.convert_to_numpy(weight)]  # first step: lr against the gradient
    [0.999, -2.001]
    """

    def update_step(self, gradient, variable, learning_rate):
        if not self._fused(gradient, variable):
            return super().update_step(gradient, variable, learning_rate)
        self._fused_update(gradient, variable, learning_rate, {})

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        if not self._fused_backend():
            return super()._backend_update_step(grads, trainable_variables, learning_rate)
        scalars = {}  # the step's scalars, built once per dtype and shared by every weight's kernel
        for gradient, variable in zip(grads, trainable_variables):
            if isinstance(variable, keras.Variable):
                variable = variable.value  # the tf.Variable, as Keras' TensorFlow optimizer passes it
            if self._fused(gradient, variable):
                self._fused_update(gradient, variable, learning_rate, scalars)
            else:
                self.update_step(gradient, variable, learning_rate)

    def _fused_update(self, gradient, variable, learning_rate, scalars):
        import tensorflow as tf

        dtype = keras.backend.standardize_dtype(variable.dtype)
        if dtype not in scalars:
            local_step = tf.cast(self.iterations + 1, dtype)
            beta_1 = tf.cast(self.beta_1, dtype)
            beta_2 = tf.cast(self.beta_2, dtype)
            scalars[dtype] = dict(
                beta1_power=tf.pow(beta_1, local_step),
                beta2_power=tf.pow(beta_2, local_step),
                lr=tf.cast(learning_rate, dtype),
                beta1=beta_1,
                beta2=beta_2,
                epsilon=tf.cast(self.epsilon, dtype),
            )
        index = self._get_variable_index(variable)
        tf.raw_ops.ResourceApplyAdam(
            var=variable.handle,
            m=self._momentums[index].handle,
            v=self._velocities[index].handle,
            grad=tf.cast(gradient, dtype),
            **scalars[dtype],
        )

    def _clip_gradients(self, grads):
        if not (self.clipnorm and self.clipnorm > 0) or not self._fused_backend():
            return super()._clip_gradients(grads)
        import tensorflow as tf

        # Keras clips each gradient with ~10 scalar-sized ops of its own (sum of squares, two
        # selects, sqrt, maximum, divide, ...): ~1,300 kernel launches a step for the recipe's
        # 127 weights. Here each gradient costs one reduction and one multiply, and the norms
        # and factors of all of them are computed as one vector.
        dense = [i for i, g in enumerate(grads) if isinstance(g, tf.Tensor) and g.dtype.is_floating]
        if not dense:
            return super()._clip_gradients(grads)
        halves = [tf.nn.l2_loss(tf.cast(grads[i], "float32")) for i in dense]  # sum(g^2) / 2
        norms = tf.sqrt(2.0 * tf.stack(halves))
        clipnorm = tf.constant(self.clipnorm, "float32")
        factors = tf.unstack(clipnorm / tf.maximum(norms, clipnorm))  # 1 where the norm is within it
        factor_of = dict(zip(dense, factors))
        clipped = []
        for i, gradient in enumerate(grads):
            if i in factor_of:
                clipped.append(gradient * tf.cast(factor_of[i], gradient.dtype))
            else:  # None passes; anything else (IndexedSlices) is clipped as Keras clips it
                clipped.append(gradient if gradient is None else self._clip_by_norm(gradient))
        return clipped

    def _apply_weight_decay(self, variables):
        if self.weight_decay is None or not self._fused_backend():
            return super()._apply_weight_decay(variables)
        import tensorflow as tf

        # Keras' TensorFlow optimizer evaluates the schedule once per weight here; once is enough.
        rate = tf.cast(self.learning_rate, "float32") * tf.cast(self.weight_decay, "float32")
        for variable in variables:
            if isinstance(variable, keras.Variable):
                variable = variable.value  # the tf.Variable, as Keras' TensorFlow optimizer passes it
            if self._use_weight_decay(variable):
                variable.assign_sub(variable * tf.cast(rate, variable.dtype))

    def _fused_backend(self):
        if keras.backend.backend() != "tensorflow":
            return False
        import tensorflow as tf

        return not tf.distribute.has_strategy()

    def _fused(self, gradient, variable):
        if self.amsgrad or not self._fused_backend():
            return False
        import tensorflow as tf

        return (
            isinstance(gradient, tf.Tensor)  # not IndexedSlices
            and hasattr(variable, "handle")
            and keras.backend.standardize_dtype(variable.dtype) in _FUSED_DTYPES
        )
