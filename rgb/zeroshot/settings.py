"""The zero-shot settings a config names, plain Python so that train.py's and evaluate.py's schemas read them before
torch loads: the prompt ensembles' names and parameters (rgb.zeroshot.ensembles runs them), the Cmm units, and the
`prompts` config group (PromptSettings; rgb.zeroshot.head builds its head)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rgb.core.errors import UserError
from rgb.core.options import Ruled, ruled
from rgb.core.templates import PromptError, check_templates
from rgb.core.values import NON_NEGATIVE, NON_NEGATIVE_INT, POSITIVE, number, one_of
from rgb.data.catalog import DATASET_IDS  # the keys `dataset_templates` may use
from rgb.zeroshot.prompts import template_pool

if TYPE_CHECKING:
    import torch

# The prompt ensembles, each run by its function in rgb.zeroshot.ensembles.ENSEMBLES.
ENSEMBLE_NAMES = ("single", "mean", "zpe", "zpe_select", "cpe")


class EnsembleError(UserError, ValueError):
    """Prompt ensemble inputs that cannot give a head (one line)."""


CMM_UNITS = ("logit", "cosine")


def cmm_scale(logit_scale: float, units: str) -> float:
    """The factor of the similarities that Cmm is measured in: s for logit units, 1 for cosine units."""
    if units not in CMM_UNITS:
        raise EnsembleError(f"unknown Cmm units {units!r}; choose one of {', '.join(CMM_UNITS)}")
    return float(logit_scale) if units == "logit" else 1.0


@dataclass(frozen=True)
class EnsembleParams:
    """The parameters of every ensemble, and their defaults (the `prompts` config's, PromptSettings, read them from
    here)."""

    logit_scale: float = 100.0
    k: float = 0.1
    tau: float = 1.0
    template_index: int | None = 0  # None: the single template is not in the pool
    cmm_units: str = "logit"
    mad_t: float = 2.0
    pretraining_features: torch.Tensor | None = None


def ensemble_params(*, logit_scale: float = EnsembleParams.logit_scale, k: float = EnsembleParams.k,
                    tau: float = EnsembleParams.tau, template_index: int | None = EnsembleParams.template_index,
                    cmm_units: str = EnsembleParams.cmm_units, mad_t: float = EnsembleParams.mad_t,
                    pretraining_features: torch.Tensor | None = None) -> EnsembleParams:
    """The parameters of every ensemble, checked: `k`, `tau`, `cmm_units` are CPE's worst-k fraction, softmax
    temperature (also ZPE's) and Cmm units; `mad_t` and `pretraining_features` are `zpe_select`'s; `template_index`
    is `single`'s template."""
    cmm_scale(logit_scale, cmm_units)
    if not 0 < float(k) <= 1 or not float(tau) > 0 or not float(mad_t) >= 0:
        raise EnsembleError(f"ensemble parameters need 0 < k <= 1, tau > 0 and mad_t >= 0; got k={k}, tau={tau}, "
                            f"mad_t={mad_t}")
    return EnsembleParams(float(logit_scale), float(k), float(tau), None if template_index is None
                          else int(template_index), cmm_units, float(mad_t), pretraining_features)


# The config group PromptSettings is read from: its keys are `prompts.<field>`.
KEY = "prompts."


@dataclass(frozen=True)
class PromptSettings(Ruled):
    """The `prompts` config group: ensemble and its parameters, the template pool, descriptions. Its keys are
    `prompts.<field>` (KEY): the rules on the fields are checked when made and by train.py's schema first."""

    ensemble: str = ruled("cpe", one_of(ENSEMBLE_NAMES))
    pool: str = ruled("imagenet80")
    templates: tuple[str, ...] = ruled(())  # the user's extra templates
    dataset_templates: dict = ruled(default_factory=dict)  # dataset -> extra templates where they matter
    single_template: str = ruled("a photo of a {}.")
    # CPE's worst-k fraction of the classes, and the softmax temperature of the template scores (also ZPE's)
    k: float = ruled(EnsembleParams.k, (lambda v: number(v) and 0 < v <= 1, "a fraction in (0, 1]"))
    tau: float = ruled(EnsembleParams.tau, POSITIVE)
    split: str = ruled("validation")  # unlabelled images for zpe / cpe (and the pseudo-Cmm report)
    descriptions: str | None = ruled(None)  # JSON class name -> descriptors (Menon & Vondrick enrichment)
    # K: classes with the lowest pseudo-Cmm that get descriptions / questions
    enrich_worst: int = ruled(10, NON_NEGATIVE_INT)
    cache_dir: str | None = ruled(None, identity=False)  # where text features are cached: never which
    cmm_units: str = ruled(EnsembleParams.cmm_units, one_of(CMM_UNITS))  # cpe: similarities of Cmm in logit units (s * cosine) or cosine units
    # zpe_select: keep templates scoring >= median + mad_t * MAD (0.5 ImageNet, 2.0 fine-grained)
    mad_t: float = ruled(EnsembleParams.mad_t, NON_NEGATIVE)
    # zpe_select: image features of unlabelled pretraining-like images
    zpe_pretraining_features: str | None = ruled(None)

    def __post_init__(self):
        self.check(KEY, error=PromptError)
        object.__setattr__(self, "templates", tuple(self.templates or ()))  # null (or a YAML list): a tuple
        object.__setattr__(self, "dataset_templates", dict(self.dataset_templates or {}))
        unknown = sorted(set(self.dataset_templates) - set(DATASET_IDS))
        if unknown:
            raise PromptError(f"prompts.dataset_templates: unknown dataset id(s) {', '.join(map(repr, unknown))}; "
                              f"keys are dataset ids: {', '.join(DATASET_IDS)}")
        if self.zpe_pretraining_features is not None and self.ensemble != "zpe_select":
            raise PromptError(f"prompts.zpe_pretraining_features is read by the zpe_select ensemble only, not "
                              f"{self.ensemble}")

    @classmethod
    def from_config(cls, config: dict, prefix: str = "", **built) -> PromptSettings:
        """The settings of the prompts group `config` by field name (Ruled.from_config); a key no field reads is
        refused (`+prompts.<typo>=` would otherwise be dropped unread)."""
        unknown = sorted(set(config) - set(cls.names()))
        if unknown:
            raise PromptError(f"unknown prompts key(s) {', '.join(unknown)}; known: {', '.join(sorted(cls.names()))}")
        return super().from_config(config, prefix, **built)

    def template_list(self, dataset: str) -> tuple[list[str], int | None]:
        """(the pool + this dataset's extras + the user's, index of `single_template` in it). The single template
        is appended for the `single` ensemble only (it alone needs no pool); elsewhere the index is None when the
        pool lacks it, so a user's pool is weighed as given."""
        templates = [*template_pool(self.pool), *self.dataset_templates.get(dataset, ()), *self.templates]
        if self.ensemble == "single" and self.single_template not in templates:
            templates.append(self.single_template)
        templates = check_templates(templates)
        return templates, templates.index(self.single_template) if self.single_template in templates else None
