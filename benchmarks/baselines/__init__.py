"""Methods compared by the privacy-utility benchmark (see ``base.py``).

``make_method(name, **overrides)`` builds one by name; modules are imported
lazily so that importing this package does not pull in TensorFlow.
"""

from __future__ import annotations

import importlib

# name -> (module, class, fixed constructor arguments)
REGISTRY = {
    "dpgmm": ("benchmarks.baselines.dpgmm", "DPGMM", {"vote_filter": False}),
    "dpgmm-vote": ("benchmarks.baselines.dpgmm", "DPGMM", {"vote_filter": True}),
    "dpgmm-adaptive": ("benchmarks.baselines.dpgmm", "DPGMM", {"adaptive": True}),
    "nonprivate-gmm": ("benchmarks.baselines.nonprivate_gmm", "NonPrivateGMM", {}),
    "dpsgd": ("benchmarks.baselines.dpsgd", "DPSGD", {}),
    "dpsgd-linear": ("benchmarks.baselines.dpsgd", "DPSGD", {"linear": True}),
    "dpsgd-default": ("benchmarks.baselines.dpsgd_variants",
                      "DPSGDLibraryDefaults", {}),
    "dpsgd-linear-default": ("benchmarks.baselines.dpsgd_variants",
                             "DPSGDLibraryDefaults", {"linear": True}),
    "dpsgd-private-tuning": ("benchmarks.baselines.dpsgd_variants",
                             "DPSGDPrivateTuning", {}),
    "dpsgd-linear-private-tuning": ("benchmarks.baselines.dpsgd_variants",
                                    "DPSGDPrivateTuning", {"linear": True}),
    "pe": ("benchmarks.baselines.pe", "PE", {}),
    "clustmix": ("benchmarks.baselines.clustmix", "ClustMix", {}),
    "psg": ("benchmarks.baselines.psg", "PSG", {}),
}
METHODS = tuple(REGISTRY)


def make_method(name: str, **overrides):
    if name not in REGISTRY:
        raise ValueError(f"unknown method {name!r}; choose from {list(METHODS)}")
    module, cls, fixed = REGISTRY[name]
    return getattr(importlib.import_module(module), cls)(**fixed, **overrides)
