"""The names of a model directory's files and folders, defined once.

A leaf module (it imports nothing), so that the tokenizers, which write their files
under these names, need not import the model package that reads them
(`keras_transformer.model.directory`, which describes the layout and re-exports
these names).
"""

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
MANIFEST_FILE = "manifest.json"
# A Marian / OPUS-MT model's tokenizer (keras_transformer.marian), in place of tokenizer.model.
MARIAN_SOURCE_SPM_FILE = "source.spm"
MARIAN_TARGET_SPM_FILE = "target.spm"
MARIAN_VOCAB_FILE = "vocab.json"
MARIAN_TOKENIZER_FILE = "marian_tokenizer.json"
