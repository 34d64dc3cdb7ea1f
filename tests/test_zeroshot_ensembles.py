"""rgb.zeroshot ensembles and the comparison table on hand-made features (no model): spec §2 and §3. The class-wise
metrics themselves are specified once, in tests/test_evaluation.py (rgb.core.classwise)."""

import math

import pytest
import torch

from helpers import raises_one_line
from rgb.zeroshot.ensembles import (
    EnsembleError,
    ensemble_head,
    ensemble_label,
    ensemble_weights,
    mad_selection,
    matching_margins,
    pseudo_labels,
)
from rgb.zeroshot.report import average_rows, comparison_table, row_metrics

# cos(theta[t, c]): template t's text feature of class c is cos * b_c + sin * b_3, images of class i are b_i.
# Then s * f(x) . e[t, j] = s * cos[t, i] for j = i and 0 otherwise, so Cmm_t[i] = s * cos[t, i] exactly.
COS = torch.tensor([[0.9, 0.8, 0.5], [0.6, 0.9, 0.9], [0.3, 0.9, 0.9], [0.9, 0.9, 0.8]], dtype=torch.float64)
SCALE = 10.0


def hand_made(images_per_class=(2, 2, 2)):
    text = torch.zeros(4, 3, 4, dtype=torch.float64)
    for t in range(4):
        for c in range(3):
            text[t, c, c] = COS[t, c]
            text[t, c, 3] = math.sqrt(1 - COS[t, c] ** 2)
    labels = torch.cat([torch.full((n,), c) for c, n in enumerate(images_per_class)])
    images = torch.eye(4, dtype=torch.float64)[labels]
    return images.float(), text.float(), labels


def softmax(values):
    exps = [math.exp(v) for v in values]
    return [e / sum(exps) for e in exps]


def test_cmm_of_each_template_is_known():
    images, text, labels = hand_made()
    assert torch.equal(pseudo_labels(images, text), labels)
    cmm, classes = matching_margins(images, text, labels, SCALE)
    assert classes.tolist() == [0, 1, 2]
    torch.testing.assert_close(cmm, (SCALE * COS).float())


@pytest.mark.parametrize("k, tau, scores", [
    (0.1, 1.0, [5.0, 6.0, 3.0, 8.0]),  # ceil(0.1 * 3) = 1: the worst class's Cmm
    (0.5, 2.0, [6.5, 7.5, 6.0, 8.5]),  # ceil(0.5 * 3) = 2: the mean of the two worst
])
def test_cpe_weights_are_softmax_of_worst_k_cmm_and_median_selection(k, tau, scores):
    images, text, _ = hand_made()
    weights, kept = ensemble_weights(images, text, "cpe", logit_scale=SCALE, k=k, tau=tau)
    torch.testing.assert_close(weights, torch.tensor(softmax([s / tau for s in scores])))
    # w ordered t2 < t0 < t1 < t3, median = (w0 + w1) / 2: t1 and t3 are kept
    assert kept.tolist() == [False, True, False, True]
    head = ensemble_head(text, weights, kept, "cpe")
    expected = (weights[1] * text[1] + weights[3] * text[3]) / (weights[1] + weights[3])
    torch.testing.assert_close(head, expected)  # similarity space: not renormalised


def test_median_selection_keeps_ties_at_the_median():
    images, text, _ = hand_made()
    same = torch.stack([text[0]] * 3)  # equal weights: all at the median, all kept
    weights, kept = ensemble_weights(images, same, "cpe", logit_scale=SCALE)
    torch.testing.assert_close(weights, torch.full((3,), 1 / 3))
    assert kept.all()


def test_classes_without_pseudo_labelled_images_are_left_out():
    images, text, _ = hand_made(images_per_class=(2, 2, 0))
    cmm, classes = matching_margins(images, text, pseudo_labels(images, text), SCALE)
    assert classes.tolist() == [0, 1]
    torch.testing.assert_close(cmm, (SCALE * COS[:, :2]).float())
    weights, _ = ensemble_weights(images, text, "cpe", logit_scale=SCALE)
    torch.testing.assert_close(weights, torch.tensor(softmax([8.0, 6.0, 3.0, 9.0])))


