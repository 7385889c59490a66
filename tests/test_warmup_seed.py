"""A matrix seeds a scenario's warm-up by the replicate alone (``[scenario] warmup_seed``), so the
cells of one replicate whose settings leave the warm-up unchanged post-train the same pre-trained
model: a paired comparison, and one warm-up computed per replicate instead of one per cell."""

from __future__ import annotations

import copy
import json
import textwrap

import pytest
import torch

from redteam.cli import main
from redteam.errors import InvalidScenario
from redteam.federation.warmup import warmup_key, warmup_scenario
from redteam.matrix import derive_seed, load_matrix, replicate_seeds
from redteam.runner.matrix_run import plan_units, run_matrix
from redteam.runner.store import ResultsStore
from redteam.scenario import parse_scenario

PIPE = textwrap.dedent(
    """\
    [scenario]
    name = "paired"
    seed = 4
    warmup_rounds = 2
    [workload]
    name = "text"
    context = 8
    width = 8
    layers = 3
    heads = 2
    max_bytes = 20000
    [federation]
    rounds = 1
    lr = 0.05
    [pipeline]
    stages = 3
    peers_per_stage = 2
    micro_batches = 2
    micro_batch_size = 4
    attackers = 1
    attacker_stage = 1
    optimizer = "sgd"
    warmup_optimizer = "adam"
    warmup_lr = 0.003
    [attack]
    name = "lazy_peer"
    [matrix]
    seeds = 2
    attacks = ["lazy_peer"]
    defenses = ["mean"]
    [matrix.settings]
    "pipeline.attacker_stage" = [1, 2]
    "federation.lr" = [1e-6, 0.05]
    """
)


def test_replicate_seeds_adds_a_warm_up_seed_only_where_it_changes_something():
    settings = (("federation.lr", 0.1),)
    seed = derive_seed(3, settings, 1)
    # no warm-up: the run's seed alone, as before
    assert replicate_seeds(3, settings, 1, {}) == {"seed": seed}
    assert replicate_seeds(3, settings, 1, {"warmup_rounds": 0}) == {"seed": seed}
    # a warm-up and settings: seeded by the scenario seed and the replicate, not the settings
    assert replicate_seeds(3, settings, 1, {"warmup_rounds": 5}) == {"seed": seed,
                                                                      "warmup_seed": derive_seed(3, (), 1)}
    assert replicate_seeds(3, (("federation.lr", 0.2),), 1, {"warmup_rounds": 5})["warmup_seed"] \
        == derive_seed(3, (), 1)
    # no settings: the warm-up's seed is the run's, so nothing is added (stored runs keep their keys)
    assert replicate_seeds(3, (), 1, {"warmup_rounds": 5}) == {"seed": derive_seed(3, (), 1)}
    # the file's own warm-up seed is kept
    assert replicate_seeds(3, settings, 1, {"warmup_rounds": 5, "warmup_seed": 9}) == {"seed": seed}


def test_a_warm_up_seed_without_a_warm_up_is_refused_in_one_line():
    doc = {"scenario": {"seed": 1, "warmup_seed": 7}, "workload": {"name": "synthetic", "samples": 100}}
    with pytest.raises(InvalidScenario, match=r"warmup_seed.*sets the warm-up's seed, and there is none"):
        parse_scenario(doc)
    doc["scenario"]["warmup_rounds"] = 1
    assert parse_scenario(doc).scenario.warmup_seed == 7
    doc["scenario"]["warmup_seed"] = -1
    with pytest.raises(InvalidScenario, match="warmup_seed"):
        parse_scenario(doc)


def test_the_warm_up_runs_on_its_own_seed_and_the_default_leaves_digests_alone():
    doc = {"scenario": {"seed": 1, "warmup_rounds": 3}, "workload": {"name": "synthetic", "samples": 100}}
    plain = parse_scenario(copy.deepcopy(doc))
    assert "warmup_seed" not in plain.to_dict()["scenario"]  # a late default: old stores keep their keys
    assert warmup_scenario(plain).seed == 1
    doc["scenario"]["warmup_seed"] = 8
    own = parse_scenario(copy.deepcopy(doc))
    ws = warmup_scenario(own)
    assert ws.seed == 8 and ws.scenario.warmup_seed is None and ws.scenario.warmup_rounds == 0
    # two runs of different seeds on one warm-up seed share the warm-up; another warm-up seed does not
    doc["scenario"]["seed"] = 2
    other_run = parse_scenario(copy.deepcopy(doc))
    cpu = torch.device("cpu")
    assert warmup_key(other_run, cpu) == warmup_key(own, cpu) != warmup_key(plain, cpu)
    assert other_run.digest() != own.digest()


