"""Protocol defects found from outside (issue 34 §5): each test pins the behaviour that matters,
boundary included. Items: K-of-N draws and bans, draw size, attack-window end, edge-case
replacement under a norm bound, HF image layout, trigger validation against the workload's
shape, DBA's default triggers, literature files without expectations, relative data paths."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

import redteam
from redteam.errors import InvalidScenario, RedteamError
from redteam.federation.loop import Federation
from redteam.federation.sampling import RoundPlan
from redteam.scenario import AttackWindow, FederationSpec, load_scenario, parse_scenario
from redteam.scoring import durability
from redteam.types import AttackContext, ClientData

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]


def _doc(attack="none", fed=None, defense="mean", workload=None, **attack_keys):
    a = {"name": attack, **attack_keys} if isinstance(attack, str) else attack
    return {"scenario": {"seed": 3}, "workload": workload or {"name": "digits", "hidden": 16},
            "federation": {"clients": 8, "rounds": 6, "local_steps": 2, "batch_size": 8, "malicious_fraction": 0.25,
                           "partition": "iid", **(fed or {})},
            "attack": a, "defense": defense}


def _run(doc):
    fed = Federation(parse_scenario(copy.deepcopy(doc)))
    return fed, fed.run()


GATE = {"pipeline": [{"name": "provenance_gate"}, {"name": "mean"}]}


def _trained(rec, fed):
    """The clients that trained in a round: taking part and not kept out (banned / excluded)."""
    return [c for c, p in enumerate(rec.participating) if p and c not in fed.excluded
            and not str(rec.dropped.get(c, "")).startswith(("banned", "provenance"))]


# ------------------------------------------------------------------ 1. banned clients are not drawn
@pytest.mark.parametrize("k", [4, 6, 7])
def test_k_of_n_draw_excludes_banned_clients(k):
    """The gate excludes both attackers (0 and 4) before round 0: K = 4 ⇒ every round trains 4
    of the 6 eligible clients; K = 6 (exactly the eligible) ⇒ all 6; K = 7 > 6 eligible ⇒ the
    documented rule: all eligible clients, never a banned one to fill the round."""
    fed, res = _run(_doc("manifest_mismatch", fed={"clients_per_round": k}, defense=GATE))
    assert sorted(fed.excluded) == [0, 4]
    for rec in res.records:
        trained = _trained(rec, fed)
        assert len(trained) == min(k, 6), (rec.round, trained)
        assert not set(trained) & {0, 4}
        # a banned client keeps being recorded as rejected with its reason (it takes no place among K)
        for c in (0, 4):
            assert rec.participating[c] and "provenance gate" in rec.rejected[c] and not rec.accepted[c]


def test_round_plan_draw_never_picks_banned():
    spec = FederationSpec(clients=10, clients_per_round=3)
    plan = RoundPlan(spec, AttackWindow(), np.zeros(10, dtype=bool), np.random.default_rng(0))
    banned = np.array([1, 2, 3, 4, 5, 6], dtype=np.int64)
    for r in range(200):
        drawn = plan.draw(r, np.arange(10), banned=banned)
        assert drawn.tolist() != [] and len(drawn) == 3 and not set(drawn.tolist()) & set(banned.tolist())
    # fewer eligible than K: all eligible, no banned filler
    assert plan.draw(0, np.arange(10), banned=np.arange(8)).tolist() == [8, 9]


# ------------------------------------------------------------------ 2. K per round under every_round / count
@pytest.mark.parametrize("rule,per_round", [("every_round", None), ("count", 1)])
def test_attacker_selection_rounds_hold_exactly_k(rule, per_round):
    """Excluded attackers must not eat places: each round trains exactly K = 4 clients."""
    fed_keys = {"clients_per_round": 4, "attacker_selection": rule}
    if per_round is not None:
        fed_keys["attackers_per_round"] = per_round
    fed, res = _run(_doc("manifest_mismatch", fed=fed_keys, defense=GATE))
    for rec in res.records:
        assert len(_trained(rec, fed)) == 4, rec.round


def test_count_rule_fills_k_when_honest_clients_are_short():
    """5 attackers available, a = 1 per round, only 2 honest available, K = 4: the round still
    holds K (the places the honest clients cannot fill go to further attackers); with enough
    honest clients it holds exactly a attackers. Boundary: K + 1 available ⇒ K, K available ⇒ all."""
    mal = np.zeros(10, dtype=bool)
    mal[:5] = True
    spec = FederationSpec(clients=10, malicious_fraction=0.5, clients_per_round=4, attacker_selection="count",
                          attackers_per_round=1)
    plan = RoundPlan(spec, AttackWindow(), mal, np.random.default_rng(0))
    short = np.array([0, 1, 2, 3, 4, 5, 6], dtype=np.int64)  # honest: 5, 6
    for r in range(50):
        drawn = plan.draw(r, short)
        assert len(drawn) == 4 and {5, 6} <= set(drawn.tolist())
    for r in range(50):
        drawn = plan.draw(r, np.arange(10))
        assert len(drawn) == 4 and int(mal[drawn].sum()) == 1
    assert len(plan.draw(0, np.arange(5))) == 4  # K + 1 available (all attackers, none honest)
    assert plan.draw(0, np.arange(4)).tolist() == [0, 1, 2, 3]


# ------------------------------------------------------------------ 3. window end needs an attacker
def test_attack_active_only_in_rounds_holding_an_attacker():
    """K = 2 of 8 with 2 attackers drawn at random: many window rounds draw no attacker. Such a
    round is not an active attack round, and the window's end E is the last round with one."""
    doc = _doc({"name": "backdoor", "window": "0:8", "after_k": 1}, fed={"clients_per_round": 2, "rounds": 10})
    fed, res = _run(doc)
    mal = set(fed.malicious)
    flags = []
    for rec in res.records:
        holds = bool(mal & set(_trained(rec, fed)))
        assert rec.extra["attack_active"] == (rec.round < 8 and holds), rec.round
        flags.append(rec.extra["attack_active"])
    in_window_without = [r.round for r in res.records if r.round < 8 and not r.extra["attack_active"]]
    assert in_window_without, "the seed should draw some window round with no attacker"
    end = max(i for i, f in enumerate(flags) if f)
    d = durability(res.records, after_k=1)
    assert d["asr_at_end_of_window"] == res.records[end].extra["asr"]
    # the baseline draws the same clients and marks the same rounds (same E for both)
    base = copy.deepcopy(doc)
    base["attack"] = {"name": "none", "window": "0:8"}
    _, bres = _run(base)
    assert [r.extra["attack_active"] for r in bres.records] == flags


