"""Seeded, tagged text perturbations of zero-shot queries (zeroshot-spec section 4, after the brittleness seed).

Every edit is a `Perturbation` tagged (class, type, seed). Its randomness comes from a private RNG derived from
(query text, type, seed) alone, so the same seed gives the same edits whatever the order, batching or subset of the
queries. Types live in one registry, `PERTURBATION_TYPES` (name -> class, edit function).

- Class 1 lexical and Class 2 syntactic edits are generated here (12 types). Choices the spec
  leaves open: punctuation is one type that removes trailing punctuation or, where there is none, adds a period;
  keyword extraction drops scikit-learn stop words but keeps the class name's words; there is no offline
  part-of-speech tagger, so the seed's noun-only extraction becomes class-name-only (filled templates know their
  class name; free-text queries get no such edit); word_shuffle shuffles the extracted keywords, as the seed does.
- Class 3 semantic: `template_synonym` swaps one template word (photo, picture, ...) from a small built-in table;
  `synonym` and `paraphrase` come from a user JSONL file (`load_user_edits`), since no offline resource covers
  synonyms of class names or paraphrases.
- `DEFAULT_TYPES` are the 13 generated types (Classes 1, 2 and `template_synonym`), so a default run shows the
  seed's Class 1 vs 2 vs 3 contrast. An edit that leaves the text unchanged, or that the model's tokenizer maps to
  the query's own tokens (open_clip lowercases: case edits are no-ops for it), is not a perturbation:
  `drop_non_edits` takes such edits out and counts them per type (`n_noop`, `n_same_tokens`).

Stop words are scikit-learn's `ENGLISH_STOP_WORDS` (already a dependency). The QWERTY neighbour table is built here
from the three letter rows: the PyPI typo libraries either seed Python's global `random` module (`typo`), which
would break the per-edit RNG contract, or pull a large unmaintained stack (`nlpaug`).
"""

from __future__ import annotations

import hashlib
import random
import re
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rgb.core.errors import UserError
from rgb.core.files import read_jsonl
from rgb.core.templates import PromptError, check_templates, fill

LEXICAL, SYNTACTIC, SEMANTIC = "lexical", "syntactic", "semantic"

# Query file fields (one JSON object per line); `type` must be one of USER_FILE_TYPES.
USER_FILE_FIELDS = ("query", "type", "perturbed")


class PerturbationError(UserError, ValueError):
    """A one-line problem with the queries, the perturbation types or the user's perturbation file."""


@dataclass(frozen=True)
class Query:
    """A text query; `class_name` is the class a filled template names (None for free-text queries)."""

    text: str
    class_name: str | None = None


@dataclass(frozen=True)
class Perturbation:
    """One edit of queries[query_index]: `text` is the perturbed query."""

    query_index: int
    query: str
    text: str
    perturbation_class: str
    type: str
    seed: int


# type -> key (a whole query, or a class name) -> alternative perturbed texts, from the user's JSONL file.
UserEdits = Mapping[str, Mapping[str, Sequence[str]]]
Edit = Callable[[Query, "random.Random | None", UserEdits], "str | None"]


@dataclass(frozen=True)
class PerturbationType:
    """`edit` returns the perturbed text, or None where the type does not apply to the query.
    `seeded` is False for deterministic edits: they get no RNG and are generated once (tagged with the first seed)."""

    name: str
    perturbation_class: str
    edit: Edit
    seeded: bool = True


_WORD = re.compile(r"[A-Za-z0-9]+(?:['-][A-Za-z0-9]+)*")
_KEYBOARD_ROWS = ("qwertyuiop", "asdfghjkl", "zxcvbnm")


def _keyboard_neighbours() -> dict[str, str]:
    """QWERTY letter -> adjacent letters: same row left/right, and the staggered rows above (i, i+1) and below (i-1, i)."""
    neighbours = {}
    for row_index, row in enumerate(_KEYBOARD_ROWS):
        for i, key in enumerate(row):
            near = [row[j] for j in (i - 1, i + 1) if 0 <= j < len(row)]
            if row_index > 0:
                above = _KEYBOARD_ROWS[row_index - 1]
                near += [above[j] for j in (i, i + 1) if j < len(above)]
            if row_index + 1 < len(_KEYBOARD_ROWS):
                below = _KEYBOARD_ROWS[row_index + 1]
                near += [below[j] for j in (i - 1, i) if 0 <= j < len(below)]
            neighbours[key] = "".join(sorted(near))
    return neighbours