def test_weights_do_not_depend_on_image_order():
    images, text, _ = hand_made(images_per_class=(3, 2, 4))
    images = images + 0.05 * torch.randn(images.shape, generator=torch.Generator().manual_seed(0))
    images = torch.nn.functional.normalize(images, dim=-1)
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(1))
    for method in ("cpe", "zpe"):
        a, kept_a = ensemble_weights(images, text, method, logit_scale=SCALE)
        b, kept_b = ensemble_weights(images[order], text, method, logit_scale=SCALE)
        torch.testing.assert_close(a, b)
        assert torch.equal(kept_a, kept_b)


def test_labels_shuffled_give_identical_weights_in_the_comparison_table():
    images, text, labels = hand_made(images_per_class=(3, 3, 3))
    templates = [f"t{i} {{}}." for i in range(4)]
    shuffled = labels[torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))]
    table = comparison_table(images, labels, text, templates, logit_scale=SCALE)
    table_shuffled = comparison_table(images, shuffled, text, templates, logit_scale=SCALE)
    assert [row["ensemble"] for row in table] == ["single", "mean", "zpe (test debias)",
                                                  "zpe (median+2*MAD, logit average, test debias)", "cpe (weights)"]
    for row, row_shuffled in zip(table, table_shuffled):
        assert row["templates"] == row_shuffled["templates"]
    assert table[4]["overall"] == 1.0 and table_shuffled[4]["overall"] < 1.0
    assert [t["kept"] for t in table[4]["templates"]] == [False, True, False, True]


def test_single_mean_and_zpe():
    images, text, _ = hand_made()
    weights, kept = ensemble_weights(images, text, "single", template_index=2)
    assert weights.tolist() == [0, 0, 1, 0] and kept.tolist() == [False, False, True, False]
    torch.testing.assert_close(ensemble_head(text, weights, kept, "single"), text[2])
    weights, kept = ensemble_weights(images, text, "mean")
    assert weights.tolist() == [0.25] * 4 and kept.all()
    torch.testing.assert_close(ensemble_head(text, weights, kept, "mean"),
                               torch.nn.functional.normalize(text.sum(0), dim=-1))
    # ZPE: logits l_t(x)_c = s cos[t, c] [c = class of x]; per-class mean over the 6 images = s cos[t, c] / 3,
    # so the corrected max for an image of class i is s cos[t, i] * 2/3 and the score the mean of those.
    weights, kept = ensemble_weights(images, text, "zpe", logit_scale=SCALE)
    scores = (SCALE * COS * 2 / 3).mean(1)
    torch.testing.assert_close(weights, torch.softmax(scores, 0).float())
    assert kept.all()


@pytest.mark.parametrize("call, message", [
    (lambda i, t: ensemble_weights(i, t[:0], "mean"), "templates M >= 1"),
    (lambda i, t: ensemble_weights(i[:0], t, "cpe"), "cpe needs unlabelled images"),
    (lambda i, t: ensemble_weights(i, t, "best"), "unknown prompt ensemble 'best'"),
    (lambda i, t: ensemble_weights(i[:, :2], t, "mean"), "do not match"),
    (lambda i, t: ensemble_weights(i, t, "single", template_index=7), "outside the pool of 4"),
])
def test_bad_input_is_one_line(call, message):
    images, text, _ = hand_made()
    with raises_one_line(EnsembleError, match=message) as err:
        call(images, text)


def zpe_scores_by_hand(images, text, pretraining=None):
    """score_t = mean_x max_c (l_t(x)_c - b_t,c), with loops (the spec's formula, not the vectorised code)."""
    scores = []
    for t in range(text.shape[0]):
        logits = [[SCALE * float(images[n] @ text[t, c]) for c in range(text.shape[1])] for n in range(len(images))]
        bias = [sum(row[c] for row in logits) / len(logits) for c in range(text.shape[1])]
        if pretraining is not None:
            pre = [[SCALE * float(p @ text[t, c]) for c in range(text.shape[1])] for p in pretraining]
            bias = [(bias[c] + sum(row[c] for row in pre) / len(pre)) / 2 for c in range(text.shape[1])]
        scores.append(sum(max(v - b for v, b in zip(row, bias)) for row in logits) / len(logits))
    return torch.tensor(scores)


