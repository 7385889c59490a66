"""The field's evaluation protocol (issue 20 §1): K-of-N client sampling, attack windows,
warm-up and start_from, durability metrics, [scenario] requires."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from redteam.errors import InvalidParameter, InvalidScenario
from redteam.federation import warmup as warmup_mod
from redteam.federation.loop import Federation
from redteam.federation.sampling import RoundPlan
from redteam.requirements import unmet
from redteam.scenario import AttackWindow, FederationSpec, parse_scenario
from redteam.scoring import durability, summarize
from redteam.types import RoundRecord

pytest_plugins = ["pytester"]


def _doc(attack="none", fed=None, scenario=None, defense="mean", **attack_keys):
    a = {"name": attack, **attack_keys} if isinstance(attack, str) else attack
    return {"scenario": {"seed": 3, **(scenario or {})}, "workload": {"name": "digits", "hidden": 16},
            "federation": {"clients": 8, "rounds": 6, "local_steps": 2, "batch_size": 8, "malicious_fraction": 0.25,
                           "partition": "iid", **(fed or {})},
            "attack": a, "defense": defense}


def _run(doc, **kw):
    fed = Federation(parse_scenario(copy.deepcopy(doc)), **kw)
    return fed, fed.run()


# ------------------------------------------------------------------ K of N
def test_k_of_n_draws_uniform_without_replacement():
    spec = FederationSpec(clients=10, clients_per_round=3)
    plan = RoundPlan(spec, AttackWindow(), np.zeros(10, dtype=bool), np.random.default_rng(0))
    counts = np.zeros(10)
    for r in range(3000):
        drawn = plan.draw(r, np.arange(10))
        assert len(drawn) == 3 and len(set(drawn.tolist())) == 3 and list(drawn) == sorted(drawn)
        counts[drawn] += 1
    # each client is drawn with probability 3/10: 900 ± 5σ (σ = √(3000·0.3·0.7) ≈ 25)
    assert np.all(np.abs(counts - 900) < 125), counts


def test_fewer_available_than_k_takes_all_and_default_draws_nothing():
    rng = np.random.default_rng(0)
    state = rng.bit_generator.state
    plan = RoundPlan(FederationSpec(clients=10), AttackWindow(), np.zeros(10, dtype=bool), rng)
    assert plan.draw(0, np.arange(10)).tolist() == list(range(10))
    assert rng.bit_generator.state == state  # no K: no random number drawn, runs as before
    plan = RoundPlan(FederationSpec(clients=10, clients_per_round=5), AttackWindow(), np.zeros(10, dtype=bool), rng)
    assert plan.draw(0, np.array([1, 4, 7])).tolist() == [1, 4, 7]


@pytest.mark.parametrize("rule,per_round", [("every_round", 2), ("count", 1)])
def test_attacker_selection_in_active_rounds_only(rule, per_round):
    mal = np.zeros(10, dtype=bool)
    mal[[2, 7]] = True
    spec = FederationSpec(clients=10, malicious_fraction=0.2, clients_per_round=4, attacker_selection=rule,
                          attackers_per_round=1 if rule == "count" else None)
    plan = RoundPlan(spec, AttackWindow(window="10:20"), mal, np.random.default_rng(1))
    inside = [int(mal[plan.draw(r, np.arange(10))].sum()) for r in range(10, 20)]
    assert inside == [per_round] * 10
    outside = [int(mal[plan.draw(r, np.arange(10))].sum()) for r in range(20, 400)]
    assert min(outside) == 0 and max(outside) >= 1  # uniform: attackers sometimes, not always


def test_participation_and_detection_count_only_drawn_clients():
    doc = _doc("sign_flip", fed={"clients_per_round": 3})
    fed, res = _run(doc)
    for rec in res.records:
        assert sum(rec.participating) == 3
        for c, part in enumerate(rec.participating):
            if not part:
                assert not rec.accepted[c] and c not in rec.rejected
    s = summarize(res.records)
    judged = s["tp"] + s["fp"] + s["tn"] + s["fn"]
    assert judged == 3 * 6


def test_baseline_draws_the_same_clients_as_the_attacked_run():
    doc = _doc("sign_flip", fed={"clients_per_round": 4, "attacker_selection": "every_round"}, window="2:4")
    _, att = _run(doc)
    base = copy.deepcopy(doc)
    base["attack"] = {"name": "none", "window": "2:4"}
    _, bas = _run(base)
    assert [r.participating for r in att.records] == [r.participating for r in bas.records]
    assert all(not any(r.malicious) for r in bas.records)


# ------------------------------------------------------------------ windows
SURFACES = [
    ("label_flip", {}, {}),  # data
    ("neurotoxin", {}, {}),  # training hook
    ("sign_flip", {}, {}),  # updates
    ("chunk_tamper", {"position": "path"}, {"transport": {"network": {"relay_fraction": 1.0}}}),  # transport
]


@pytest.mark.parametrize("attack,params,extra", SURFACES, ids=[s[0] for s in SURFACES])
def test_window_honoured_by_every_surface(attack, params, extra):
    """Before the window opens the attacked run is the baseline, bit for bit; in it the
    attackers act; after it they are honest again (truth False, clean data)."""
    doc = {**_doc({"name": attack, **params, "window": "3:5"}), **extra}
    doc["federation"]["rounds"] = 7
    fed, att = _run(doc)
    base = copy.deepcopy(doc)
    base["attack"] = {"name": "none", "window": "3:5"}
    _, bas = _run(base)
    for r in range(3):
        assert att.records[r].accuracy == bas.records[r].accuracy
        assert att.records[r].loss == bas.records[r].loss
        assert att.records[r].rejected == bas.records[r].rejected
        assert not any(att.records[r].malicious)
    assert [r.extra["attack_active"] for r in att.records] == [False] * 3 + [True] * 2 + [False] * 2
    assert all(any(att.records[r].malicious) for r in (3, 4))
    assert not any(att.records[5].malicious) and not any(att.records[6].malicious)
    changed = any(att.records[r].loss != bas.records[r].loss or att.records[r].rejected != bas.records[r].rejected
                  for r in (3, 4, 5, 6))
    assert changed, "the attack acted in its window"


def test_poisoned_data_used_only_inside_the_window(monkeypatch):
    doc = _doc({"name": "label_flip", "window": "1:2"})
    doc["federation"]["rounds"] = 3
    fed = Federation(parse_scenario(doc))
    clean, poisoned = fed.phases[0][0], fed.phases[1][0]
    assert clean is not poisoned and not torch.equal(clean.y, poisoned.y)
    seen = []
    real = fed.trainer.train

    def spy(params, data, *a, **k):
        seen.append(data)
        return real(params, data, *a, **k)

    monkeypatch.setattr(fed.trainer, "train", spy)
    fed.run()
    assert [d is poisoned for d in seen] == [False, True, False]


def test_every_k_multishot_and_single_shot():
    w = AttackWindow(window="2:9", every=3)
    assert [r for r in range(12) if w.active(r)] == [2, 5, 8]
    assert [r for r in range(12) if AttackWindow(window=4).active(r)] == [4]
    assert [r for r in range(6) if AttackWindow(window="3:").active(r)] == [3, 4, 5]
    assert all(AttackWindow().active(r) for r in range(5)) and AttackWindow().is_full


@pytest.mark.parametrize("window,msg", [("7:9", "never act"), ("2:30", "ends after"), ("5:3", "must be"),
                                         ("x", "must be"), (-1, "must be")])
def test_bad_windows_are_clean_errors(window, msg):
    with pytest.raises(InvalidScenario, match=msg):
        parse_scenario(_doc("sign_flip", window=window))


@pytest.mark.parametrize("fed,msg", [
    ({"clients_per_round": 9}, "more than the 8 clients"),
    ({"clients_per_round": 4, "attacker_selection": "count"}, "needs attackers_per_round"),
    ({"clients_per_round": 4, "attacker_selection": "count", "attackers_per_round": 3}, "more than the 2 malicious"),
    ({"attacker_selection": "every_round"}, "set clients_per_round"),
    ({"attackers_per_round": 1, "clients_per_round": 4}, 'only with attacker_selection = "count"'),
])
def test_bad_sampling_keys_are_clean_errors(fed, msg):
    with pytest.raises(InvalidScenario, match=msg):
        parse_scenario(_doc("sign_flip", fed=fed))


def test_new_keys_leave_old_digests_alone():
    sc = parse_scenario(_doc("sign_flip"))
    d = sc.to_dict()
    assert "window" not in d and "clients_per_round" not in d["federation"] and "warmup_rounds" not in d["scenario"]
    assert parse_scenario(_doc("sign_flip", window="1:3")).digest() != sc.digest()


def test_matrix_attacks_inherit_the_base_window_and_baseline_keeps_it():
    from redteam.matrix import expand
    from redteam.runner.matrix_run import plan_units

    doc = _doc({"name": "sign_flip", "window": "2:4", "after_k": 1})
    doc["matrix"] = {"attacks": ["sign_flip", {"name": "gaussian", "window": "1:2"}], "seeds": 1}
    m = expand(doc, "t.toml")
    wins = {c.attack.split("(")[0]: (c.doc["attack"].get("window"), c.doc["attack"].get("after_k")) for c in m.cells}
    assert wins == {"sign_flip": ("2:4", 1), "gaussian": ("1:2", 1)}
    _, baselines, _ = plan_units(m, 3, "t.toml")
    assert sorted(b.doc["attack"].get("window") for b in baselines) == ["1:2", "2:4"]


# ------------------------------------------------------------------ durability
def _traj(asr, active):
    return [RoundRecord(round=i, accuracy=0.5 + i / 100, loss=1.0, accepted=[], malicious=[], participating=[],
                        extra={"asr": a, "attack_active": on}) for i, (a, on) in enumerate(zip(asr, active))]


def test_lifespan_on_a_hand_made_trajectory():
    # window = rounds 1..2 (E = 2); after it ASR 0.9, 0.7, 0.55, 0.4, 0.8: three rounds ≥ 0.5, then below
    recs = _traj([0.1, 0.6, 0.95, 0.9, 0.7, 0.55, 0.4, 0.8], [False, True, True] + [False] * 5)
    d = durability(recs, after_k=2, threshold=0.5)
    assert d["asr_at_end_of_window"] == 0.95 and d["accuracy_at_end_of_window"] == pytest.approx(0.52)
    assert d["asr_after_k"] == 0.7  # round E + 2 = 4
    assert d["backdoor_lifespan"] == 3 and d["lifespan_censored"] == 0
    d = durability(recs, after_k=9, threshold=0.3)  # never below 0.3: censored at the 5 observed rounds
    assert d["asr_after_k"] is None and d["backdoor_lifespan"] == 5 and d["lifespan_censored"] == 1
    d = durability(recs, threshold=0.99)  # already below at E: no lifespan
    assert d["backdoor_lifespan"] == 0


def test_durability_without_window_and_untargeted():
    recs = _traj([0.2, 0.3], [True, True])
    for r in recs:
        del r.extra["attack_active"]
    assert durability(recs)["asr_at_end_of_window"] == 0.3
    assert durability(recs)["backdoor_lifespan"] is None
    plain = [RoundRecord(round=0, accuracy=0.5, loss=1.0, accepted=[], malicious=[], participating=[])]
    assert durability(plain)["asr_at_end_of_window"] is None


def test_durability_metrics_in_a_run():
    doc = _doc({"name": "backdoor", "window": "1:3", "after_k": 2})
    doc["federation"]["rounds"] = 6
    _, res = _run(doc)
    s = summarize(res.records, after_k=2)
    assert s["asr_at_end_of_window"] == res.records[2].extra["asr"]
    assert s["asr_after_k"] == res.records[4].extra["asr"]
    assert s["backdoor_lifespan"] is not None and 0 <= s["backdoor_lifespan"] <= 3


# ------------------------------------------------------------------ warm-up and start_from
def test_warmup_shared_by_cells_and_reused_from_disk(tmp_path, monkeypatch):
    monkeypatch.setattr(warmup_mod, "_MEMO", type(warmup_mod._MEMO)())
    import redteam.federation.loop as loop_mod

    calls = []
    real = loop_mod.run_warmup  # the warm-up runner each regime hands its setup

    def counted(cls):
        compute = real(cls)
        return lambda *a: calls.append(1) or compute(*a)

    monkeypatch.setattr(loop_mod, "run_warmup", counted)
    doc = _doc("sign_flip", scenario={"warmup_rounds": 3})
    a = Federation(parse_scenario(doc), warmup_dir=str(tmp_path))
    other = copy.deepcopy(doc)
    other["defense"], other["attack"] = "median", {"name": "gaussian"}
    b = Federation(parse_scenario(other), warmup_dir=str(tmp_path))
    assert len(calls) == 1 and torch.equal(a.params0, b.params0)
    assert not torch.equal(a.params0, a.params_init)
    files = list(tmp_path.glob("*.safetensors"))
    assert len(files) == 1
    # a fresh process: the memory is empty, the file is read back
    monkeypatch.setattr(warmup_mod, "_MEMO", type(warmup_mod._MEMO)())
    c = Federation(parse_scenario(doc), warmup_dir=str(tmp_path))
    assert len(calls) == 1 and torch.equal(c.params0, a.params0)
    # the warm-up is R rounds of clean FedAvg: the same as running those rounds with attack none, mean
    plain = copy.deepcopy(doc)
    plain["scenario"] = {"seed": 3}
    plain["federation"]["rounds"] = 3
    plain["attack"], plain["defense"] = "none", "mean"
    ref = Federation(parse_scenario(plain))
    ref.run()
    assert torch.equal(ref.final_params, a.params0)
    # another seed: another warm-up
    seed2 = copy.deepcopy(doc)
    seed2["scenario"]["seed"] = 4
    d = Federation(parse_scenario(seed2), warmup_dir=str(tmp_path))
    assert len(calls) == 2 and not torch.equal(d.params0, a.params0)


def test_foreign_warmup_file_is_recomputed(tmp_path, monkeypatch):
    monkeypatch.setattr(warmup_mod, "_MEMO", type(warmup_mod._MEMO)())
    doc = _doc("none", scenario={"warmup_rounds": 2})
    a = Federation(parse_scenario(doc), warmup_dir=str(tmp_path))
    (f,) = tmp_path.glob("*.safetensors")
    warmup_mod.save_model_file(f, torch.zeros_like(a.params0), a.spec, {"redteam_warmup_key": "someone else"})
    monkeypatch.setattr(warmup_mod, "_MEMO", type(warmup_mod._MEMO)())
    b = Federation(parse_scenario(doc), warmup_dir=str(tmp_path))
    assert torch.equal(b.params0, a.params0)


def test_round0_records_start_and_untrained_is_the_fresh_model(monkeypatch):
    monkeypatch.setattr(warmup_mod, "_MEMO", type(warmup_mod._MEMO)())
    fed, res = _run(_doc("none", scenario={"warmup_rounds": 3}))
    start = res.records[0].extra["start"]
    assert start["warmup"]["rounds"] == 3 and start["accuracy"] > res.records[0].extra["untrained"]["accuracy"]


def test_start_from_safetensors(tmp_path):
    doc = _doc("none")
    fed = Federation(parse_scenario(doc))
    target = fed.params_init + 0.01
    warmup_mod.save_model_file(tmp_path / "m.safetensors", target, fed.spec)
    doc2 = _doc("none", scenario={"start_from": "m.safetensors"})
    f2 = Federation(parse_scenario(doc2, base_dir=tmp_path))
    assert torch.equal(f2.params0, target)
    res = f2.run()
    assert res.records[0].extra["start"]["start_from"]["file"] == "m.safetensors"


def test_start_from_refuses_pickle_and_mismatched_tensors(tmp_path):
    from safetensors.torch import save_file

    fed = Federation(parse_scenario(_doc("none")))
    torch.save({"w": torch.zeros(2)}, tmp_path / "p.safetensors")
    with pytest.raises(InvalidParameter, match="pickle"):
        Federation(parse_scenario(_doc("none", scenario={"start_from": "p.safetensors"}), base_dir=tmp_path))
    named = {n: torch.zeros(s) for n, s in zip(fed.spec.names, fed.spec.shapes)}
    bad_shape = dict(named)
    first = fed.spec.names[0]
    bad_shape[first] = torch.zeros(3)
    save_file(bad_shape, str(tmp_path / "s.safetensors"))
    with pytest.raises(InvalidParameter, match=f"{first} has shape"):
        Federation(parse_scenario(_doc("none", scenario={"start_from": "s.safetensors"}), base_dir=tmp_path))
    missing = dict(named)
    del missing[first]
    missing["extra.weight"] = torch.zeros(1)
    save_file(missing, str(tmp_path / "x.safetensors"))
    with pytest.raises(InvalidParameter, match="missing .*not in the model: extra.weight"):
        Federation(parse_scenario(_doc("none", scenario={"start_from": "x.safetensors"}), base_dir=tmp_path))
    nan = {n: torch.full(s, math.nan) for n, s in zip(fed.spec.names, fed.spec.shapes)}
    save_file(nan, str(tmp_path / "n.safetensors"))
    with pytest.raises(InvalidParameter, match="NaN"):
        Federation(parse_scenario(_doc("none", scenario={"start_from": "n.safetensors"}), base_dir=tmp_path))
    with pytest.raises(InvalidParameter, match="no such file"):
        Federation(parse_scenario(_doc("none", scenario={"start_from": "gone.safetensors"}), base_dir=tmp_path))
    with pytest.raises(InvalidScenario, match="safetensors"):
        parse_scenario(_doc("none", scenario={"start_from": "model.pt"}))


# ------------------------------------------------------------------ requires
def test_requirements(monkeypatch, tmp_path):
    monkeypatch.delenv("REDTEAM_DATA_DIR", raising=False)
    assert unmet(["package:numpy"]) == []
    assert "pip install no_such_pkg_zz" in unmet(["package:no_such_pkg_zz"])[0]
    assert "REDTEAM_DATA_DIR" in unmet(["dataset:cifar10"])[0]
    monkeypatch.setenv("REDTEAM_DATA_DIR", str(tmp_path))
    assert "not a directory" in unmet(["dataset:cifar10"])[0]
    (tmp_path / "cifar10").mkdir()
    assert unmet(["dataset:cifar10"]) == []
    if not torch.cuda.is_available():
        assert "CUDA" in unmet(["device:cuda"])[0]
    with pytest.raises(InvalidScenario, match="requires"):
        parse_scenario(_doc("none", scenario={"requires": ["gpu"]}))


def test_pytest_plugin_skips_unmet_requirements(pytester, monkeypatch):
    monkeypatch.delenv("REDTEAM_DATA_DIR", raising=False)
    pytester.makefile(".toml", paper="""