KEYBOARD_NEIGHBOURS = _keyboard_neighbours()

# Class 3 for templates: words of CLIP-style prompt templates and meaning-preserving replacements.
TEMPLATE_SYNONYMS: dict[str, tuple[str, ...]] = {
    "photo": ("picture", "image", "snapshot"),
    "picture": ("photo", "image", "snapshot"),
    "image": ("photo", "picture", "snapshot"),
    "snapshot": ("photo", "picture", "image"),
    "photograph": ("photo", "picture", "image"),
    "drawing": ("sketch", "illustration"),
    "sketch": ("drawing", "illustration"),
    "painting": ("artwork", "picture"),
    "rendering": ("render", "rendition"),
    "big": ("large",),
    "large": ("big",),
    "small": ("little", "tiny"),
    "little": ("small",),
    "bad": ("poor",),
    "good": ("nice", "fine"),
    "nice": ("good",),
    "dark": ("dim",),
    "bright": ("well-lit",),
    "blurry": ("blurred", "unsharp"),
    "cropped": ("clipped", "trimmed"),
    "weird": ("strange", "odd"),
    "pixelated": ("low-resolution",),
}


def _match_case(replacement: str, original: str) -> str:
    if original.isupper() and len(original) > 1:
        return replacement.upper()
    if original[:1].isupper():
        return replacement[:1].upper() + replacement[1:]
    return replacement


def _letter_positions(text: str) -> list[int]:
    return [i for i, char in enumerate(text) if char in string.ascii_letters]


def _class_span(query: Query) -> tuple[int, int] | None:
    """Character span of the class name inside the query (case-insensitive), None when absent."""
    if not query.class_name:
        return None
    start = query.text.lower().find(query.class_name.lower())
    return None if start < 0 else (start, start + len(query.class_name))


def _words(query: Query) -> list[tuple[re.Match, bool]]:
    """The query's words, each with whether it lies inside the class name."""
    span = _class_span(query)
    return [(m, span is not None and span[0] <= m.start() and m.end() <= span[1]) for m in _WORD.finditer(query.text)]


def _keywords(query: Query) -> list[str]:
    """Words that are not stop words, in order; the class name's words are always kept (e.g. 'fire' in 'fire truck')."""
    # scikit-learn takes ~1.5 s to import: here, not at the top, where evaluate.py's schema (the perturbation types) reads
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    return [m.group() for m, in_class in _words(query) if in_class or m.group().lower() not in ENGLISH_STOP_WORDS]


def _lowercase(query: Query, rng: None, user: UserEdits) -> str:
    return query.text.lower()


def _uppercase(query: Query, rng: None, user: UserEdits) -> str:
    return query.text.upper()


def _title_case(query: Query, rng: None, user: UserEdits) -> str:
    return string.capwords(query.text)


def _keyboard_typo(query: Query, rng: random.Random, user: UserEdits) -> str | None:
    positions = [i for i in _letter_positions(query.text) if query.text[i].lower() in KEYBOARD_NEIGHBOURS]
    if not positions:
        return None
    i = rng.choice(positions)
    typed = rng.choice(KEYBOARD_NEIGHBOURS[query.text[i].lower()])
    return query.text[:i] + _match_case(typed, query.text[i]) + query.text[i + 1:]


def _char_deletion(query: Query, rng: random.Random, user: UserEdits) -> str | None:
    positions = _letter_positions(query.text)
    if len(positions) < 2:
        return None
    i = rng.choice(positions)
    return query.text[:i] + query.text[i + 1:]


def _char_insertion(query: Query, rng: random.Random, user: UserEdits) -> str | None:
    """A random letter inserted right after a random letter (so it lands inside or at the end of a word)."""
    positions = _letter_positions(query.text)
    if not positions:
        return None
    i = rng.choice(positions)
    inserted = _match_case(rng.choice(string.ascii_lowercase), query.text[i])
    return query.text[:i + 1] + inserted + query.text[i + 1:]


def _char_substitution(query: Query, rng: random.Random, user: UserEdits) -> str | None:
    positions = _letter_positions(query.text)
    if not positions:
        return None
    i = rng.choice(positions)
    other = rng.choice(string.ascii_lowercase.replace(query.text[i].lower(), ""))
    return query.text[:i] + _match_case(other, query.text[i]) + query.text[i + 1:]


