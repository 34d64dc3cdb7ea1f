"""Text-side robustness of zero-shot queries: the perturbation generator and the ranking / brittleness metrics."""

import json
import math
import random
import string

import numpy as np
import pytest
import torch

from rgb.brittleness.metrics import (
    brittleness_index,
    classification_view,
    inter_distance,
    instability,
    overlap_at_k,
    overlap_counts,
    query_table,
    rank_images,
    rbo_ext,
    summarize,
    text_distance,
)
from rgb.brittleness.perturb import (
    DEFAULT_TYPES,
    KEYBOARD_NEIGHBOURS,
    LEXICAL,
    PERTURBATION_TYPES,
    SEMANTIC,
    SYNTACTIC,
    Perturbation,
    PerturbationError,
    Query,
    drop_non_edits,
    generate,
    load_user_edits,
    template_queries,
)

TEMPLATES = ["a photo of a {}.", "a bad photo of the {}.", "itap of a {}", "a drawing of my {}!"]
CLASSES = ["fire truck", "goldfish", "tree frog"]


def spec_rbo_ext(a, b, p):
    """The spec's formula, term by term, with Python sets."""
    depth = len(a)
    overlaps = [len(set(a[:d]) & set(b[:d])) for d in range(1, depth + 1)]
    total = sum(overlaps[d - 1] / d * p**d for d in range(1, depth + 1))
    return overlaps[-1] / depth * p**depth + (1 - p) / p * total


# --- RBO and overlap ------------------------------------------------------------------------------------------------

def test_rbo_reference_cases():
    ranking = torch.arange(50)
    assert float(rbo_ext(ranking, ranking)) == 1.0
    assert float(instability(ranking, ranking)) == 0.0
    # reversed, D = 4, p = 1/2: X = (0, 0, 2, 4); RBO = 1 * 1/16 + 1 * (2/3 * 1/8 + 1 * 1/16) = 5/24
    assert float(rbo_ext(torch.arange(4), torch.arange(4).flip(0), p=0.5)) == pytest.approx(5 / 24, abs=1e-15)
    # disjoint lists: X = 0 everywhere
    assert float(rbo_ext(torch.tensor([0, 1, 2]), torch.tensor([3, 4, 5]))) == 0.0
    # first two swapped, third differs, p = 1/2: X = (0, 2, 2); RBO = 2/3 * 1/8 + 1 * (1 * 1/4 + 2/3 * 1/8) = 5/12
    assert float(rbo_ext(torch.tensor([0, 1, 2]), torch.tensor([1, 0, 3]), p=0.5)) == pytest.approx(5 / 12, abs=1e-15)


def test_rbo_matches_the_spec_formula_batched():
    g = torch.Generator().manual_seed(0)
    for depth in (1, 2, 7, 60):
        a = torch.stack([torch.randperm(depth, generator=g) for _ in range(20)])
        b = torch.stack([torch.randperm(depth, generator=g) for _ in range(20)])
        for p in (0.5, 0.9, 0.99):
            batched = rbo_ext(a, b, p)
            assert batched.shape == (20,)
            expected = [spec_rbo_ext(a[i].tolist(), b[i].tolist(), p) for i in range(20)]
            assert batched.tolist() == pytest.approx(expected, abs=1e-12)
            assert float(rbo_ext(a[3], b[3], p)) == pytest.approx(expected[3], abs=1e-12)
    # truncated lists over a larger universe (top-D of different collections' orders)
    a = torch.stack([torch.randperm(100, generator=g)[:30] for _ in range(10)])
    b = torch.stack([torch.randperm(100, generator=g)[:30] for _ in range(10)])
    expected = [spec_rbo_ext(a[i].tolist(), b[i].tolist(), 0.9) for i in range(10)]
    assert rbo_ext(a, b, 0.9).tolist() == pytest.approx(expected, abs=1e-12)


def test_rbo_agrees_with_the_rbo_package():
    rbo = pytest.importorskip("rbo")
    rng = np.random.default_rng(0)
    for depth in (2, 10, 100, 500):
        for p in (0.5, 0.9, 0.99):
            a, b = rng.permutation(depth), rng.permutation(depth)
            reference = rbo.RankingSimilarity(a.tolist(), b.tolist()).rbo(p=p, ext=True)
            assert abs(float(rbo_ext(torch.from_numpy(a), torch.from_numpy(b), p)) - reference) < 1e-9


