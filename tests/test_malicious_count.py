"""Trimmed mean's ``b`` comes from the user or from the scenario's malicious count (issue 8 §3).

It never silently falls back to the median: a bare call without ``b`` is refused, and a
scenario run fills ``b = f`` (Yin et al.'s b ≥ f at equality, the reference code's b = f).
"""

from __future__ import annotations

import pytest
import torch

import redteam
from redteam.errors import InvalidParameter
from redteam.federation.builders import build_defense
from redteam.federation.loop import Federation
from redteam.pipeline import Pipeline
from redteam.scenario import PluginSpec, parse_scenario


def test_bare_call_without_b_is_refused():
    x = torch.tensor([[1.0], [2.0], [30.0], [40.0], [50.0]])
    with pytest.raises(InvalidParameter, match=r"TrimmedMean\.b = None: is unset.*malicious count"):
        redteam.defense("trimmed_mean")(x)


def test_builder_fills_b_from_the_malicious_count():
    assert build_defense(PluginSpec("trimmed_mean"), n_malicious=3).b == 3
    assert build_defense(PluginSpec("trimmed_mean", {"b": 1}), n_malicious=3).b == 1  # explicit wins
    assert build_defense(PluginSpec("trimmed_mean")).b is None  # no count known: stays unset
    pipe = build_defense([PluginSpec("clip", {"bound": 5.0}), PluginSpec("trimmed_mean")], n_malicious=2)
    assert isinstance(pipe, Pipeline) and pipe.stages[1].b == 2
    assert build_defense(PluginSpec("median"), n_malicious=2) == redteam.defense("median")  # others untouched
    # b = 2 of n = 5 per side: (1, 2, 30, 40, 50) keeps only 30 (not the mean of 2, 30, 40)
    x = torch.tensor([[1.0], [2.0], [30.0], [40.0], [50.0]])
    assert build_defense(PluginSpec("trimmed_mean"), n_malicious=2)(x).aggregate.item() == 30.0


def test_scenario_run_uses_b_equal_to_f_and_says_so():
    sc = parse_scenario({
        "scenario": {"seed": 0}, "workload": {"name": "digits"},
        "federation": {"clients": 10, "rounds": 1, "malicious_fraction": 0.3, "local_steps": 1},
        "attack": {"name": "sign_flip"}, "defense": {"name": "trimmed_mean"},
    })
    fed = Federation(sc)
    assert sc.federation.n_malicious == 3 and fed.defense.b == 3
    res = fed.run()
    assert res.params["defense"] == "TrimmedMean(b=3)"