def _char_swap(query: Query, rng: random.Random, user: UserEdits) -> str | None:
    """Two adjacent, different letters of one word exchanged."""
    text = query.text
    pairs = [i for i in range(len(text) - 1)
             if text[i] in string.ascii_letters and text[i + 1] in string.ascii_letters and text[i] != text[i + 1]]
    if not pairs:
        return None
    i = rng.choice(pairs)
    return text[:i] + text[i + 1] + text[i] + text[i + 2:]


def _punctuation(query: Query, rng: None, user: UserEdits) -> str:
    """Trailing punctuation removed where there is some, else a trailing period added."""
    stripped = query.text.rstrip()
    kept = stripped.rstrip(string.punctuation)
    return kept.rstrip() if kept != stripped else stripped + "."


def _keywords_only(query: Query, rng: None, user: UserEdits) -> str | None:
    keywords = _keywords(query)
    return " ".join(keywords) if keywords else None


def _class_name_only(query: Query, rng: None, user: UserEdits) -> str | None:
    return query.class_name or None


def _word_shuffle(query: Query, rng: random.Random, user: UserEdits) -> str | None:
    """The keywords in a random order different from theirs (the seed shuffles extracted words only)."""
    keywords = _keywords(query)
    if len(set(keywords)) < 2:
        return None
    shuffled = list(keywords)
    rng.shuffle(shuffled)
    if shuffled == keywords:
        shuffled = shuffled[1:] + shuffled[:1]
    return " ".join(shuffled)


def _template_synonym(query: Query, rng: random.Random, user: UserEdits) -> str | None:
    """One template word outside the class name replaced by a synonym from TEMPLATE_SYNONYMS."""
    candidates = [m for m, in_class in _words(query) if not in_class and m.group().lower() in TEMPLATE_SYNONYMS]
    if not candidates:
        return None
    word = rng.choice(candidates)
    synonym = rng.choice(TEMPLATE_SYNONYMS[word.group().lower()])
    return query.text[:word.start()] + _match_case(synonym, word.group()) + query.text[word.end():]


def _from_user_file(type_name: str) -> Edit:
    """A user-file edit: an entry keyed by the whole query replaces it; one keyed by the query's class name
    replaces the class name inside the query. Several alternatives: the seed picks one."""

    def edit(query: Query, rng: random.Random, user: UserEdits) -> str | None:
        entries = user.get(type_name, {})
        if query.text in entries:
            return rng.choice(entries[query.text])
        span = _class_span(query)
        if span is not None and query.class_name in entries:
            return query.text[:span[0]] + rng.choice(entries[query.class_name]) + query.text[span[1]:]
        return None

    return edit


USER_FILE_TYPES = ("synonym", "paraphrase")

PERTURBATION_TYPES: dict[str, PerturbationType] = {
    kind.name: kind
    for kind in (
        PerturbationType("lowercase", LEXICAL, _lowercase, seeded=False),
        PerturbationType("uppercase", LEXICAL, _uppercase, seeded=False),
        PerturbationType("title_case", LEXICAL, _title_case, seeded=False),
        PerturbationType("keyboard_typo", LEXICAL, _keyboard_typo),
        PerturbationType("char_deletion", LEXICAL, _char_deletion),
        PerturbationType("char_insertion", LEXICAL, _char_insertion),
        PerturbationType("char_substitution", LEXICAL, _char_substitution),
        PerturbationType("char_swap", LEXICAL, _char_swap),
        PerturbationType("punctuation", LEXICAL, _punctuation, seeded=False),
        PerturbationType("keywords_only", SYNTACTIC, _keywords_only, seeded=False),
        PerturbationType("class_name_only", SYNTACTIC, _class_name_only, seeded=False),
        PerturbationType("word_shuffle", SYNTACTIC, _word_shuffle),
        PerturbationType("template_synonym", SEMANTIC, _template_synonym),
        *(PerturbationType(name, SEMANTIC, _from_user_file(name)) for name in USER_FILE_TYPES),
    )
}

# The generated types (Classes 1 and 2, and Class 3's template synonyms): what runs when no type is named.
DEFAULT_TYPES = tuple(name for name in PERTURBATION_TYPES if name not in USER_FILE_TYPES)


def perturbation_type(name: str) -> PerturbationType:
    """The registry entry for `name`; an unknown name is an error that lists the known ones."""
    try:
        return PERTURBATION_TYPES[name]
    except KeyError:
        raise PerturbationError(
            f"unknown perturbation type {name!r}; known: {', '.join(PERTURBATION_TYPES)}") from None


