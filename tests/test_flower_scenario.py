"""A user's own Flower app scored by redteam: the [flower] scenario section, the Flower regime's
refusals, FlowerRun's records, and a tiny matrix of the quickstart example into the results store."""

from __future__ import annotations

import copy
import json
import sqlite3
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from redteam.errors import InvalidParameter, InvalidScenario  # noqa: E402
from redteam.scenario import PluginSpec, parse_scenario  # noqa: E402

HERE = Path(__file__).parent
EXAMPLE = HERE.parent / "examples" / "flower_quickstart"


def doc(**over):
    d = {"scenario": {"name": "tiny", "seed": 3},
         "flower": {"app": "_flower_tiny_app:scored"},
         "federation": {"clients": 6, "malicious_fraction": 1 / 3, "rounds": 3},
         "attack": {"name": "sign_flip", "scale": 4.0}, "defense": {"name": "krum"}}
    for k, v in over.items():
        if v is None:
            d.pop(k, None)
        else:
            d[k] = v
    return d


def scenario(**over):
    return parse_scenario(doc(**over), file="tiny.toml", base_dir=HERE)


def run(sc, attack=None):
    from redteam.federation.regimes import make_run

    return make_run(sc, attack=attack).run()


# ---------------------------------------------------------------- the section
def test_the_section_parses_into_a_frozen_spec_in_the_digest():
    sc = scenario()
    assert sc.flower.app == "_flower_tiny_app:scored" and sc.flower.engine == "local" and sc.flower.ray_cpus == 2
    from redteam.topology import support_of

    assert support_of(sc).name == "flower"
    other = scenario(flower={"app": "_flower_tiny_app:scored", "params": {"local_steps": 2}})
    assert other.digest() != sc.digest()
    assert "flower" not in parse_scenario({}, file="x").to_dict()  # native scenarios keep their digests


@pytest.mark.parametrize("over, match", [
    ({"flower": {"app": "no_colon"}}, r"\[flower\]\.app = \"no_colon\": must be \"module:attribute\""),
    ({"flower": {"engine": "local"}}, r"\[flower\] needs app = \"module:attribute\""),
    ({"flower": {"app": "a:b", "engine": "threads"}}, r"\[flower\]\.engine = \"threads\""),
    ({"flower": {"app": "a:b", "params": 3}}, r"\[flower\]\.params = 3: must be a table"),
    ({"workload": {"name": "digits"}}, r"\[workload\] does not apply to a \[flower\] scenario"),
    ({"federation": {"clients": 6, "lr": 0.1}}, r"\[federation\]\.lr does not apply to a \[flower\] scenario"),
    ({"scenario": {"seed": 1, "warmup_rounds": 2}}, r"\[scenario\]\.warmup_rounds does not apply"),
    ({"gossip": {"topology": "ring"}}, r"\[gossip\] and \[flower\] are two regimes|\[flower\] and \[gossip\]"),
    ({"attack": {"name": "sign_flip", "window": "1:"}}, r"a \[flower\] run attacks in every round"),
    ({"defense": {"name": "flower:Krum"}}, r"'flower:Krum': not one of Flower's strategies redteam runs "
                                           r"\(flower:FedAvg, flower:FedMedian, flower:FedTrimmedAvg\)"),
    ({"defense": {"name": "flower:FedTrimmedAvg", "beta": 0.5}}, r"beta = 0.5: must be a number in \[0, 0.5\)"),
    ({"defense": {"name": "flower:FedMedian", "beta": 0.1}}, r"unknown parameter 'beta' \(it takes none\)"),
    ({"defense": {"pipeline": [{"name": "norm_bound"}, {"name": "flower:FedAvg"}]}},
     r"pipeline\[1\]\.name = \"flower:FedAvg\": is a whole Flower strategy"),
])
def test_the_section_refuses_what_it_does_not_read(over, match):
    with pytest.raises(InvalidScenario, match=match):
        scenario(**over)


def test_a_flower_defense_needs_the_section():
    with pytest.raises(InvalidScenario, match=r"'flower:FedAvg' is one of Flower's strategies; it runs in a "
                                              r"scenario with a \[flower\] section"):
        parse_scenario({"defense": {"name": "flower:FedAvg"}}, file="x.toml")


def test_beta_just_below_a_half_is_taken():
    assert scenario(defense={"name": "flower:FedTrimmedAvg", "beta": 0.49}).defense[0].params == {"beta": 0.49}