# ------------------------------------------------------------------ 4. edge_case replacement respects the bound
def _ctx(own, defense, n=4):
    own = torch.as_tensor(own, dtype=torch.float32)
    f, d = own.shape
    return AttackContext(round=1, n_clients=n, malicious=tuple(range(n - f, n)), own_updates=own,
                         visible_updates=own, global_params=torch.zeros(d), generator=torch.Generator().manual_seed(0),
                         defense=defense, weights=torch.ones(n))


def test_edge_case_replacement_is_projected_onto_the_defense_ball():
    """n/η = 4 boosts (0.3, 0.4) (norm 0.5) to norm 2; the server clips at M = 1, so with
    eps = "defense" the boosted update is projected onto ‖Δ‖ ≤ margin·M = 0.99 (same direction)."""
    atk = redteam.attack("edge_case", replacement=True)
    out = atk.craft_updates(_ctx([[0.3, 0.4]], redteam.defense("norm_bound", bound=1.0)))
    assert float(out.norm()) == pytest.approx(0.99, rel=1e-5)
    assert torch.allclose(out / out.norm(), torch.tensor([[0.6, 0.8]]), atol=1e-6)
    # inside the ball after the boost: untouched (0.05, 0.0) → (0.2, 0.0), norm 0.2 ≤ 0.99
    small = atk.craft_updates(_ctx([[0.05, 0.0]], redteam.defense("norm_bound", bound=1.0)))
    assert torch.allclose(small, torch.tensor([[0.2, 0.0]]))
    # no bound held by the defense: the boost alone (the black-box attack)
    free = atk.craft_updates(_ctx([[0.3, 0.4]], redteam.defense("mean")))
    assert torch.allclose(free, torch.tensor([[1.2, 1.6]]))
    # a fixed ε is the PGD ball too; "none" never projects
    fixed = redteam.attack("edge_case", replacement=True, eps=0.5).craft_updates(_ctx([[0.3, 0.4]], None))
    assert float(fixed.norm()) == pytest.approx(0.5, rel=1e-5)
    never = redteam.attack("edge_case", replacement=True, eps="none").craft_updates(
        _ctx([[0.3, 0.4]], redteam.defense("norm_bound", bound=1.0)))
    assert torch.allclose(never, torch.tensor([[1.2, 1.6]]))