def template_queries(templates: Sequence[str], class_names: Sequence[str]) -> list[Query]:
    """Every template filled with every class name (template-major), each query knowing its class name; templates
    follow the rule of the zero-shot prompts (rgb.core.templates)."""
    if not templates:
        return []  # generate() names an empty query set
    try:
        check_templates(templates)
    except PromptError as err:
        raise PerturbationError(str(err)) from None
    return [Query(fill(template, name), name) for template in templates for name in class_names]


def load_user_edits(path: str | Path) -> dict[str, dict[str, list[str]]]:
    """Read a JSONL file of {"query": ..., "type": "synonym"|"paraphrase", "perturbed": ...} lines (blank lines
    skipped); `query` is a whole query or a class name. Returns type -> query -> perturbed texts."""
    path = Path(path)
    edits: dict[str, dict[str, list[str]]] = {}
    for number, record in read_jsonl(path, PerturbationError, "perturbation file"):
        if (not isinstance(record, dict)
                or not all(isinstance(record.get(key), str) and record[key].strip() for key in USER_FILE_FIELDS)):
            raise PerturbationError(
                f"{path}:{number}: expected an object with non-empty string fields {', '.join(USER_FILE_FIELDS)}")
        if record["type"] not in USER_FILE_TYPES:
            raise PerturbationError(
                f"{path}:{number}: type {record['type']!r} is not read from a file; use one of {', '.join(USER_FILE_TYPES)}")
        edits.setdefault(record["type"], {}).setdefault(record["query"], []).append(record["perturbed"])
    return edits


def edit_rng(query: str, type_name: str, seed: int) -> random.Random:
    """The private RNG of one (query, type, seed): a hash, so it depends on nothing else."""
    digest = hashlib.sha256(f"{seed}\x1f{type_name}\x1f{query}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def generate(queries: Sequence[Query], types: Sequence[str] = DEFAULT_TYPES, seeds: Sequence[int] = (0,),
             user_edits: UserEdits | None = None) -> list[Perturbation]:
    """All applicable edits, type by type, then seed by seed, then query by query. A type that does not apply to
    a query (no letters to edit, no class name, no file entry) yields no edit for it; deterministic types are
    generated once, tagged with seeds[0]."""
    if not queries:
        raise PerturbationError("empty query set: nothing to perturb")
    if not seeds:
        raise PerturbationError("no seeds given")
    kinds = [perturbation_type(name) for name in types]
    if not kinds:
        raise PerturbationError(f"no perturbation types given; known: {', '.join(PERTURBATION_TYPES)}")
    user_edits = user_edits or {}
    missing = [kind.name for kind in kinds if kind.name in USER_FILE_TYPES and kind.name not in user_edits]
    if missing:
        raise PerturbationError(f"perturbation type(s) {', '.join(missing)} come from a user file with entries for them")
    perturbations = []
    for kind in kinds:
        for seed in seeds if kind.seeded else seeds[:1]:
            for index, query in enumerate(queries):
                rng = edit_rng(query.text, kind.name, seed) if kind.seeded else None
                text = kind.edit(query, rng, user_edits)
                if text is not None:
                    perturbations.append(
                        Perturbation(index, query.text, text, kind.perturbation_class, kind.name, seed))
    return perturbations


def drop_non_edits(perturbations: Sequence[Perturbation], tokenize: Callable[[list[str]], object] | None = None
                   ) -> tuple[list[Perturbation], dict[str, dict[str, int]]]:
    """(the edits that change what the model reads, per type {"n_noop", "n_same_tokens"}): n_noop counts edits
    whose text equals the query, n_same_tokens those whose tokens (`tokenize(texts)` -> one row per text, e.g.
    open_clip's tokenizer) equal the query's. Every type of `perturbations` gets a count, 0 where none dropped."""
    counts = {item.type: {"n_noop": 0, "n_same_tokens": 0} for item in perturbations}
    changed = [item for item in perturbations if item.text != item.query]
    for item in perturbations:
        if item.text == item.query:
            counts[item.type]["n_noop"] += 1
    if tokenize is None or not changed:
        return changed, counts
    texts = list(dict.fromkeys([item.query for item in changed] + [item.text for item in changed]))
    rows = {text: tuple(row) for text, row in zip(texts, _token_rows(tokenize(texts)))}
    kept = []
    for item in changed:
        if rows[item.text] == rows[item.query]:
            counts[item.type]["n_same_tokens"] += 1
        else:
            kept.append(item)
    return kept, counts


def _token_rows(tokens) -> list[list[int]]:
    return tokens.tolist() if hasattr(tokens, "tolist") else [list(row) for row in tokens]