def test_cells_of_a_replicate_share_one_warm_up_and_replicates_do_not(tmp_path):
    f = tmp_path / "paired.toml"
    f.write_text(PIPE)
    base, matrix, _ = load_matrix(f)
    rows, b_units, a_units = plan_units(matrix, base.seed, f.name)
    keys: dict[int, set[str]] = {}
    seeds: dict[int, set[int]] = {}
    for u in b_units + a_units:
        sc = parse_scenario({k: v for k, v in u.doc.items() if k != "_run"})
        keys.setdefault(u.replicate, set()).add(warmup_key(sc, torch.device("cpu")))
        seeds.setdefault(u.replicate, set()).add(sc.seed)
    assert len(b_units) == len(a_units) == 8
    assert [len(keys[r]) for r in (0, 1)] == [1, 1] and keys[0] != keys[1]
    assert [len(seeds[r]) for r in (0, 1)] == [4, 4]  # the runs themselves keep their per-cell seeds


def test_a_matrix_computes_one_warm_up_per_replicate_and_the_cells_start_from_it(tmp_path):
    f = tmp_path / "paired.toml"
    f.write_text(PIPE.replace('"federation.lr" = [1e-6, 0.05]\n', ""))
    out = tmp_path / "out"
    summary = run_matrix(f, out, workers=1)
    assert summary.computed == 8  # 2 cells x 2 seeds, attacked and baseline
    assert len(list((out / "warmups").glob("*.safetensors"))) == 2
    starts: dict[int, set[str]] = {}
    with ResultsStore(out / "results.sqlite") as store:
        for item in store.results(with_rounds=True):
            for rounds in (item["rounds"], item["baseline_rounds"]):
                starts.setdefault(item["replicate"], set()).add(rounds[0]["extra"]["start"]["warmup"]["sha256"])
    assert [len(starts[r]) for r in (0, 1)] == [1, 1] and starts[0] != starts[1]


def test_run_cell_starts_from_the_warm_up_the_matrix_uses(tmp_path, capsys):
    f = tmp_path / "paired.toml"
    f.write_text(PIPE.replace("seeds = 2", "seeds = 1"))
    cell = "mean[lazy_peer,attacker_stage=2,lr=0.05]"
    js = tmp_path / "cell.json"
    assert main(["run", str(f), "--cell", cell, "--json", str(js)]) == 0
    doc = json.loads(js.read_text())
    spec = doc["scenario"]["spec"]["scenario"]
    assert spec["warmup_seed"] == derive_seed(4, (), 0)
    assert spec["seed"] == derive_seed(4, (("federation.lr", 0.05), ("pipeline.attacker_stage", 2)), 0)
    # a --seed of the user's own seeds the warm-up too
    assert main(["run", str(f), "--cell", cell, "--seed", "11", "--json", str(js)]) == 0
    spec = json.loads(js.read_text())["scenario"]["spec"]["scenario"]
    assert spec["seed"] == 11 and "warmup_seed" not in spec
    capsys.readouterr()


def test_the_dry_run_probe_of_a_pipeline_with_a_warm_up_optimizer_gives_an_estimate(tmp_path, capsys):
    """The probe leaves the warm-up out; it left the pipeline's warm-up optimizer in, so the probe
    of every such file failed ("sets the warm-up, and there is none")."""
    f = tmp_path / "paired.toml"
    f.write_text(PIPE)
    assert main(["matrix", str(f), "--out", str(tmp_path / "out"), "--dry-run"]) == 0
    captured = capsys.readouterr()
    text = " ".join(captured.out.split())
    assert "estimate: ≈" in text and "probe failed" not in captured.err
