"""Bridges from redteam to other federated-learning frameworks (each an optional extra).

* :mod:`redteam.integrations.flower`: redteam defenses as Flower strategies, redteam attacks as
  Flower client mods (``pip install "redteam[flower]"``).

Nothing here is imported by ``import redteam``: a framework's package is imported only when its
integration is used.
"""
