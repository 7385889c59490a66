"""Privacy beside robustness: what an observer of the updates or of the model learns about the
clients' data, and what differential privacy and secure aggregation cost the robust rules.

* :mod:`.accountant`: ε of a run's differentially private mechanism, from Google's
  ``dp-accounting`` library (its Rényi-DP accountant), never from a formula of our own;
* :mod:`.observe`: the engine's side of the ``Surface.PRIVACY`` observers (gradient inversion of
  one update, membership inference on the final model) and how their output is scored.

The attacks themselves are plugins (``attacks/inversion.py``, ``attacks/membership.py``);
secure aggregation is a transport stage (:mod:`redteam.transport.secagg`).
"""

__all__: list[str] = []
