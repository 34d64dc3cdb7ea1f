"""rgb.zeroshot ensembles and class-wise metrics on hand-made features (no model): spec §2 and §3."""

import math

import pytest
import torch

from rgb.zeroshot.ensembles import EnsembleError, ensemble_head, ensemble_weights, matching_margins, pseudo_labels
from rgb.zeroshot.metrics import class_accuracies, class_wise_metrics
from rgb.zeroshot.report import comparison_table

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
    assert [row["ensemble"] for row in table] == ["single", "mean", "zpe", "cpe"]
    for row, row_shuffled in zip(table, table_shuffled):
        assert row["templates"] == row_shuffled["templates"]
    assert table[3]["overall"] == 1.0 and table_shuffled[3]["overall"] < 1.0
    assert [t["kept"] for t in table[3]["templates"]] == [False, True, False, True]


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
    with pytest.raises(EnsembleError, match=message) as err:
        call(images, text)
    assert "\n" not in str(err.value)


def test_class_wise_metrics():
    labels = torch.tensor([0, 0, 1, 1, 2, 2, 2, 2, 3])
    predictions = torch.tensor([0, 0, 1, 0, 2, 0, 0, 0, 1])  # Acc = 1, 0.5, 0.25, 0
    assert class_accuracies(predictions, labels, 5)[:4].tolist() == [1.0, 0.5, 0.25, 0.0]
    assert math.isnan(class_accuracies(predictions, labels, 5)[4])  # no image: NaN, not 0
    m = class_wise_metrics(predictions, labels, 5)
    assert m == {"overall": 4 / 9, "worst@1": 0.0, "worst@5": 1.75 / 4, "worst@10": 1.75 / 4, "hm": 0.0, "gm": 0.0}
    predictions[-1] = 3  # Acc = 1, 0.5, 0.25, 1
    m = class_wise_metrics(predictions, labels, 4)
    assert m["worst@1"] == 0.25 and m["hm"] == pytest.approx(4 / (1 + 2 + 4 + 1))
    assert m["gm"] == pytest.approx((0.5 * 0.25) ** 0.25)