def test_overlap_at_k_by_hand():
    a, b = torch.tensor([0, 1, 2, 3]), torch.tensor([1, 0, 3, 2])
    assert [float(overlap_at_k(a, b, k)) for k in (1, 2, 3, 4)] == pytest.approx([0.0, 1.0, 2 / 3, 1.0])
    assert overlap_counts(a, b).tolist() == [0, 2, 2, 4]
    with pytest.raises(ValueError, match="1 <= k <= 4"):
        overlap_at_k(a, b, 5)


@pytest.mark.parametrize("a, b, message", [
    (torch.tensor([0, 1, 1]), torch.tensor([0, 1, 2]), "same item twice"),
    (torch.tensor([0, 1]), torch.tensor([0, 1, 2]), "same shape"),
    (torch.tensor([0, -1]), torch.tensor([0, 1]), ">= 0"),
    (torch.tensor([0.0, 1.0]), torch.tensor([0, 1]), "integer"),
    (torch.tensor([], dtype=torch.long), torch.tensor([], dtype=torch.long), "non-empty"),
])
def test_bad_rankings(a, b, message):
    with pytest.raises(ValueError, match=message):
        rbo_ext(a, b)


def test_rbo_p_out_of_range():
    with pytest.raises(ValueError, match=r"\(0, 1\)"):
        rbo_ext(torch.arange(3), torch.arange(3), p=1.0)


# --- rankings, distances, brittleness ----------------------------------------------------------------------------------

def test_ranking_ties_go_to_the_lower_row():
    images = torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.0, 2.0], [1.0, 0.0]])
    assert rank_images(torch.tensor([[1.0, 0.0]]), images).tolist() == [[1, 3, 0, 2]]


def test_text_distance_by_hand():
    u = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [3.0, 4.0]])
    v = torch.tensor([[2.0, 0.0], [0.0, 5.0], [-1.0, 0.0], [4.0, 3.0]])
    assert text_distance(u, v).tolist() == pytest.approx([0.0, 1.0, 2.0, 1 - 24 / 25], abs=1e-15)
    assert float(text_distance(u[:1], u[:1])) == 0.0


def test_inter_distance_is_the_mean_over_pairs():
    features = torch.randn(9, 5, generator=torch.Generator().manual_seed(1))
    pairs = [float(text_distance(features[i:i + 1], features[j:j + 1]))
             for i in range(9) for j in range(i + 1, 9)]
    assert inter_distance(features) == pytest.approx(sum(pairs) / len(pairs), abs=1e-12)
    with pytest.raises(ValueError, match="at least 2 queries"):
        inter_distance(features[:1])


def test_brittleness_index_by_hand_stable_and_undefined_values():
    values = brittleness_index(torch.tensor([0.5, 0.0, 0.3]), torch.tensor([0.1, 0.2, 0.0]), inter=0.8)
    assert float(values[0]) == pytest.approx(math.log(4.0))
    assert float(values[1]) == -math.inf  # the text moved, the ranking did not: the least brittle case
    assert math.isnan(float(values[2]))  # intra 0: undefined


# --- the per-query table, its summary, the classification view ------------------------------------------------------

def _perturbation(query_index, type_name, perturbation_class=LEXICAL):
    return Perturbation(query_index, f"q{query_index}", f"q{query_index}'", perturbation_class, type_name, 0)


def test_query_table_by_hand():
    angles = torch.tensor([0.0, 0.3, 0.9, 1.4, 2.0])
    images = torch.stack([angles.cos(), angles.sin()], 1)
    queries = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    perturbed = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    items = [_perturbation(0, "lowercase"), _perturbation(1, "keyboard_typo"), _perturbation(1, "lowercase")]
    table = query_table(images, queries, perturbed, items, ks=(1, 2, 6))
    assert list(table["perturbation_type"]) == ["lowercase", "keyboard_typo", "lowercase"]
    # identical features: instability 0, intra 0, B undefined
    assert table["instability"][0] == 0.0 and table["intra"][0] == 0.0 and math.isnan(table["brittleness"][0])
    # query 1 ranks images 3,4,2,1,0 (by angle to 90 deg), its edit ranks 0,1,2,3,4
    expected = float(instability(torch.tensor([3, 4, 2, 1, 0]), torch.arange(5)))
    assert table["instability"][1] == pytest.approx(expected, abs=1e-15)
    assert table["intra"][1] == pytest.approx(1.0)
    assert table["inter"][1] == pytest.approx(1.0)
    assert table["brittleness"][1] == pytest.approx(math.log(expected))
    assert table["overlap@1"].tolist() == [1.0, 0.0, 1.0]
    assert table["overlap@2"].tolist() == [1.0, 0.0, 1.0]
    assert np.isnan(table["overlap@6"]).all()  # k beyond the 5 images

    summary = summarize(table)
    assert [(row["perturbation_type"], row["n"]) for row in summary] == [("lowercase", 2), ("keyboard_typo", 1)]
    lowercase = summary[0]
    assert lowercase["brittleness_undefined"] == 2 and math.isnan(lowercase["brittleness_mean"])
    assert lowercase["instability_mean"] == 0.0 and lowercase["overlap@1_mean"] == 1.0
    assert summary[1]["brittleness_undefined"] == 0
    assert summary[1]["brittleness_median"] == pytest.approx(math.log(expected))
    assert summary[0]["brittleness_stable"] == summary[1]["brittleness_stable"] == 0


