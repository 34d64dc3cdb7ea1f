"""timm classifiers that take [0,1] images (normalisation inside), their export and loading."""

from rgb.models.factory import (
    NormalizedClassifier,
    Normalize,
    WeightsMismatchError,
    apply_speed_options,
    check_model_name,
    create_model,
)
from rgb.models.io import META_FILE, WEIGHTS_FILE, export_model, library_versions, load, load_with_meta

__all__ = [
    "META_FILE",
    "NormalizedClassifier",
    "Normalize",
    "WEIGHTS_FILE",
    "WeightsMismatchError",
    "apply_speed_options",
    "check_model_name",
    "create_model",
    "export_model",
    "library_versions",
    "load",
    "load_with_meta",
]
