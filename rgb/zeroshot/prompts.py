"""Prompt templates, class names and description files, checked before any text is encoded (the template rules,
`check_templates`, `fill` and `prompt_class_names`, are rgb.core.templates').

The template pool `imagenet80` is CLIP's 80 ImageNet templates as open_clip ships them in its package
(`open_clip.zero_shot_metadata`), turned into format strings; `simple` is open_clip's short list.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

from rgb.core.templates import PromptError, fill


def _format_strings(templates) -> list[str]:
    """open_clip stores templates as callables c -> text; calling them with '{}' gives the format string."""
    return [t("{}") if callable(t) else str(t) for t in templates]


def _imagenet80() -> list[str]:
    from open_clip.zero_shot_metadata import OPENAI_IMAGENET_TEMPLATES

    return _format_strings(OPENAI_IMAGENET_TEMPLATES)


def _simple() -> list[str]:
    from open_clip.zero_shot_metadata import SIMPLE_IMAGENET_TEMPLATES

    return _format_strings(SIMPLE_IMAGENET_TEMPLATES)


POOLS = {"imagenet80": _imagenet80, "simple": _simple, "none": list}


def template_pool(name: str) -> list[str]:
    if name not in POOLS:
        close = difflib.get_close_matches(name, POOLS, n=3, cutoff=0.0)
        raise PromptError(f"unknown template pool {name!r}; known: {', '.join(close)}")
    return POOLS[name]()


def load_descriptions(path: str | Path, class_names: list[str]) -> dict[str, list[str]]:
    """A JSON file class name -> list of descriptor strings, keyed by prompt class name (dataset `_` names
    accepted). Unknown class names or non-string descriptors are refused in one line."""
    path = Path(path)
    if not path.is_file():
        raise PromptError(f"descriptions file {path} does not exist")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise PromptError(f"descriptions file {path} is not JSON ({err})") from None
    if not isinstance(raw, dict):
        raise PromptError(f"descriptions file {path} must map class name -> list of strings")
    known = set(class_names)
    descriptions, unknown = {}, []
    for name, descriptors in raw.items():
        key = str(name).replace("_", " ")
        if key not in known:
            unknown.append(str(name))
            continue
        if not isinstance(descriptors, list) or not descriptors or not all(isinstance(d, str) and d.strip()
                                                                          for d in descriptors):
            raise PromptError(f"descriptions file {path}: {name!r} must map to a non-empty list of non-empty "
                              f"strings, got {descriptors!r}")
        descriptions[key] = descriptors
    if unknown:
        hints = {u: difflib.get_close_matches(u.replace("_", " "), class_names, n=1) for u in unknown[:5]}
        shown = ", ".join(f"{u!r}" + (f" (did you mean {h[0]!r}?)" if h else "") for u, h in hints.items())
        raise PromptError(f"descriptions file {path} names {len(unknown)} unknown class(es): {shown}")
    return descriptions


def description_question(class_name: str) -> str:
    """What to ask a language model for the descriptors of a class (spec §2, description enrichment)."""
    return f"What are useful visual features for distinguishing a {class_name} in a photo?"


def described(template: str, class_name: str, descriptor: str) -> str:
    return f"{fill(template, class_name)}, which has {descriptor}"