def test_stable_rankings_are_counted_apart_and_dropped_edits_reported():
    images = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])
    queries = torch.tensor([[1.0, 0.0], [0.0, 1.0]])  # two queries: an inter distance
    perturbed = torch.tensor([[0.99, 0.14], [0.0, 1.0], [0.98, 0.2]])  # rows 0, 2: moved a little, same ranking
    items = [_perturbation(0, "char_swap"), _perturbation(0, "char_swap"), _perturbation(0, "char_swap")]
    table = query_table(images, queries, perturbed, items, ks=(1,))
    assert table["brittleness"][0] == -math.inf and table["brittleness"][2] == -math.inf
    assert np.isfinite(table["brittleness"][1])
    (row, dropped_row) = summarize(table, {"char_swap": {"n_noop": 1, "n_same_tokens": 2},
                                           "uppercase": {"n_noop": 0, "n_same_tokens": 5}})
    assert (row["brittleness_stable"], row["brittleness_undefined"]) == (2, 0)
    assert row["brittleness_mean"] == pytest.approx(table["brittleness"][1])  # the mean of finite B
    assert row["brittleness_median"] == -math.inf  # two of three are the lowest B there is
    assert (row["n"], row["n_noop"], row["n_same_tokens"]) == (3, 1, 2)
    assert (dropped_row["perturbation_type"], dropped_row["perturbation_class"], dropped_row["n"]) == (
        "uppercase", LEXICAL, 0)
    assert dropped_row["n_same_tokens"] == 5 and math.isnan(dropped_row["instability_mean"])


def test_edits_that_change_nothing_the_model_reads_are_dropped():
    import open_clip

    queries = template_queries(["a photo of a {}.", "A Photo Of The {}"], ["goldfish", "Tree Frog"])
    items = generate(queries, types=["lowercase", "uppercase", "title_case", "char_swap", "punctuation"])
    kept, counts = drop_non_edits(items, open_clip.get_tokenizer("ViT-B-32"))
    assert {item.type for item in kept} == {"char_swap", "punctuation"}  # open_clip lowercases every text
    assert counts["lowercase"] == {"n_noop": 1, "n_same_tokens": 3}  # "a photo of a goldfish." is lowercase
    assert counts["title_case"]["n_noop"] == 1 and sum(counts["title_case"].values()) == 4
    assert counts["uppercase"] == {"n_noop": 0, "n_same_tokens": 4}
    assert counts["char_swap"] == {"n_noop": 0, "n_same_tokens": 0}
    without_tokenizer, plain = drop_non_edits(items)
    assert len(without_tokenizer) == len(items) - 2 and plain["uppercase"] == {"n_noop": 0, "n_same_tokens": 0}


def test_query_table_is_batch_size_independent():
    g = torch.Generator().manual_seed(2)
    images, queries = torch.randn(40, 8, generator=g), torch.randn(6, 8, generator=g)
    items = [_perturbation(i % 6, "char_swap") for i in range(15)]
    perturbed = queries[[item.query_index for item in items]] + 0.3 * torch.randn(15, 8, generator=g)
    whole = query_table(images, queries, perturbed, items, batch_size=1000)
    pieces = query_table(images, queries, perturbed, items, batch_size=4)
    for column in ("instability", "intra", "overlap@10", "brittleness"):
        np.testing.assert_array_equal(whole[column], pieces[column])


