"""The layout of a model directory: the names of what a training run writes.

One directory per run (`saved_models/<name>/`) holds everything needed to use or
continue it, under these names, defined here once for the trainer, the callbacks, the
evaluation and the command-line tools:

```
model.keras            the trained model (architecture, weights, optimizer state)
tokenizer.model        the joint sentencepiece vocabulary
config.toml            the RunConfig that produced it, model fields resolved
training_log.csv       one row per epoch (CSVLogger)
training_curves.png    loss / accuracy / learning rate / BLEU per epoch
logs/                  TensorBoard event files
checkpoints/           epoch_NNN.weights.h5, the last few epochs
backup/                BackupAndRestore's state while a run is unfinished
metrics.json           test scores written by the demo and by training.evaluate
```

`load_model_and_tokenizer(model_dir)` (from `keras_transformer.inference.translator`) reads the
first two back.
"""

# Plain names, no imports: the translator (keras only) and the tokenizer (TensorFlow)
# both read this module. tests/test_callbacks.py checks the tokenizer agrees.
MODEL_FILE = "model.keras"
TOKENIZER_FILE = "tokenizer.model"
CONFIG_FILE = "config.toml"
CSV_LOG_FILE = "training_log.csv"
CURVES_FILE = "training_curves.png"
TENSORBOARD_DIR = "logs"
CHECKPOINT_DIR = "checkpoints"
CHECKPOINT_PATTERN = "epoch_{epoch:03d}.weights.h5"  # Keras fills in the 1-based epoch
BACKUP_DIR = "backup"
METRICS_FILE = "metrics.json"

__all__ = [
    "MODEL_FILE",
    "TOKENIZER_FILE",
    "CONFIG_FILE",
    "CSV_LOG_FILE",
    "CURVES_FILE",
    "TENSORBOARD_DIR",
    "CHECKPOINT_DIR",
    "CHECKPOINT_PATTERN",
    "BACKUP_DIR",
    "METRICS_FILE",
]
