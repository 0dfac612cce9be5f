"""Methods compared by the privacy-utility benchmark (see ``base.py``).

``make_method(name, **overrides)`` builds one by name; modules are imported
lazily so that importing this package does not pull in TensorFlow.
"""

from __future__ import annotations

import importlib

# name -> (module, class, fixed constructor arguments)
REGISTRY = {
    "dpgmm": ("models.baselines.dpgmm", "DPGMM", {"vote_filter": False}),
    "dpgmm-vote": ("models.baselines.dpgmm", "DPGMM", {"vote_filter": True}),
    "dpgmm-adaptive": ("models.baselines.dpgmm", "DPGMM", {"adaptive": True}),
    "nonprivate-gmm": ("models.baselines.nonprivate_gmm", "NonPrivateGMM", {}),
    "dpsgd": ("models.baselines.dpsgd", "DPSGD", {}),
    "dpsgd-linear": ("models.baselines.dpsgd", "DPSGD", {"linear": True}),
    "dpsgd-default": ("models.baselines.dpsgd_variants",
                      "DPSGDLibraryDefaults", {}),
    "dpsgd-linear-default": ("models.baselines.dpsgd_variants",
                             "DPSGDLibraryDefaults", {"linear": True}),
    "dpsgd-private-tuning": ("models.baselines.dpsgd_variants",
                             "DPSGDPrivateTuning", {}),
    "dpsgd-linear-private-tuning": ("models.baselines.dpsgd_variants",
                                    "DPSGDPrivateTuning", {"linear": True}),
    "pe": ("models.baselines.pe", "PE", {}),
    "clustmix": ("models.baselines.clustmix", "ClustMix", {}),
    "psg": ("models.baselines.psg", "PSG", {}),
}
METHODS = tuple(REGISTRY)


def make_method(name: str, **overrides):
    if name not in REGISTRY:
        raise ValueError(f"unknown method {name!r}; choose from {list(METHODS)}")
    module, cls, fixed = REGISTRY[name]
    return getattr(importlib.import_module(module), cls)(**fixed, **overrides)