# ---------------------------------------------------------------- refusals by the one rule
@pytest.mark.parametrize("attack, match", [
    ({"name": "chunk_tamper"}, r"attack 'chunk_tamper' acts on transport, which the \[flower\] regime does not "
                               r"model \(it takes data, updates attacks\)"),
    ({"name": "backdoor"}, r"attack 'backdoor' is scored by its success on triggered test data"),
])
def test_attacks_a_flower_app_cannot_host_are_refused_by_name(attack, match):
    from redteam.federation.regimes import make_run

    with pytest.raises(InvalidParameter, match=match):
        make_run(scenario(attack=attack))


def test_a_defense_that_needs_server_data_is_refused_by_name():
    from redteam.federation.regimes import make_run

    with pytest.raises(InvalidParameter, match=r"needs server-held data .* \[flower\] regime has no server"):
        make_run(scenario(defense={"name": "fltrust"}))


@pytest.mark.parametrize("app, match", [
    ("_no_such_module:scored", r"cannot import module '_no_such_module'"),
    ("_flower_tiny_app:absent", r"module '_flower_tiny_app' has no attribute 'absent'"),
    ("_flower_tiny_app:NOT_A_FACTORY", r"'NOT_A_FACTORY' is a int, expected a factory"),
])
def test_an_app_reference_that_does_not_resolve_is_named(app, match):
    from redteam.federation.regimes import make_run

    with pytest.raises(InvalidParameter, match=match):
        make_run(scenario(flower={"app": app}))


def test_an_app_returning_the_wrong_things_is_named():
    with pytest.raises(InvalidScenario, match=r"returned a dict, expected a redteam.integrations.flower.ScoredApp"):
        run(scenario(flower={"app": "_flower_tiny_app:wrong_type"}))
    with pytest.raises(InvalidParameter, match=r"evaluate\(arrays\) returned \{'accuracy': 0.5\}; expected a "
                                               r"mapping with 'accuracy' and 'loss'"):
        run(scenario(flower={"app": "_flower_tiny_app:scored", "params": {"broken_evaluate": True}}))


# ---------------------------------------------------------------- the records
def test_records_carry_who_was_malicious_accepted_and_rejected():
    import _flower_tiny_app as tiny

    tiny.CALLS.clear()
    sc = scenario()
    attacked = run(sc)
    baseline = run(sc, PluginSpec("none"))
    assert tiny.CALLS[0] == tiny.CALLS[1]  # the baseline's app: the same clients, rounds and seed
    assert tiny.CALLS[0].seed == 3 and tiny.CALLS[0].clients == 6 and tiny.CALLS[0].rounds == 3
    assert attacked.malicious == baseline.malicious and len(attacked.malicious) == 2
    assert len(attacked.records) == 3 and [r.round for r in attacked.records] == [0, 1, 2]
    for r in attacked.records:
        assert r.malicious == [c in attacked.malicious for c in range(6)]
        assert r.participating == [True] * 6 and r.dropped == {}
        # krum keeps one reply; a ×4 flipped update is never the one
        assert sum(r.accepted) == 1 and not any(r.accepted[c] for c in attacked.malicious)
        assert set(r.rejected) == set(range(6)) - {r.accepted.index(True)}
    for r in baseline.records:
        assert r.malicious == [False] * 6  # the baseline's malicious clients act honestly
    u = attacked.records[0].extra["untrained"]
    assert set(u) == {"accuracy", "loss", "chance_accuracy", "unigram_loss"} and 0 < u["chance_accuracy"] < 1
    assert "untrained" not in attacked.records[1].extra
    assert baseline.records[-1].accuracy > u["chance_accuracy"] + 0.2  # the tiny app learns


def test_the_malicious_partitions_follow_the_seed():
    a, b = run(scenario(scenario={"seed": 3})), run(scenario(scenario={"seed": 4}))
    assert a.malicious != b.malicious or a.records[-1].accuracy != b.records[-1].accuracy
    assert run(scenario(scenario={"seed": 3})).malicious == a.malicious


def test_flowers_trimmed_mean_and_ours_record_the_same_runs():
    ours = run(scenario(defense={"name": "trimmed_mean"}))
    theirs = run(scenario(defense={"name": "flower:FedTrimmedAvg", "beta": 1 / 3}))  # ⌊6/3⌋ = 2 = f
    assert [r.accuracy for r in ours.records] == pytest.approx([r.accuracy for r in theirs.records], abs=1e-6)
    assert all(r.accepted == [True] * 6 for r in theirs.records)  # Flower's coordinate-wise rule keeps every reply
    fewer = run(scenario(defense={"name": "flower:FedTrimmedAvg", "beta": 0.1}))  # ⌊0.6⌋ = 0: the plain mean
    assert fewer.records[-1].accuracy != pytest.approx(ours.records[-1].accuracy, abs=1e-6)