# ------------------------------------------------------------------ 5. HF image arrays of height 1, 3, 4
@pytest.mark.parametrize("h", [1, 3, 4])
def test_hf_arrays_with_height_1_3_4_keep_their_layout(h):
    from redteam.workloads.files import _images_of

    w = 5
    gray = np.arange(2 * h * w, dtype=np.uint8).reshape(2, h, w)
    a = _images_of(gray, "t")
    assert a.shape == (2, 1, h, w) and np.array_equal(a[:, 0], gray)
    for c in (1, 3):
        hwc = np.arange(2 * h * w * c, dtype=np.uint8).reshape(2, h, w, c)
        a = _images_of(hwc, "t")
        assert a.shape == (2, c, h, w), (h, c, a.shape)
        assert np.array_equal(a, hwc.transpose(0, 3, 1, 2))
    # a channels-first array whose trailing size is no channel count is still read as CHW
    chw = np.zeros((2, 3, h, 8), dtype=np.uint8)
    assert _images_of(chw, "t").shape == (2, 3, h, 8)
    # the declared channel count settles a layout the sizes alone cannot: (N, 3, 4, 4) as CHW
    amb = np.zeros((2, 3, 4, 4), dtype=np.uint8)
    assert _images_of(amb, "t").shape == (2, 4, 3, 4)  # default: the trailing dimension is the channel
    assert _images_of(amb, "t", channels=3).shape == (2, 3, 4, 4)


def test_hf_arrays_known_channel_count_decides():
    from redteam.workloads.files import _images_of

    nhwc = np.zeros((2, 4, 4, 3), dtype=np.uint8)
    assert _images_of(nhwc, "t", channels=3).shape == (2, 3, 4, 4)
    with pytest.raises(RedteamError, match="no axis of 2 channels"):
        _images_of(nhwc, "t", channels=2)


# ------------------------------------------------------------------ 6. triggers validated on the workload's shape
def test_28x28_trigger_accepted_on_an_mnist_shaped_workload():
    doc = _doc({"name": "backdoor", "trigger": [[27, 27], [26, 26], [0, 0]]}, workload={"name": "mnist"})
    sc = parse_scenario(copy.deepcopy(doc))
    assert "image_shape" not in sc.attack.params  # the file's params are kept as written
    doc["attack"]["trigger"] = [[28, 0]]  # one row past the image
    with pytest.raises(InvalidScenario, match="outside an image of 28×28"):
        parse_scenario(doc)
    # the digits workload still refuses what lies outside its 8×8 images, naming 8×8
    small = _doc({"name": "backdoor", "trigger": [[8, 0]]})
    with pytest.raises(InvalidScenario, match="outside an image of 8×8"):
        parse_scenario(small)
    # a composition's part is validated on the workload's shape too
    comp = _doc({"name": "compose", "attacks": [{"name": "backdoor", "trigger": [[27, 27]]}, {"name": "sign_flip"}]},
                workload={"name": "mnist"})
    parse_scenario(comp)


