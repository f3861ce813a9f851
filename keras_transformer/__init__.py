"""keras-transformer: the Transformer of "Attention Is All You Need" for Keras 3.

Runs on TensorFlow, JAX and PyTorch (`KERAS_BACKEND`). The package is laid out by role
(see docs/architecture.md):

- `layers`: attention, feed-forward, embeddings, encoder and decoder blocks, masks.
- `model`: `TransformerConfig` (the architecture) and the functional `Transformer`.
- `data`: corpus readers, the demo corpus, the subword tokenizer, the tf.data pipeline.
- `train`: the paper's optimizer, schedule, loss and metrics; callbacks, checkpoints,
  precision, and the whole run from a TOML config.
- `inference`: cached greedy and beam search, ensembles, `Translator`, scoring, SavedModel export.
- `distribute`: distribution strategies on each backend.
- `cli`: the `kt-*` commands.

Importing the package registers every serializable class (layers, model, schedule, loss,
metrics), so `keras.saving.load_model("model.keras")` works after `import
keras_transformer`. The model side uses `keras` and `keras.ops` only and is imported
here; what is TensorFlow by nature (tokenizer, tf.data pipeline, `Translator`, export)
is imported on first use, so that the package stays light on the JAX and PyTorch backends.
"""

from keras_transformer.lazy_names import lazy_getattr

from keras_transformer.cli import common as _cli_common

if _cli_common.is_command_process():  # a kt-* command: quiet TensorFlow before Keras loads it
    _cli_common.setup_environment()

from keras_transformer import distribute, layers  # noqa: E402
from keras_transformer.model import PRESETS, Transformer, TransformerConfig, build_transformer  # noqa: E402
from keras_transformer.special_tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID  # noqa: E402
# compile_transformer's module imports the rest of what a saved model may hold (FusedAdam,
# BudgetSchedule, PerUpdateSchedule), so each is registered with Keras' serialization.
from keras_transformer.train.compile import compile_transformer  # noqa: E402
from keras_transformer.train.config import TrainingConfig  # noqa: E402
from keras_transformer.train.losses import LabelSmoothedCrossEntropy  # noqa: E402
from keras_transformer.train.metrics import MaskedAccuracy, Perplexity  # noqa: E402
from keras_transformer.train.schedules import TransformerSchedule  # noqa: E402

from keras_transformer.version import __version__  # noqa: E402

# name -> module that defines it; imported when first accessed (these import TensorFlow).
_LAZY = {
    "SubwordTokenizer": "keras_transformer.data.tokenizer",
    "train_tokenizer": "keras_transformer.data.tokenizer",
    "Translator": "keras_transformer.inference.translator",
    "export_saved_model": "keras_transformer.inference.export",
    "export_ctranslate2": "keras_transformer.inference.ctranslate2_export",
    "CTranslate2Translator": "keras_transformer.inference.ctranslate2_translator",
    "RunConfig": "keras_transformer.train.run_config",
    "run_training": "keras_transformer.train.run",
    "average_checkpoints": "keras_transformer.train.checkpoints",
    # Pretrained Marian / OPUS-MT translators (the `marian` extra; see docs/pretrained.md).
    "import_marian": "keras_transformer.marian.importer",
    "MarianTokenizer": "keras_transformer.marian.tokenizer",
    "save_preset": "keras_transformer.presets",
    "load_preset": "keras_transformer.presets",
}


__getattr__ = lazy_getattr("keras_transformer", _LAZY, globals())


__all__ = [
    "layers",
    "distribute",
    "PRESETS",
    "TransformerConfig",
    "Transformer",
    "build_transformer",
    "TrainingConfig",
    "compile_transformer",
    "TransformerSchedule",
    "LabelSmoothedCrossEntropy",
    "MaskedAccuracy",
    "Perplexity",
    "PAD_ID",
    "UNK_ID",
    "BOS_ID",
    "EOS_ID",
    *_LAZY,
]
