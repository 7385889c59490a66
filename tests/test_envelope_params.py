"""Parameters of the envelope attacks (attacks/envelope.py): exact one-line errors, and the
edges of every accepted range (found by mutation testing: the messages and the range ends
were not pinned anywhere)."""

from __future__ import annotations

import math

import pytest

from attacks.envelope import Adaptive, CosineEvasion, NormEvasion, NormHug
from redteam.errors import InvalidParameter

BAD = [
    (NormHug, {"bound": 0}, "NormHug.bound = 0: must be a finite number > 0"),
    (NormHug, {"bound": True}, "NormHug.bound = True: must be a finite number > 0"),
    (NormHug, {"knowledge": "all"}, ("NormHug.knowledge = 'all': must be 'omniscient' (all honest updates "
                                     "of the round) or 'own' (only the malicious clients' own honest updates)")),
    (NormEvasion, {"bound": -1.0}, "NormEvasion.bound = -1.0: must be a finite number > 0"),
    (NormEvasion, {"bound": math.inf}, "NormEvasion.bound = inf: must be a finite number > 0"),
    (NormEvasion, {"margin": 0}, "NormEvasion.margin = 0: must be in (0, 1]"),
    (NormEvasion, {"margin": 1.5}, "NormEvasion.margin = 1.5: must be in (0, 1]"),
    (NormEvasion, {"margin": True}, "NormEvasion.margin = True: must be in (0, 1]"),
    (CosineEvasion, {"threshold": 1.0}, "CosineEvasion.threshold = 1.0: must be in (−1, 1)"),
    (CosineEvasion, {"threshold": -1.0}, "CosineEvasion.threshold = -1.0: must be in (−1, 1)"),
    (CosineEvasion, {"threshold": True}, "CosineEvasion.threshold = True: must be in (−1, 1)"),
    (CosineEvasion, {"against": "x"}, "CosineEvasion.against = 'x': must be 'median', 'mean' or 'previous'"),
    (CosineEvasion, {"target": "x"}, "CosineEvasion.target = 'x': must be 'reverse' or 'own'"),
    (CosineEvasion, {"bound": 0.0}, "CosineEvasion.bound = 0.0: must be a finite number > 0"),
    (CosineEvasion, {"slack": 0.01}, "CosineEvasion.slack = 0.01: must be in [0, 0.01)"),
    (CosineEvasion, {"slack": -1e-9}, "CosineEvasion.slack = -1e-09: must be in [0, 0.01)"),
    (CosineEvasion, {"slack": True}, "CosineEvasion.slack = True: must be in [0, 0.01)"),
    (Adaptive, {"attack": ""}, "Adaptive.attack = '': must be the name of a registered attack"),
    (Adaptive, {"attack": 3}, "Adaptive.attack = 3: must be the name of a registered attack"),
    (Adaptive, {"params": []}, "Adaptive.params = []: must be a table of the wrapped attack's parameters"),
    (Adaptive, {"params": {"scale": -1}}, ("Adaptive.params = {'scale': -1}: SignFlip.scale = -1.0: "
                                           "must be a finite number > 0")),
    (Adaptive, {"anchor": "x"}, "Adaptive.anchor = 'x': must be 'zero' or 'own'"),
    (Adaptive, {"max_scale": 0.5}, "Adaptive.max_scale = 0.5: must be a finite number ≥ 1"),
    (Adaptive, {"max_scale": True}, "Adaptive.max_scale = True: must be a finite number ≥ 1"),
    (Adaptive, {"max_scale": math.inf}, "Adaptive.max_scale = inf: must be a finite number ≥ 1"),
    (Adaptive, {"steps": 0}, "Adaptive.steps = 0: must be an integer in [1, 200]"),
    (Adaptive, {"steps": 201}, "Adaptive.steps = 201: must be an integer in [1, 200]"),
    (Adaptive, {"steps": True}, "Adaptive.steps = True: must be an integer in [1, 200]"),
    (Adaptive, {"steps": 2.0}, "Adaptive.steps = 2.0: must be an integer in [1, 200]"),
]


@pytest.mark.parametrize("cls, kw, msg", BAD)
def test_bad_parameters_exact_messages(cls, kw, msg):
    with pytest.raises(InvalidParameter) as ei:
        cls(**kw)
    assert str(ei.value) == msg


def test_unknown_wrapped_attack_names_the_field_and_suggests():
    with pytest.raises(InvalidParameter) as ei:
        Adaptive(attack="sign_flp")
    assert str(ei.value).startswith("Adaptive.attack = 'sign_flp': unknown attack 'sign_flp'; did you mean 'sign_flip'")


@pytest.mark.parametrize("cls, kw", [
    (NormEvasion, {"margin": 1}), (NormEvasion, {"margin": 1e-9}),
    (CosineEvasion, {"threshold": -0.999}), (CosineEvasion, {"threshold": 0.999}),
    (CosineEvasion, {"slack": 0}), (CosineEvasion, {"slack": 0.00999}), (CosineEvasion, {"bound": None}),
    (CosineEvasion, {"against": "mean"}), (CosineEvasion, {"against": "previous"}), (CosineEvasion, {"target": "own"}),
    (NormHug, {"knowledge": "own"}), (Adaptive, {"anchor": "own"}),
    (Adaptive, {"max_scale": 1}), (Adaptive, {"steps": 1}), (Adaptive, {"steps": 200}),
])
def test_range_edges_are_accepted(cls, kw):
    obj = cls(**kw)
    for k, v in kw.items():
        assert getattr(obj, k) == v


def test_adaptive_hash_depends_on_its_parameters():
    a = Adaptive(params={"scale": 2.0})
    assert hash(a) == hash(Adaptive(params={"scale": 2.0}))
    assert len({hash(a), hash(Adaptive(params={"scale": 3.0})), hash(Adaptive(anchor="own")),
                hash(Adaptive(steps=5)), hash(Adaptive(max_scale=10.0)), hash(Adaptive())}) == 6