def test_query_table_counts_the_perturbed_queries_on_a_bar(capsys):
    g = torch.Generator().manual_seed(2)
    images, queries = torch.randn(40, 8, generator=g), torch.randn(6, 8, generator=g)
    items = [_perturbation(i % 6, "char_swap") for i in range(15)]
    query_table(images, queries, queries[[item.query_index for item in items]], items, batch_size=4)
    err = capsys.readouterr().err
    assert "text robustness" in err and "/15" in err
    query_table(images, queries, queries[[item.query_index for item in items]], items, batch_size=4, progress=False)
    assert "text robustness" not in capsys.readouterr().err


def test_query_table_bad_inputs():
    images, queries = torch.randn(5, 3), torch.randn(2, 3)
    items = [_perturbation(0, "lowercase")]
    with pytest.raises(ValueError, match="collection of 1 image"):
        query_table(images[:1], queries, queries[:1], items)
    with pytest.raises(ValueError, match="empty query set"):
        query_table(images, queries, queries[:0], [])
    with pytest.raises(ValueError, match="empty query set"):
        query_table(images, queries[:0], queries[:1], items)
    with pytest.raises(ValueError, match="2 perturbed feature rows for 1"):
        query_table(images, queries, queries, items)
    with pytest.raises(ValueError, match="one feature size"):
        query_table(torch.randn(5, 4), queries, queries[:1], items)
    with pytest.raises(ValueError, match="outside the 2 original queries"):
        query_table(images, queries, queries[:1], [_perturbation(2, "lowercase")])
    with pytest.raises(ValueError, match="every k must be >= 1"):
        query_table(images, queries, queries[:1], items, ks=(0,))


def test_classification_view_by_hand():
    images = torch.tensor([[1.0, 0.1], [0.1, 1.0], [0.6, 0.5], [0.5, 0.6]])
    labels = torch.tensor([0, 1, 0, 1])
    head = torch.eye(2)
    edited = torch.tensor([[1.0, 0.0], [0.0, 1.3]])  # class 1 prompt now scores higher: image 2 flips to 1
    view = classification_view(images, head, edited, labels)
    assert view == {"n_images": 4, "accuracy": 1.0, "perturbed_accuracy": 0.75, "flip_rate": 0.25}
    with pytest.raises(ValueError, match="labels"):
        classification_view(images, head, edited, labels[:3])


# --- perturbations ------------------------------------------------------------------------------------------------

def test_generator_is_deterministic_and_independent_of_order():
    queries = template_queries(TEMPLATES, CLASSES)
    first = generate(queries, seeds=(0, 1))
    assert first == generate(queries, seeds=(0, 1))
    by_text = {(item.query, item.type, item.seed): item.text for item in first}
    seeded = [name for name in DEFAULT_TYPES if PERTURBATION_TYPES[name].seeded]
    reordered = generate(queries[::-1][:5], types=seeded, seeds=(1,))
    assert reordered and all(by_text[(item.query, item.type, item.seed)] == item.text for item in reordered)
    random.seed(123)  # the global RNG plays no part
    assert generate(queries, seeds=(0, 1)) == first
    differs = {name: any(by_text[(q.text, name, 0)] != by_text[(q.text, name, 1)] for q in queries) for name in seeded}
    assert all(differs.values()), differs


def test_every_generated_type_tags_its_edits():
    queries = template_queries(TEMPLATES, CLASSES)
    items = generate(queries, seeds=(0, 7))
    assert {item.type for item in items} == set(DEFAULT_TYPES)
    assert "template_synonym" in DEFAULT_TYPES and {"synonym", "paraphrase"}.isdisjoint(DEFAULT_TYPES)
    for item in items:
        kind = PERTURBATION_TYPES[item.type]
        assert item.perturbation_class == kind.perturbation_class in (LEXICAL, SYNTACTIC, SEMANTIC)
        assert item.query == queries[item.query_index].text
        assert item.seed in ((0, 7) if kind.seeded else (0,))
    counts = {name: sum(item.type == name for item in items) for name in DEFAULT_TYPES}
    assert counts["keyboard_typo"] == 2 * len(queries) and counts["lowercase"] == len(queries)


def _single_edit(text, type_name, seed=0, class_name=None):
    (item,) = generate([Query(text, class_name)], types=[type_name], seeds=(seed,))
    return item.text