# ------------------------------------------------------------------ 7. DBA's default triggers scale
def test_dba_default_triggers_scale_to_a_28x28_workload():
    """DBA's MNIST layout (Xie et al.): four 1×4 bars, rows 0 and 3, columns 0–3 and 6–9."""
    atk = redteam.attack("dba", image_shape=(28, 28), fraction=1.0, assignment="client_mod")
    parts = atk.triggers
    assert parts == (
        ((0, 0), (0, 1), (0, 2), (0, 3)), ((0, 6), (0, 7), (0, 8), (0, 9)),
        ((3, 0), (3, 1), (3, 2), (3, 3)), ((3, 6), (3, 7), (3, 8), (3, 9)),
    )
    x = torch.zeros(2, 784)
    y = torch.tensor([5, 6])
    tx, _ = atk.targeted_test(x, y)
    assert int(tx[0].sum()) == 16
    # the 8×8 default is unchanged
    assert redteam.attack("dba").triggers == (((0, 0), (0, 1)), ((0, 4), (0, 5)), ((2, 0), (2, 1)), ((2, 4), (2, 5)))
    # (C, H, W) images scale on H × W
    assert redteam.attack("dba", image_shape=(1, 28, 28)).triggers == parts
    # in a scenario on the mnist workload, the filled image shape gives the 28×28 layout
    doc = _doc({"name": "dba"}, workload={"name": "mnist"})
    from redteam.federation.setup import fill_image_shape

    sc = parse_scenario(doc)
    built = redteam.attack("dba", **fill_image_shape(sc.attack, (28, 28)).params)
    assert built.triggers == parts


# ------------------------------------------------------------------ 8. a literature file without expectations skips
def test_flpoison_file_skips_with_its_reason(pytester, monkeypatch):
    monkeypatch.delenv("REDTEAM_DATA_DIR", raising=False)
    src = (ROOT / "scenarios/literature/flpoison_cifar10.toml").read_text()
    f = pytester.makefile(".toml", flpoison_cifar10=src)
    res = pytester.runpytest(str(f), "-rs", "-p", "no:cacheprovider")
    res.assert_outcomes(skipped=1)
    res.stdout.fnmatch_lines(["*SKIPPED*flpoison_cifar10.toml*needs dataset 'cifar10'*"])


def test_flpoison_citation_names_its_first_author():
    text = (ROOT / "scenarios/literature/flpoison_cifar10.toml").read_text()
    assert "Zhang et al." in text and "Li et al." not in text


# ------------------------------------------------------------------ 9. relative data paths: the scenario's directory
def test_relative_workload_file_resolves_against_the_scenario_directory(tmp_path, monkeypatch):
    sub = tmp_path / "scen"
    sub.mkdir()
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    p = sub / "s.toml"
    p.write_text('[workload]\nname = "mnist5k"\nfile = "data/mnist.csv.gz"\n'
                 '[federation]\nclients = 4\nrounds = 1\n')
    sc = load_scenario(p)
    assert sc.workload_params["file"] == str(sub / "data" / "mnist.csv.gz")
    with pytest.raises(RedteamError, match=str(sub / "data" / "mnist.csv.gz").replace(".", r"\.")):
        Federation(sc)
    # a directory the same way, and an absolute path stays as it is (inside the scenario's
    # directory: one outside it is refused, as text_dir is, unless REDTEAM_ALLOW_DATA_DIR_OUTSIDE=1)
    p.write_text('[workload]\nname = "cifar10"\ndir = "data/c10"\n')
    assert load_scenario(p).workload_params["dir"] == str(sub / "data" / "c10")
    p.write_text(f'[workload]\nname = "cifar10"\ndir = "{sub / "c10"}"\n')
    assert load_scenario(p).workload_params["dir"] == str(sub / "c10")
    p.write_text(f'[workload]\nname = "cifar10"\ndir = "{tmp_path}"\n')
    with pytest.raises(RedteamError, match="REDTEAM_ALLOW_DATA_DIR_OUTSIDE"):
        load_scenario(p)
    monkeypatch.setenv("REDTEAM_ALLOW_DATA_DIR_OUTSIDE", "1")
    assert load_scenario(p).workload_params["dir"] == str(tmp_path)


def test_data_dir_from_the_environment_is_kept(tmp_path, monkeypatch):
    from redteam.requirements import data_dir_for

    monkeypatch.setenv("REDTEAM_DATA_DIR", "rel_root")
    p = tmp_path / "s.toml"
    p.write_text('[workload]\nname = "cifar10"\n')
    sc = load_scenario(p)
    assert "dir" not in sc.workload_params
    assert data_dir_for("cifar10", sc.workload_params) == Path("rel_root") / "cifar10"