def test_a_failing_client_is_recorded_as_dropped():
    res = run(scenario(flower={"app": "_flower_tiny_app:scored", "params": {"fail_partition": 4}},
                       defense={"name": "mean"}))
    for r in res.records:
        assert r.dropped == {4: "no reply"} and not r.accepted[4] and sum(r.accepted) == 5
        assert r.extra["client_errors"] == ["RuntimeError: partition 4 fails on purpose"]


def test_an_omniscient_attack_sees_the_honest_replies():
    res = run(scenario(attack={"name": "alie"}, defense={"name": "mean"}))
    base = run(scenario(defense={"name": "mean"}), PluginSpec("none"))
    assert res.records[-1].accuracy != base.records[-1].accuracy


# ---------------------------------------------------------------- flwr stays lazy
def test_parsing_a_flower_scenario_imports_no_flower():
    code = ("import sys; from redteam.scenario import load_scenario; "
            f"load_scenario({str(EXAMPLE / 'scenario.toml')!r}); print('flwr' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=HERE.parent, check=True)
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------- a tiny matrix of the example
def test_a_tiny_matrix_of_the_example_fills_the_store(tmp_path):
    from redteam.cli import main

    d = tomllib.loads((EXAMPLE / "scenario.toml").read_text())
    d = copy.deepcopy(d)
    d.pop("expect")
    d["federation"] = {"clients": 5, "malicious_fraction": 0.2, "rounds": 4}
    d["matrix"]["seeds"] = 1
    d["matrix"]["defenses"] = [{"name": "trimmed_mean", "label": "trimmed_mean"},
                               {"name": "flower:FedTrimmedAvg", "beta": 0.2, "label": "flower:FedTrimmedAvg"}]
    path = EXAMPLE / f"_test_tiny_{tmp_path.name}.toml"  # beside the app's module, as a user's scenario lies
    from redteam.report.formats import toml_dump

    path.write_text(toml_dump(d))
    try:
        rc = main(["matrix", str(path), "--out", str(tmp_path / "out")])
    finally:
        path.unlink()
    assert rc in (0, None)
    con = sqlite3.connect(tmp_path / "out" / "results.sqlite")
    runs = con.execute("select cell_id, baseline, seed, metrics, rounds from runs").fetchall()
    assert len(runs) == 6  # 2 defenses × (a baseline + sign_flip + alie), 1 seed
    by = {(c, b): (s, json.loads(m), json.loads(r)) for c, b, s, m, r in runs}
    seeds = {s for s, _, _ in by.values()}
    assert len(seeds) == 1  # baselines and attacked runs share the cell's seed
    for attack in ("none", "sign_flip", "alie"):
        ours = by[(f"trimmed_mean[{attack}]", int(attack == "none"))]
        theirs = by[(f"flower:FedTrimmedAvg[{attack}]", int(attack == "none"))]
        assert ours[1]["final_accuracy"] == pytest.approx(theirs[1]["final_accuracy"], abs=1e-9)
        assert len(ours[2]) == 4
    base = by[("trimmed_mean[none]", 1)]
    assert base[1]["final_accuracy"] > base[2][0]["extra"]["untrained"]["chance_accuracy"] + 0.1
    assert by[("trimmed_mean[sign_flip]", 0)][1]["accuracy_drop"] is not None
    assert (tmp_path / "out" / "report.html").is_file()


def test_the_pytest_plugin_lets_a_flower_defense_through_only_with_the_section():
    from redteam.matrix import expand
    from redteam.pytest_plugin import _check_names

    d = tomllib.loads((EXAMPLE / "scenario.toml").read_text())
    _check_names(expand(d, "scenario.toml", check_plugins=False).cells, "scenario.toml")
    d.pop("flower")
    with pytest.raises(InvalidScenario, match=r"'flower:FedTrimmedAvg' is one of Flower's strategies; it runs in a "
                                              r"scenario with a \[flower\] section"):
        _check_names(expand(d, "scenario.toml", check_plugins=False).cells, "scenario.toml")


@pytest.mark.slow
def test_the_ray_engine_records_what_the_local_engine_records():
    pytest.importorskip("ray")
    over = {"federation": {"clients": 3, "malicious_fraction": 0.34, "rounds": 2}, "attack": {"name": "alie"},
            "defense": {"name": "trimmed_mean"}}
    local = run(scenario(**over))
    ray = run(scenario(flower={"app": "_flower_tiny_app:scored", "engine": "ray", "ray_cpus": 1}, **over))
    assert [r.accuracy for r in ray.records] == [r.accuracy for r in local.records]
    assert [r.accepted for r in ray.records] == [r.accepted for r in local.records]
    assert ray.malicious == local.malicious