@pytest.mark.parametrize("seed", range(5))
def test_character_edits(seed):
    text = "A photo of the Goldfish."
    typo = _single_edit(text, "keyboard_typo", seed)
    (i,) = [j for j in range(len(text)) if typo[j] != text[j]]
    assert typo[i].lower() in KEYBOARD_NEIGHBOURS[text[i].lower()] and typo[i].isupper() == text[i].isupper()
    deleted = _single_edit(text, "char_deletion", seed)
    assert len(deleted) == len(text) - 1 and any(text[:j] + text[j + 1:] == deleted for j in range(len(text)))
    inserted = _single_edit(text, "char_insertion", seed)
    assert len(inserted) == len(text) + 1 and any(inserted[:j] + inserted[j + 1:] == text for j in range(len(inserted)))
    substituted = _single_edit(text, "char_substitution", seed)
    changed = [j for j in range(len(text)) if substituted[j] != text[j]]
    assert len(changed) == 1 and substituted[changed[0]] in string.ascii_letters
    swapped = _single_edit(text, "char_swap", seed)
    (j, k) = [j for j in range(len(text)) if swapped[j] != text[j]]
    assert k == j + 1 and (swapped[j], swapped[k]) == (text[k], text[j])


def test_case_punctuation_and_syntactic_edits():
    query = Query("a bad photo of the fire truck.", "fire truck")
    edits = {item.type: item.text for item in generate([query])}
    assert edits["lowercase"] == query.text
    assert edits["uppercase"] == "A BAD PHOTO OF THE FIRE TRUCK."
    assert edits["title_case"] == "A Bad Photo Of The Fire Truck."
    assert edits["punctuation"] == "a bad photo of the fire truck"
    assert _single_edit("itap of a dog", "punctuation") == "itap of a dog."
    assert edits["keywords_only"] == "bad photo fire truck"  # 'fire' is a stop word but part of the class name
    assert edits["class_name_only"] == "fire truck"
    assert sorted(edits["word_shuffle"].split()) == sorted(["bad", "photo", "fire", "truck"])
    assert edits["word_shuffle"] != edits["keywords_only"]
    # a free-text query has no class name: class_name_only does not apply
    assert [item.type for item in generate([Query("a dog on a sofa")], types=["class_name_only"])] == []


def test_semantic_edits_from_the_table_and_the_user_file(tmp_path):
    queries = [Query("a photo of a goldfish.", "goldfish"), Query("two dogs play in snow")]
    table_edit = _single_edit(queries[0].text, "template_synonym", class_name="goldfish")
    assert table_edit in {f"a {word} of a goldfish." for word in ("picture", "image", "snapshot")}
    path = tmp_path / "edits.jsonl"
    lines = [{"query": "goldfish", "type": "synonym", "perturbed": "carassius auratus"},
             {"query": "two dogs play in snow", "type": "paraphrase", "perturbed": "a pair of dogs playing in snow"}]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    user = load_user_edits(path)
    items = generate(queries, types=["synonym", "paraphrase"], user_edits=user)
    assert [(item.query_index, item.type, item.perturbation_class, item.text) for item in items] == [
        (0, "synonym", SEMANTIC, "a photo of a carassius auratus."),
        (1, "paraphrase", SEMANTIC, "a pair of dogs playing in snow"),
    ]


@pytest.mark.parametrize("line, message", [
    ("{not json", "not valid JSON"),
    ('{"query": "x", "type": "synonym"}', "non-empty string fields query, type, perturbed"),
    ('["x", "synonym", "y"]', "non-empty string fields"),
    ('{"query": "x", "type": "typo", "perturbed": "y"}', "use one of synonym, paraphrase"),
])
def test_malformed_user_file_names_the_line(tmp_path, line, message):
    path = tmp_path / "edits.jsonl"
    path.write_text('{"query": "a", "type": "synonym", "perturbed": "b"}\n\n' + line + "\n")
    with pytest.raises(PerturbationError, match=f"edits.jsonl:3: .*{message}"):
        load_user_edits(path)


def test_bad_generator_inputs():
    queries = [Query("a photo of a dog.", "dog")]
    with pytest.raises(PerturbationError, match="unknown perturbation type 'typoo'; known: lowercase, uppercase"):
        generate(queries, types=["typoo"])
    with pytest.raises(PerturbationError, match="empty query set"):
        generate([])
    with pytest.raises(PerturbationError, match="synonym come from a user file"):
        generate(queries, types=["synonym"])
    with pytest.raises(PerturbationError, match="exactly one"):
        template_queries(["a photo"], ["dog"])
