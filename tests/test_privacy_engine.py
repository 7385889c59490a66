"""The engine's side of ``[privacy]``: observers are passive, secure aggregation hides rows and keeps
sums, defenses that need rows are refused by name, and the metrics reach the run's summary."""

from __future__ import annotations

import copy

import pytest
import torch

from redteam.errors import InvalidParameter, InvalidScenario
from redteam.federation.loop import Federation
from redteam.scenario import parse_scenario
from redteam.scoring import summarize

BASE = {
    "scenario": {"name": "privacy-engine", "seed": 3},
    "workload": {"name": "digits"},
    "federation": {"clients": 6, "rounds": 2, "partition": "iid", "local_steps": 1, "batch_size": 1, "lr": 0.5},
    "attack": {"name": "none"},
    "defense": {"name": "mean"},
}


def _doc(**privacy):
    doc = copy.deepcopy(BASE)
    doc["privacy"] = privacy
    return doc


def _run(doc):
    fed = Federation(parse_scenario(doc))
    res = fed.run()
    return fed, res


def test_observing_changes_nothing_in_the_run():
    _, plain = _run(copy.deepcopy(BASE))
    fed, observed = _run(_doc(observers=["idlg"]))
    assert [r.accuracy for r in plain.records] == [r.accuracy for r in observed.records]
    assert torch.equal(Federation(parse_scenario(copy.deepcopy(BASE))).params0, fed.params0)
    got = observed.records[0].extra["privacy"]["inversion"]
    assert got["exact_truth"] and got["samples"] == 1


def test_idlg_recovers_a_row_and_secure_aggregation_hides_it():
    _, res = _run(_doc(observers=["idlg"]))
    m = summarize(res.records)
    assert m["reconstruction_psnr"] > 40 and m["label_recovery"] == 1.0
    _, masked = _run(_doc(observers=["idlg"], secure_aggregation=True))
    mm = summarize(masked.records)
    assert mm["reconstruction_psnr"] < 15  # the masked row carries nothing of the image
    assert masked.records[0].extra["secure_aggregation"]["summed"] == [6]


def test_secure_sum_is_the_plain_unweighted_mean():
    # DP-FedAvg without noise and with a bound no row reaches: the unweighted mean of the rows,
    # whether the server reads rows or one secure sum (within the fixed-point encoding's 2^-16)
    doc = copy.deepcopy(BASE)
    doc["defense"] = {"name": "dp_fedavg", "clip": 1e6, "noise_multiplier": 0.0}
    plain_fed, plain = _run(doc)
    doc_s = copy.deepcopy(doc)
    doc_s["privacy"] = {"secure_aggregation": True, "secagg_clip": 64.0}
    sec_fed, sec = _run(doc_s)
    assert torch.allclose(plain_fed.final_params, sec_fed.final_params, atol=1e-3)
    assert plain.records[-1].accuracy == pytest.approx(sec.records[-1].accuracy, abs=0.02)


def test_a_rule_that_reads_rows_is_refused_without_buckets_and_runs_on_bucket_means():
    doc = _doc(secure_aggregation=True)
    doc["defense"] = {"name": "trimmed_mean"}
    with pytest.raises(InvalidParameter, match="TrimmedMean reads each client's row"):
        Federation(parse_scenario(doc))
    doc["privacy"]["secagg_buckets"] = 3
    fed, res = _run(doc)
    assert res.records[0].extra["secure_aggregation"]["buckets"] == 3
    assert sum(res.records[0].extra["secure_aggregation"]["summed"]) == 6


def test_dropouts_are_recorded_and_left_out_of_the_sum():
    doc = _doc(secure_aggregation=True, secagg_dropout=0.5)
    fed, res = _run(doc)
    sa = res.records[0].extra["secure_aggregation"]
    assert sa["dropouts"] >= 1
    dropped = [c for c, why in res.records[0].dropped.items() if "secure aggregation" in why]
    assert len(dropped) == sa["dropouts"] and sum(sa["summed"]) == 6 - sa["dropouts"]


def test_dp_fedavg_reports_epsilon_of_the_run():
    doc = _doc()
    doc["defense"] = {"name": "dp_fedavg", "clip": 1.0, "noise_multiplier": 1.0}
    _, res = _run(doc)
    from redteam.privacy.accountant import ClientLevelDP, epsilon

    assert summarize(res.records)["epsilon"] == pytest.approx(epsilon(ClientLevelDP(1.0, 6, 6, 2), 1e-5))


def test_a_privacy_observer_in_the_attack_slot_is_refused_by_name():
    doc = copy.deepcopy(BASE)
    doc["attack"] = {"name": "idlg"}
    with pytest.raises(InvalidParameter, match=r"\[privacy\] observers"):
        Federation(parse_scenario(doc))


@pytest.mark.parametrize("bad,match", [
    ({"observers": ["sign_flip"]}, "not a privacy observer"),
    ({"observers": ["idlg", "dlg"]}, "one inversion and one membership observer"),
    ({"observe_round": 2}, r"must be a round in \[0, 1\]"),
    ({"victim": 6}, r"must be a client in \[0, 5\]"),
    ({"observe": "everything"}, "observe"),
])
def test_bad_privacy_keys_are_named(bad, match):
    with pytest.raises(InvalidScenario, match=match):
        parse_scenario(_doc(**bad))


def test_privacy_outside_the_data_parallel_regime_is_refused():
    doc = _doc()
    doc["gossip"] = {}
    with pytest.raises(InvalidScenario, match=r"\[privacy\] does not apply to the \[gossip\] regime"):
        parse_scenario(doc)
