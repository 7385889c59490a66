"""Privacy beside robustness: what an observer of the updates or of the model learns about the
clients' data, and what differential privacy and secure aggregation cost the robust rules.

* :mod:`.accountant`: ε of a run's differentially private mechanism, from Google's
  ``dp-accounting`` library (its Rényi-DP accountant), never from a formula of our own;
* :mod:`.reconstruction` (PSNR, SSIM, matching, label recovery) and :mod:`.membership` (exact ROC
  AUC, TPR at a low FPR): how an observer's answer is scored;
* :mod:`.observe`: the engine's side of the ``Surface.PRIVACY`` observers (gradient inversion of
  one update, membership inference on the final model) and how their output is scored.

The attacks themselves are plugins (``attacks/inversion.py``, ``attacks/membership.py``);
secure aggregation is a transport stage (:mod:`redteam.transport.secagg`).
"""

from typing import Any

#: the metrics, importable from the package (loaded when first used: torch stays out of the import)
_LAZY = {
    "psnr": "reconstruction", "ssim": "reconstruction", "match": "reconstruction", "Match": "reconstruction",
    "label_recovery": "reconstruction", "gaussian_window": "reconstruction", "as_images": "reconstruction",
    "roc_auc": "membership", "roc_curve": "membership", "tpr_at_fpr": "membership",
    "membership_metrics": "membership", "REPORTED_FPRS": "membership",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
