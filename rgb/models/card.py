"""The model card of an export: who made the model and where it is described (title, authors, venue, url,
additional_data, bibtex), as RobustBench's model_info and the leaderboard site show it. Given at train time as a
file (`model_card=FILE`, YAML or JSON), as fields (`card.<key>=...`), or both (a field wins over the file's)."""

from __future__ import annotations

from pathlib import Path

import yaml

from rgb.core.errors import UserError

# What a model card may hold (`model_card=FILE` or `card.*` at train time), in the order the site's model page
# lists them (rgb.evaluation.site).
CARD_FIELDS = ("title", "authors", "venue", "url", "additional_data", "bibtex")


class ModelCardError(UserError, ValueError):
    """A model card file that does not read, or a card with a key rgb does not know."""


def read_card_file(path: str | Path) -> dict:
    """The fields of a YAML or JSON card file (JSON is YAML: one reader)."""
    path = Path(str(path))
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise ModelCardError(f"model_card={path}: not a readable YAML or JSON file ({type(err).__name__})") from None
    if not isinstance(data, dict):
        raise ModelCardError(f"model_card={path}: a card is a mapping of {', '.join(CARD_FIELDS)}")
    return data


def model_card(file: str | Path | None, fields: dict | None) -> dict:
    """The card recorded in model.json: the file's fields, then the given ones over them; unset fields left out.
    `additional_data` is a yes/no (training data beyond the benchmark's split, as RobustBench's flag)."""
    card = {**(read_card_file(file) if file else {}), **{k: v for k, v in (fields or {}).items() if v is not None}}
    unknown = sorted(set(card) - set(CARD_FIELDS))
    if unknown:
        raise ModelCardError(f"model card keys {unknown} unknown: the card holds {', '.join(CARD_FIELDS)}")
    if card.get("additional_data") is not None and not isinstance(card["additional_data"], bool):
        raise ModelCardError(f"card.additional_data must be true or false, not {card['additional_data']!r}")
    card = {k: card[k] for k in CARD_FIELDS if card.get(k) not in (None, "")}
    return {k: v if isinstance(v, bool) else str(v) for k, v in card.items()}
