"""Caption and prompt templates: a format string with exactly one `{}`, the slot of the class name.

The embedded CLIP's training captions (rgb.models.embedded_clip), the zero-shot prompts (rgb.zeroshot.prompts) and
the text-brittleness queries (rgb.brittleness.perturb) are all templates filled with class names; the rules live
here, below them.
"""

from __future__ import annotations

from rgb.core.errors import UserError


class PromptError(UserError, ValueError):
    """Templates, class names or descriptions that cannot make a head (one line)."""


def check_templates(templates: list[str]) -> list[str]:
    """Every template has exactly one `{}` (the class name); the pool is not empty; duplicates dropped in order."""
    templates = list(dict.fromkeys(str(t) for t in templates))
    if not templates:
        raise PromptError("the template pool is empty: give prompts.pool and/or prompts.templates")
    for template in templates:
        slots = template.count("{}")
        if slots != 1:
            raise PromptError(f"template {template!r} has {slots} '{{}}' slots; a template needs exactly one "
                              "(for the class name)")
    return templates


def fill(template: str, class_name: str) -> str:
    return template.replace("{}", class_name)


def prompt_class_names(names: list[str]) -> list[str]:
    """Class names as they go into prompts and captions: the dataset's label names with `_` replaced by a space."""
    return [str(n).replace("_", " ") for n in names]
