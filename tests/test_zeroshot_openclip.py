"""The openclip family and zero-shot heads on a tiny random-weight open_clip model (the embedded architecture,
untrained): names, weights files, the classifier's arithmetic, export/load bit-identical, prompts and caches."""

import json

import pytest
import safetensors.torch
import torch
import torch.nn.functional as F

from helpers import compose_config, raises_one_line
from rgb.core.templates import PromptError, check_templates
from rgb.models import (
    META_FILE,
    OpenCLIPWeightsError,
    WeightsMismatchError,
    export_model,
    load_clip,
    load_with_meta,
)
from rgb.models.embedded_clip import EMBEDDED_ARCH, register_embedded_architecture
from rgb.zeroshot.head import PromptSettings, build_zeroshot_head, check_class_names, zeroshot_classifier
from rgb.zeroshot.prompts import template_pool

CLASSES = ["zero", "one", "two", "three", "four_ish"]


@pytest.fixture(scope="module")
def clip():
    register_embedded_architecture()
    return load_clip(EMBEDDED_ARCH)


def images(n=12, seed=0):
    return torch.rand(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def settings(tmp_path, **changes):
    base = dict(pool="none", templates=("a photo of a {}.", "a drawing of a {}.", "{} written by hand.", "the {}"),
                single_template="a photo of a {}.", cache_dir=str(tmp_path / "cache"))
    return PromptSettings(**{**base, **changes})


def test_unknown_architecture_and_tag_name_close_matches():
    with pytest.raises(ValueError, match=r"unknown open_clip architecture 'ViT-B-61'; close matches: .*ViT-B-16"):
        load_clip("ViT-B-61")
    with raises_one_line(ValueError, match=r"unknown pretrained tag 'laion2b_s34b_b89k'.*laion2b_s34b_b88k") as err:
        load_clip("ViT-B-16", pretrained="laion2b_s34b_b89k")


def test_offline_missing_tag_weights_name_the_file_and_how_to_fetch_them(monkeypatch):
    import open_clip

    def offline(*args, **kwargs):
        raise OSError("offline: no cached file")

    monkeypatch.setattr(open_clip, "download_pretrained", offline)
    with raises_one_line(OpenCLIPWeightsError,
                         match=r"laion/CLIP-ViT-B-32-laion2B-s34B-b79K.*model\.weights=PATH") as err:
        load_clip("ViT-B-32", pretrained="laion2b_s34b_b79k")


def test_local_checkpoint_loads_through_the_same_path(clip, tmp_path):
    path = tmp_path / "clip.safetensors"
    state = {k: v + 0.01 for k, v in clip.model.state_dict().items()}
    safetensors.torch.save_file(state, str(path))
    loaded = load_clip(EMBEDDED_ARCH, weights=str(path))
    torch.testing.assert_close(loaded.model.state_dict()["visual.conv1.weight"], state["visual.conv1.weight"])
    with pytest.raises(OpenCLIPWeightsError, match="does not exist"):
        load_clip(EMBEDDED_ARCH, weights=str(tmp_path / "missing.pt"))
    del state["visual.conv1.weight"]
    safetensors.torch.save_file(state, str(path))
    with raises_one_line(WeightsMismatchError, match="visual.conv1.weight") as err:
        load_clip(EMBEDDED_ARCH, weights=str(path))


def test_open_clip_training_checkpoint_loads(clip, tmp_path):
    """open_clip's trainer (open_clip_train.main) saves {"epoch", "name", "state_dict", "optimizer"}, the state
    dict of the DDP-wrapped model (`module.` keys)."""
    state = {k: v + 0.01 for k, v in clip.model.state_dict().items()}
    optimizer = torch.optim.AdamW(clip.model.parameters(), lr=1e-3)
    path = tmp_path / "epoch_1.pt"
    torch.save({"epoch": 1, "name": "fare", "state_dict": {f"module.{k}": v for k, v in state.items()},
                "optimizer": optimizer.state_dict()}, path)
    loaded = load_clip(EMBEDDED_ARCH, weights=str(path))
    torch.testing.assert_close(loaded.model.state_dict()["visual.conv1.weight"], state["visual.conv1.weight"])
    torch.testing.assert_close(loaded.model.state_dict()["text_projection"], state["text_projection"])


def test_classifier_is_image_tower_plus_one_matmul(clip, tmp_path):
    head = build_zeroshot_head(clip, CLASSES, settings(tmp_path, ensemble="mean"), "digits")
    model = zeroshot_classifier(clip, head)
    x = images()
    mean = torch.tensor(clip.preprocess["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(clip.preprocess["std"]).view(1, 3, 1, 1)
    with torch.no_grad():
        f = F.normalize(clip.model.encode_image((x - mean) / std), dim=-1)
        torch.testing.assert_close(model(x), head.logit_scale * f @ head.head.T)
        big = F.interpolate(x, size=(48, 48), mode="bilinear")  # other sizes are resized inside the model
        assert model(big).shape == (12, len(CLASSES))
    assert head.class_names[-1] == "four ish"  # `_` -> space


@pytest.mark.parametrize("ensemble", ["single", "mean", "zpe", "zpe_select", "cpe"])
def test_export_load_round_trip_is_bit_identical(clip, tmp_path, ensemble):
    unlabelled = None
    if ensemble in ("zpe", "zpe_select", "cpe"):
        probe = zeroshot_classifier(clip, build_zeroshot_head(clip, CLASSES, settings(tmp_path, ensemble="mean"), "d"))
        with torch.no_grad():
            unlabelled = probe.image_features(images(20, seed=1))
    head = build_zeroshot_head(clip, CLASSES, settings(tmp_path, ensemble=ensemble), "digits", unlabelled)
    model = zeroshot_classifier(clip, head)
    export_model(model, tmp_path / "run", {"dataset": "digits", "class_names": CLASSES, "zeroshot": head.record()})
    loaded, meta = load_with_meta(tmp_path / "run")
    x = images()
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
    assert meta["family"] == "openclip" and meta["openclip_name"] == EMBEDDED_ARCH and not loaded.training
    record = meta["zeroshot"]
    assert [t["template"] for t in record["templates"]] == head.templates
    assert [t["weight"] for t in record["templates"]] == head.weights.tolist()
    assert record["class_names"] == head.class_names and record["ensemble"] == ensemble
    assert json.loads((tmp_path / "run" / META_FILE).read_text()) == meta
    if ensemble == "single":
        assert [t["kept"] for t in record["templates"]] == [True, False, False, False]
    labels = {"single": "single", "mean": "mean", "zpe": "zpe (test debias)", "cpe": "cpe (weights)",
              "zpe_select": "zpe (median+2*MAD, logit average, test debias)"}
    assert record["label"] == labels[ensemble]  # which variant ran


def unlabelled_features(clip, tmp_path, n=20, seed=1):
    probe = zeroshot_classifier(clip, build_zeroshot_head(clip, CLASSES, settings(tmp_path, ensemble="mean"), "d"))
    with torch.no_grad():
        return probe.image_features(images(n, seed=seed))


def test_zpe_select_with_a_pretraining_feature_file_is_recorded(clip, tmp_path):
    from rgb.core import file_sha256
    from rgb.zeroshot.ensembles import ensemble_weights

    unlabelled = unlabelled_features(clip, tmp_path)
    pretraining = unlabelled_features(clip, tmp_path, n=7, seed=5)
    path = tmp_path / "pretraining.safetensors"
    safetensors.torch.save_file({"features": pretraining}, str(path))
    chosen = settings(tmp_path, ensemble="zpe_select", mad_t=0.5, zpe_pretraining_features=str(path))
    head = build_zeroshot_head(clip, CLASSES, chosen, "digits", unlabelled)
    record = head.record()
    assert record["label"] == "zpe (median+0.5*MAD, logit average, pretraining+test debias)"
    assert record["params"]["zpe_pretraining_features"] == {"file": str(path), "sha256": file_sha256(path),
                                                            "images": 7}
    text = build_zeroshot_head(clip, CLASSES, settings(tmp_path, ensemble="mean"), "digits")
    from rgb.zeroshot.text import TextFeatureCache

    features = TextFeatureCache(clip, tmp_path / "cache").prompt_features(head.templates, head.class_names)
    expected, kept = ensemble_weights(unlabelled, features, "zpe_select", logit_scale=clip.logit_scale, mad_t=0.5,
                                      pretraining_features=pretraining)
    assert torch.equal(head.weights, expected) and torch.equal(head.kept, kept) and text.label == "mean"
    without = build_zeroshot_head(clip, CLASSES, settings(tmp_path, ensemble="zpe_select", mad_t=0.5), "digits",
                                  unlabelled)
    assert not torch.equal(without.weights, head.weights)  # the pretraining term moves the scores
    for content, message in ((b"not safetensors", "not a readable safetensors file"),
                             (None, "does not exist")):
        bad = tmp_path / f"bad-{message[:3]}.safetensors"
        if content is not None:
            bad.write_bytes(content)
        with raises_one_line(PromptError, match=message) as err:
            build_zeroshot_head(clip, CLASSES, settings(tmp_path, ensemble="zpe_select",
                                                        zpe_pretraining_features=str(bad)), "digits", unlabelled)
    safetensors.torch.save_file({"features": torch.zeros(3, 5)}, str(tmp_path / "narrow.safetensors"))
    with pytest.raises(PromptError, match=r"pretraining features must be \(images >= 1, 64\); got \(3, 5\)"):
        build_zeroshot_head(clip, CLASSES, settings(tmp_path, ensemble="zpe_select", zpe_pretraining_features=str(
            tmp_path / "narrow.safetensors")), "digits", unlabelled)


def test_the_single_template_joins_a_user_pool_only_for_the_single_ensemble(clip, tmp_path):
    user = ("a drawing of a {}.", "{} written by hand.")
    for ensemble, unlabelled in (("mean", None), ("cpe", unlabelled_features(clip, tmp_path))):
        head = build_zeroshot_head(clip, CLASSES, settings(tmp_path, ensemble=ensemble, templates=user), "digits",
                                   unlabelled)
        assert head.templates == list(user) and head.record()["single_template_index"] is None
    head = build_zeroshot_head(clip, CLASSES, settings(tmp_path, ensemble="single", templates=user), "digits")
    assert head.templates == [*user, "a photo of a {}."] and head.template_index == 2


def prompts_config(*overrides):
    from omegaconf import OmegaConf

    cfg = compose_config("train", "strategy=zeroshot", *overrides)
    return cfg, OmegaConf.to_container(cfg.prompts, resolve=True)


@pytest.mark.parametrize("dataset", ["caltech101", "fgvc-aircraft-2013b", "flowers-102", "oxford-iiit-pet",
                                     "stanford_cars", "uc-merced-land-use-dataset", "digits"])
def test_dataset_templates_reach_every_dataset_by_its_id(dataset):
    from rgb.core.configs import data_config_for
    from rgb.data.catalog import DATASETS, MINI

    assert sorted([*DATASETS, MINI.name]) == sorted(["caltech101", "fgvc-aircraft-2013b", "flowers-102",
                                                     "oxford-iiit-pet", "stanford_cars",
                                                     "uc-merced-land-use-dataset", "digits"])
    cfg, prompts = prompts_config(f"data={data_config_for(dataset)}")
    assert cfg.data.dataset == dataset
    chosen = PromptSettings.from_config(prompts)
    templates, _ = chosen.template_list(cfg.data.dataset)
    extras = chosen.dataset_templates.get(dataset, [])
    assert len(extras) >= (0 if dataset == "caltech101" else 1)  # CLIP's domain prompts, where they matter
    pool = templates[:80]  # the 80 ImageNet templates, then this dataset's extras they lack
    assert set(extras) <= set(templates) and templates[80:] == [t for t in extras if t not in pool]


def test_unknown_dataset_template_keys_are_refused_when_the_config_loads():
    _, prompts = prompts_config()
    prompts["dataset_templates"] = {**prompts["dataset_templates"], "flowers102": ["a photo of a {}, a flower."]}
    with raises_one_line(PromptError,
                         match=r"unknown dataset id\(s\) 'flowers102'; keys are dataset ids: .*flowers-102") as err:
        PromptSettings.from_config(prompts)
    for key, value, message in (("ensemble", "zpe_best", "^prompts.ensemble must be one of single, mean, zpe, "
                                                         "zpe_select, cpe, got 'zpe_best'$"),
                                ("cmm_units", "radians", "^prompts.cmm_units must be one of logit, cosine, got "
                                                         "'radians'$"),
                                ("mad_t", -1.0, r"^prompts.mad_t must be a finite number >= 0, got -1.0$"),
                                ("zpe_pretraining_features", "x.safetensors", "read by the zpe_select ensemble only")):
        _, prompts = prompts_config()
        with pytest.raises(PromptError, match=message):
            PromptSettings.from_config({**prompts, key: value})


def test_text_features_are_cached_per_tower_and_prompts(clip, tmp_path):
    from rgb.zeroshot.text import TextFeatureCache

    cache = TextFeatureCache(clip, tmp_path / "cache")
    first = cache.prompt_features(["a photo of a {}."], CLASSES)
    assert cache.computed == len(CLASSES)
    again = TextFeatureCache(clip, tmp_path / "cache")
    assert torch.equal(again.prompt_features(["a photo of a {}."], CLASSES), first) and again.computed == 0
    again.prompt_features(["a drawing of a {}."], CLASSES)
    assert again.computed == len(CLASSES) and len(list((tmp_path / "cache").iterdir())) == 2


def test_text_features_of_many_prompts_show_a_bar(clip, capsys):
    """Issue 24: head building over many prompts is long work on a real text tower: a bar counts the texts."""
    from rgb.zeroshot.text import ENCODE_BATCH, encode_texts

    texts = [f"a photo of number {i}." for i in range(ENCODE_BATCH + 4)]
    features = encode_texts(clip, texts)
    assert features.shape[0] == len(texts) and f"/{len(texts)}" in capsys.readouterr().err
    encode_texts(clip, texts[:ENCODE_BATCH])  # one batch: no bar
    assert "text features" not in capsys.readouterr().err


def test_descriptions_enrich_the_worst_classes(clip, tmp_path):
    probe = zeroshot_classifier(clip, build_zeroshot_head(clip, CLASSES, settings(tmp_path, ensemble="mean"), "d"))
    with torch.no_grad():
        unlabelled = probe.image_features(images(30, seed=2))
    base = build_zeroshot_head(clip, CLASSES, settings(tmp_path, ensemble="cpe", enrich_worst=2), "digits", unlabelled)
    ranked = sorted((v, c) for c, v in zip(base.class_names, base.pseudo_cmm) if v == v)  # NaN: no pseudo-label
    assert base.worst_classes == [c for _, c in ranked[:2]] and set(base.questions) == set(base.worst_classes)
    worst = base.worst_classes[0]
    assert base.questions[worst] == f"What are useful visual features for distinguishing a {worst} in a photo?"
    path = tmp_path / "descriptions.json"
    path.write_text(json.dumps({name: ["round edges", "a long stroke"] for name in CLASSES}))
    enriched = build_zeroshot_head(clip, CLASSES, settings(tmp_path, ensemble="cpe", enrich_worst=2,
                                                           descriptions=str(path)), "digits", unlabelled)
    assert enriched.enriched == base.worst_classes
    assert torch.equal(enriched.weights, base.weights)
    changed = [base.class_names[c] for c in range(len(CLASSES)) if not torch.equal(enriched.head[c], base.head[c])]
    assert sorted(changed) == sorted(enriched.enriched)


@pytest.mark.parametrize("templates, message", [
    (["a photo of a thing."], r"has 0 '\{\}' slots"),
    (["a {} next to a {}."], r"has 2 '\{\}' slots"),
    ([], "template pool is empty"),
])
def test_bad_templates_are_one_line(templates, message):
    with raises_one_line(PromptError, match=message) as err:
        check_templates(templates)


def test_the_pool_is_open_clips_shipped_imagenet_templates():
    from open_clip.zero_shot_metadata import OPENAI_IMAGENET_TEMPLATES

    pool = check_templates(template_pool("imagenet80"))
    assert len(pool) == 80 and pool == [t("{}") for t in OPENAI_IMAGENET_TEMPLATES]
    assert "a photo of a {}." in pool


def test_bad_prompt_inputs_are_one_line(clip, tmp_path):
    path = tmp_path / "descriptions.json"
    path.write_text(json.dumps({"zeroo": ["round"], "one": ["a stroke"]}))
    with pytest.raises(PromptError, match=r"names 1 unknown class\(es\): 'zeroo' \(did you mean 'zero'\?\)"):
        build_zeroshot_head(clip, CLASSES, settings(tmp_path, ensemble="mean", descriptions=str(path)), "digits")
    with pytest.raises(PromptError, match="cpe needs unlabelled images: the validation split has none"):
        build_zeroshot_head(clip, CLASSES, settings(tmp_path, ensemble="cpe"), "digits", torch.zeros(0, 64))
    with pytest.raises(PromptError, match="template pool is empty"):
        build_zeroshot_head(clip, CLASSES, settings(tmp_path, templates=()), "digits")
    head = build_zeroshot_head(clip, CLASSES, settings(tmp_path, ensemble="mean"), "digits")
    check_class_names(head.record(), CLASSES)
    with raises_one_line(PromptError, match=r"other class names than the dataset's .*'zero' != 'nought'") as err:
        check_class_names(head.record(), ["nought", *CLASSES[1:]])


@pytest.mark.parametrize("preset", ["openclip_vit_b16", "openclip_vit_b32", "openclip_vit_l14"])
def test_openclip_presets_name_an_architecture_and_tag(preset, compose):
    import open_clip

    from rgb.models.openclip import check_architecture

    cfg = compose("train", f"model={preset}", "strategy=zeroshot")
    check_architecture(cfg.model.name, cfg.model.pretrained)
    assert cfg.model._target_ == "rgb.models.create_openclip_classifier" and cfg.model.weights is None
    assert open_clip.get_pretrained_cfg(cfg.model.name, cfg.model.pretrained)["hf_hub"]
    assert (cfg.strategy.name, cfg.prompts.ensemble, cfg.prompts.pool) == ("zeroshot", "cpe", "imagenet80")