[scenario]
name = "paper"
requires = ["dataset:cifar10"]
[workload]
name = "digits"
[federation]
clients = 4
rounds = 1
[attack]
name = "sign_flip"
[[expect]]
metric = "final_accuracy"
min = 0.0
""")
    result = pytester.runpytest("paper.toml", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*needs dataset 'cifar10'*"])


def test_cli_run_refuses_unmet_requirements(tmp_path, monkeypatch, capsys):
    from redteam.cli import main

    monkeypatch.delenv("REDTEAM_DATA_DIR", raising=False)
    p = tmp_path / "s.toml"
    p.write_text('[scenario]\nrequires = ["package:no_such_pkg_zz"]\n[federation]\nclients = 4\nrounds = 1\n')
    code = main(["run", str(p)])
    err = capsys.readouterr().err
    assert code != 0 and "no_such_pkg_zz" in err and "Traceback" not in err


# ------------------------------------------------------------------ review fixes
def test_a_ban_outside_the_window_is_a_true_positive():
    """An equivocator banned in its window stays an attacker in the ground truth afterwards: a
    perfect defense is not scored with false positives for keeping it out."""
    doc = _doc({"name": "equivocate", "window": "1:2"},
               defense={"pipeline": [{"name": "signed_chunks"}, {"name": "mean"}]})
    doc["federation"].update(clients=12, rounds=5)
    doc["hierarchy"] = {"fan_out": 2, "depth": 2}
    doc["transport"] = {"chunk_size": 1024}
    _, res = _run(doc)
    s = summarize(res.records)
    assert s["fp"] == 0 and s["tp"] > 0


@pytest.mark.parametrize("attack", ["manifest_mismatch", "group_grinding"])
def test_enrolment_and_grouping_attacks_cannot_wait_for_a_window(attack):
    doc = _doc({"name": attack, "window": "2:3"},
               defense={"pipeline": [{"name": "provenance_gate"}, {"name": "mean"}]} if attack == "manifest_mismatch"
               else "mean")
    with pytest.raises(InvalidParameter, match="cannot wait for a window"):
        Federation(parse_scenario(doc))


def test_rules_are_sized_for_k_clients_a_round():
    doc = _doc("sign_flip", fed={"clients": 20, "clients_per_round": 4, "malicious_fraction": 0.2}, defense="rlr")
    with pytest.raises(InvalidParameter):
        Federation(parse_scenario(doc))


def test_damaged_warmup_file_is_recomputed(tmp_path, monkeypatch):
    monkeypatch.setattr(warmup_mod, "_MEMO", type(warmup_mod._MEMO)())
    doc = _doc("none", scenario={"warmup_rounds": 2})
    a = Federation(parse_scenario(doc), warmup_dir=str(tmp_path))
    (f,) = tmp_path.glob("*.safetensors")
    f.write_bytes(b"abc")
    monkeypatch.setattr(warmup_mod, "_MEMO", type(warmup_mod._MEMO)())
    b = Federation(parse_scenario(doc), warmup_dir=str(tmp_path))
    assert torch.equal(a.params0, b.params0)


def test_warmup_draws_without_the_attacker_selection():
    sc = parse_scenario(_doc("sign_flip", fed={"clients_per_round": 4, "attacker_selection": "every_round"},
                             scenario={"warmup_rounds": 2}))
    ws = warmup_mod.warmup_scenario(sc)
    assert ws.federation.attacker_selection == "random" and ws.federation.clients_per_round == 4


def test_dotted_and_relative_package_requirements():
    assert "pip install no_such_pkg_zz" in unmet(["package:no_such_pkg_zz.sub"])[0]
    with pytest.raises(InvalidScenario, match="requires"):
        parse_scenario(_doc("none", scenario={"requires": ["package:.x"]}))


def test_package_requirements_are_checked_without_importing(tmp_path, monkeypatch):
    """issue 35 §6: checking ``package:X`` or ``package:X.Y`` runs none of X's code (an import has
    side effects a scenario file must not be able to trigger); a missing submodule is still named."""
    import sys

    pkg = tmp_path / "rt_sidefx_pkg"
    (pkg / "sub").mkdir(parents=True)
    ran = tmp_path / "ran"
    for init in (pkg / "__init__.py", pkg / "sub" / "__init__.py"):
        init.write_text(f"open({str(ran)!r}, 'a').write({str(init)!r} + '\\n')\n")
    (pkg / "leaf.py").write_text(f"open({str(ran)!r}, 'a').write('leaf\\n')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert unmet(["package:rt_sidefx_pkg", "package:rt_sidefx_pkg.sub", "package:rt_sidefx_pkg.leaf"]) == []
    (missing,) = unmet(["package:rt_sidefx_pkg.nope"])
    assert "rt_sidefx_pkg.nope" in missing and "pip install rt_sidefx_pkg" in missing
    assert "pip install rt_sidefx_pkg" in unmet(["package:rt_sidefx_pkg.leaf.deeper"])[0]  # a module, not a package
    assert not ran.exists() and not any(m.startswith("rt_sidefx_pkg") for m in sys.modules)


def test_cli_rounds_shorter_than_the_window_is_refused(tmp_path, capsys):
    from redteam.cli import main

    p = tmp_path / "s.toml"
    p.write_text('[federation]\nclients = 4\nrounds = 10\nmalicious_fraction = 0.25\n'
                 '[attack]\nname = "sign_flip"\nwindow = "5:8"\n')
    assert main(["run", str(p), "--rounds", "3"]) != 0
    err = capsys.readouterr().err
    assert "never act" in err and "Traceback" not in err