def test_zpe_select_is_the_published_form():
    images, text, _ = hand_made()
    scores = zpe_scores_by_hand(images, text)
    weights, kept = ensemble_weights(images, text, "zpe_select", logit_scale=SCALE, mad_t=0.5)
    torch.testing.assert_close(weights, torch.softmax(scores, 0).float())
    median = scores.median() if len(scores) % 2 else scores.sort().values[1:3].mean()
    mad = (scores - median).abs().sort().values[1:3].mean()
    assert kept.tolist() == (scores >= median + 0.5 * mad).tolist()
    head = ensemble_head(text, weights, kept, "zpe_select")
    expected = sum(weights[t] * text[t] for t in range(4) if kept[t]) / weights[kept].sum()
    torch.testing.assert_close(head, expected)  # the weighted average of the logits: not renormalised
    pretraining = torch.nn.functional.normalize(torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.2, 0.1, 0.0, 1.0]]), dim=-1)
    debiased, _ = ensemble_weights(images, text, "zpe_select", logit_scale=SCALE, pretraining_features=pretraining)
    torch.testing.assert_close(debiased, torch.softmax(zpe_scores_by_hand(images, text, pretraining), 0).float())
    assert not torch.allclose(debiased, weights)
    assert ensemble_label("zpe_select", pretraining_features=pretraining, mad_t=0.5) == \
        "zpe (median+0.5*MAD, logit average, pretraining+test debias)"
    assert ensemble_label("zpe") == "zpe (test debias)" and ensemble_label("cpe") == "cpe (weights)"
    with pytest.raises(EnsembleError, match=r"pretraining features must be \(images >= 1, 4\)"):
        ensemble_weights(images, text, "zpe_select", pretraining_features=torch.zeros(2, 3))


def test_mad_selection_by_hand():
    scores = torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0])  # median 2, MAD 1
    assert mad_selection(scores, 0.5).tolist() == [False, False, False, True, True]
    assert mad_selection(scores, 0.0).tolist() == [False, False, True, True, True]
    assert mad_selection(torch.tensor([0.0, 1.0, 2.0, 3.0, 3.5]), 2.0).tolist() == [False] * 4 + [True]  # best kept


def test_cmm_units_are_a_parameter():
    images, text, _ = hand_made()
    logit, _ = ensemble_weights(images, text, "cpe", logit_scale=SCALE)
    cosine, _ = ensemble_weights(images, text, "cpe", logit_scale=SCALE, cmm_units="cosine")
    torch.testing.assert_close(cosine, torch.tensor(softmax([0.5, 0.6, 0.3, 0.8])))  # Cmm_t[i] = cos[t, i]
    assert not torch.allclose(logit, cosine)
    with pytest.raises(EnsembleError, match="unknown Cmm units 'degrees'"):
        ensemble_weights(images, text, "cpe", cmm_units="degrees")


def test_the_table_takes_fixed_heads_and_any_worst_k_and_averages_over_datasets():
    images, text, labels = hand_made(images_per_class=(3, 3, 3))
    templates = [f"t{i} {{}}." for i in range(4)]
    names = text[3]  # a fixed head: template 3 alone
    table = comparison_table(images, labels, text, templates, logit_scale=SCALE, methods=("mean",),
                             heads={"clip (class names)": names}, worst_k=(1, 2, 5))
    assert [r["ensemble"] for r in table] == ["clip (class names)", "mean"] and table[0]["templates"] == []
    metrics = row_metrics(table[0])
    assert list(metrics) == ["overall", "worst@1", "worst@2", "worst@5", "hm", "gm"]
    assert metrics["worst@5"] is None  # 3 classes: worst@5 is not a number
    other = [dict(r, overall=r["overall"] / 2) for r in table]
    averaged = average_rows([table, other, table[1:]])
    assert [r["ensemble"] for r in averaged] == ["clip (class names)", "mean"]
    assert averaged[1]["overall"] == pytest.approx(table[1]["overall"] * (1 + 0.5 + 1) / 3)
    assert averaged[1]["datasets"] == 3 and averaged[1]["worst@5"] is None
    assert averaged[0]["datasets"] == 2 and averaged[0]["overall"] is None  # missing from one: no average


def test_each_ensemble_name_the_schemas_read_has_its_function():
    """The names train.py's and evaluate.py's schemas accept (rgb.zeroshot.settings, read before torch loads) are
    the ensembles that run, in their order."""
    from rgb.zeroshot.ensembles import ENSEMBLES
    from rgb.zeroshot.settings import ENSEMBLE_NAMES

    assert tuple(ENSEMBLES) == ENSEMBLE_NAMES
