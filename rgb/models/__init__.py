"""Classifiers that take [0,1] images (normalisation inside), in families (timm, openclip, factory), their export
and loading."""

from rgb.models.factory import (
    NormalizedClassifier,
    Normalize,
    WeightsMismatchError,
    apply_speed_options,
    check_model_name,
    create_model,
)
from rgb.models.families import FAMILIES, ModelFamily, family_named, family_of
from rgb.models.io import (
    META_FILE,
    WEIGHTS_FILE,
    ExportFileError,
    export_factory_model,
    export_model,
    library_versions,
    load,
    load_with_meta,
    rebuild,
    rebuild_like,
    write_export,
)
from rgb.models.openclip import (
    LoadedCLIP,
    OpenCLIPClassifier,
    OpenCLIPWeightsError,
    classifier_from_clip,
    create_openclip_classifier,
    load_clip,
    load_clip_of,
    register_architecture,
)

__all__ = [
    "FAMILIES",
    "META_FILE",
    "ExportFileError",
    "LoadedCLIP",
    "ModelFamily",
    "NormalizedClassifier",
    "Normalize",
    "OpenCLIPClassifier",
    "OpenCLIPWeightsError",
    "WEIGHTS_FILE",
    "WeightsMismatchError",
    "apply_speed_options",
    "check_model_name",
    "classifier_from_clip",
    "create_model",
    "create_openclip_classifier",
    "export_factory_model",
    "export_model",
    "family_named",
    "family_of",
    "library_versions",
    "load",
    "load_clip",
    "load_clip_of",
    "load_with_meta",
    "rebuild",
    "rebuild_like",
    "write_export",
    "register_architecture",
]
