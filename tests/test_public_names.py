"""The top-level namespace: the names a README reader needs, each resolving; 0.4's removals gone."""

import pytest

import keras_transformer as kt


def test_every_public_name_resolves_and_the_namespace_stays_small():
    assert len(kt.__all__) <= 30, kt.__all__
    for name in kt.__all__:
        assert getattr(kt, name) is not None, name


@pytest.mark.parametrize(
    "name, home",
    [
        ("Ensemble", "keras_transformer.inference.ensemble"),
        ("load_ensemble", "keras_transformer.inference.ensemble"),
        ("FusedAdam", "keras_transformer.train.fused_adam"),
        ("BudgetSchedule", "keras_transformer.train.budget_schedule"),
        ("StepBudgetEstimator", "keras_transformer.train.budget_estimate"),
        ("Hypothesis", "keras_transformer.inference.translator"),
    ],
)
def test_names_moved_off_the_top_level_live_in_their_subpackage(name, home):
    import importlib

    assert name not in kt.__all__
    with pytest.raises(AttributeError, match=f"has no attribute '{name}'"):
        getattr(kt, name)
    assert getattr(importlib.import_module(home), name).__name__ == name


@pytest.mark.parametrize(
    "name",
    ["LateDropout", "RDropCrossEntropy", "duplicate_batches", "load_checkpoint_ensemble", "MemoryModel",
     "TranslationMemory", "build_translation_memory"],
)
def test_the_options_0_4_removed_are_gone(name):
    with pytest.raises(AttributeError, match=f"has no attribute '{name}'"):
        getattr(kt, name)
