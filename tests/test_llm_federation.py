"""The text workload inside the federation: by-group partition, DiLoCo rounds, metrics."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.func import functional_call

from redteam.errors import InvalidParameter
from redteam.federation import stages
from redteam.federation.loop import Federation
from redteam.federation.partition import partition
from redteam.scenario import parse_scenario
from redteam.scoring import language_model, summarize
from redteam.types import RoundRecord
from redteam.workloads import corpus
from redteam.workloads.text import TextLM


def _scenario(workload: dict[str, Any], federation: dict[str, Any], attack: dict[str, Any] | None = None,
              defense: dict[str, Any] | None = None) -> Any:
    return parse_scenario({
        "scenario": {"name": "llm-test", "seed": 0},
        "workload": {"name": "text", **workload},
        "federation": federation,
        "transport": {"codec": "none"},
        "attack": attack or {"name": "none"},
        "defense": defense or {"name": "mean"},
    })


def test_by_group_partition_by_hand() -> None:
    # groups 0, 0, 0, 1, 1, 2 (sizes 3, 2, 1), 2 clients, largest first to the lighter
    # client: g0 → c0 (load 3), g1 → c1 (2), g2 → c1 (3)
    parts = partition(np.array([0, 0, 0, 1, 1, 2]), 2, "by_group", np.random.default_rng(0), min_samples=1)
    assert [p.tolist() for p in parts] == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(InvalidParameter, match="3 groups cannot give 4 clients"):
        partition(np.array([0, 1, 2]), 4, "by_group", np.random.default_rng(0), min_samples=0)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=6, max_size=60), st.integers(1, 4), st.integers(0, 2**32 - 1))
def test_by_group_never_splits_a_group(labels: list[int], n: int, seed: int) -> None:
    y = np.array(labels)
    if len(np.unique(y)) < n:
        return
    parts = partition(y, n, "by_group", np.random.default_rng(seed), min_samples=1)
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(y)))
    owners = [{int(g) for g in y[p]} for p in parts]
    for a in range(n):
        for b in range(a + 1, n):
            assert owners[a].isdisjoint(owners[b])


def _equal_groups(root: Path, groups: int, length: int) -> Path:
    for g in range(groups):
        d = root / f"pkg{g}"
        d.mkdir(parents=True)
        text = (f"def f{g}(x):\n    return x * {g} + {g * g}\n" * 10)[:length]
        (d / "mod.py").write_text(text)
    return root


def test_diloco_h1_sgd_outer_lr1_equals_fedsgd(tmp_path: Path) -> None:
    # Every training group is one file of 49 bytes = 6 windows of 8 + 1 bytes; each client
    # gets one group (by_group, clients = groups) and a batch of 6 drawn without replacement
    # is its whole data: one inner SGD step is a full-batch gradient step. The outer step
    # (Nesterov, η = 1, μ = 0) then gives w ← w − lr · mean_i ∇L_i(w): FedSGD (McMahan et
    # al. 2017), recomputed here with plain autograd, one client at a time.
    wl = {"text_dir": str(_equal_groups(tmp_path / "c", 8, 49)), "context": 8, "width": 16, "layers": 1,
          "heads": 2, "heldout_fraction": 0.2, "eval_windows": 64}
    n = len(TextLM(**wl).documents()[0])
    assert n >= 3
    fed_cfg = {"clients": n, "rounds": 3, "partition": "by_group", "local_steps": 1, "batch_size": 6, "lr": 0.5,
               "sampling": "without_replacement", "root_samples": 0, "server_optimizer": "nesterov",
               "server_lr": 1.0, "server_momentum": 0.0}
    fed = Federation(_scenario(wl, fed_cfg))
    assert fed.data.sizes.tolist() == [6] * n
    w = fed.params0.clone()
    model, spec, workload = fed.trainer.model, fed.spec, fed.workload
    want = []
    for _ in range(3):
        grads = []
        for c in range(n):
            cd = fed.data.client(c)
            p = w.clone().requires_grad_(True)
            (g,) = torch.autograd.grad(workload.loss(functional_call(model, spec.unflatten(p), (cd.x,)), cd.y), p)
            grads.append(g)
        w = w - 0.5 * torch.stack(grads).mean(0)
        with torch.no_grad():
            want.append(float(workload.loss(functional_call(model, spec.unflatten(w), (fed.test_x,)), fed.test_y)))
    got = [r.loss for r in fed.run().records]
    assert got == pytest.approx(want, rel=1e-5)
    # and the same federation with the FedAvg server step (η = 1) gives identical records
    fedavg = Federation(_scenario(wl, {**fed_cfg, "server_optimizer": "fedavg"})).run().records
    assert [r.loss for r in fedavg] == got


def test_diloco_run_beats_the_unigram_baseline_and_keeps_adamw_state() -> None:
    # a CI-sized DiLoCo run on the default corpus (the standard library's text): 8 clients
    # by package, inner AdamW (H = 20), outer Nesterov (0.7, 0.9); held-out bits per byte
    # must fall clearly below the add-one unigram model of the training bytes (≈ 4.6 bits)
    wl = {"context": 32, "width": 32, "layers": 1, "heads": 2, "max_bytes": 300_000}
    sc = _scenario(wl, {"clients": 8, "rounds": 5, "partition": "by_group", "local_steps": 20, "batch_size": 8,
                        "lr": 0.003, "local_optimizer": "adamw", "server_optimizer": "nesterov"})
    fed = Federation(sc)
    ds = TextLM(**wl).load(0)
    unigram = corpus.unigram_cross_entropy(ds.train_y.numpy(), fed.test_y.cpu().numpy())
    records = fed.run().records
    metrics = summarize(records, records)
    assert metrics["final_bits_per_byte"] < unigram - 0.3, (metrics["final_bits_per_byte"], unigram)
    assert metrics["final_perplexity"] == pytest.approx(math.exp(records[-1].loss))
    assert metrics["bits_per_byte_increase"] == 0.0 and metrics["perplexity_increase"] == 0.0
    assert metrics["rounds_to_target_loss"] is not None  # the baseline reaches its own final loss
    # per-client AdamW state was kept across the 5 rounds: 5 × 20 steps on every client
    t = fed.states.rows("adamw_t", torch.arange(8), (), torch.int64)
    assert t.tolist() == [100] * 8


def test_backdoor_run_records_asr_and_false_trigger(tmp_path: Path) -> None:
    wl = {"text_dir": str(_equal_groups(tmp_path / "c", 8, 200)), "context": 24, "width": 16, "layers": 1,
          "heads": 2, "heldout_fraction": 0.2}
    sc = _scenario(wl, {"clients": 4, "rounds": 2, "partition": "by_group", "local_steps": 2, "batch_size": 4,
                        "lr": 0.003, "local_optimizer": "adamw", "server_optimizer": "nesterov",
                        "malicious_fraction": 0.25},
                   attack={"name": "trigger_phrase", "trigger": "verify=", "target": "False"})
    rec = Federation(sc).run().records[-1]
    assert 0.0 <= rec.extra["asr"] <= 1.0 and 0.0 <= rec.extra["false_trigger"] <= 1.0
    assert summarize([rec])["false_trigger_rate"] == rec.extra["false_trigger"]


@pytest.mark.parametrize("attack, message", [
    ({"name": "backdoor"}, "needs float image inputs"),
    ({"name": "label_flip"}, "outside"),
])
def test_classifier_attacks_refuse_text_with_one_line(tmp_path: Path, attack: dict[str, Any], message: str) -> None:
    wl = {"text_dir": str(_equal_groups(tmp_path / "c", 6, 100)), "context": 8, "width": 16, "layers": 1, "heads": 2}
    sc = _scenario(wl, {"clients": 3, "rounds": 1, "partition": "by_group", "malicious_fraction": 0.34}, attack=attack)
    with pytest.raises(InvalidParameter, match=message):
        Federation(sc)


def _rec(r: int, loss: float, **extra: Any) -> RoundRecord:
    return RoundRecord(round=r, accuracy=0.0, loss=loss, accepted=[True], malicious=[False], participating=[True],
                       extra=dict(extra))


def test_language_model_metrics_by_hand() -> None:
    # attacked losses ln 8, ln 4, ln 4 (nats): final 2 bits per byte, perplexity 4;
    # baseline ends at ln 2: 1 bit, perplexity 2 → increases 1 bit and 2; the attacked run
    # first gets to the baseline's final loss ln 2: never. Against a target of ln 4 it is
    # round 2 (1-based).
    attacked = [_rec(0, math.log(8)), _rec(1, math.log(4)), _rec(2, math.log(4), false_trigger=0.25)]
    baseline = [_rec(0, math.log(4)), _rec(1, math.log(2))]
    m = language_model(attacked, baseline)
    assert m["final_bits_per_byte"] == pytest.approx(2.0) and m["final_perplexity"] == pytest.approx(4.0)
    assert m["bits_per_byte_increase"] == pytest.approx(1.0) and m["perplexity_increase"] == pytest.approx(2.0)
    assert m["rounds_to_target_loss"] is None and m["false_trigger_rate"] == 0.25
    assert language_model(attacked, baseline, target_loss=math.log(4))["rounds_to_target_loss"] == 2
    # a diverged run: infinite loss has no bits or perplexity, not a crash
    assert language_model([_rec(0, float("inf"))])["final_perplexity"] is None


def test_every_registered_plugin_runs_on_text_or_refuses_in_one_line(tmp_path: Path) -> None:
    # update-space attacks and every defense run on the LM's pseudo-gradients unchanged;
    # what needs a classifier (pixel triggers, label flips, n/η of the FedAvg step) refuses
    # with one line naming the parameter — never a deep error from inside torch
    import redteam
    from redteam.errors import RedteamError

    root = str(_equal_groups(tmp_path / "c", 8, 400))

    # the same code paths at a fraction of the paper's probe and training budgets (DeepSight's 20,000
    # random inputs a seed, Snowball's 270 + 30 VAE epochs): this test asks whether each runs on text
    cheap = {"deepsight": {"num_samples": 200, "probe_batch": 200}, "snowball": {"vae_initial": 20, "vae_tuning": 5}}

    def run(attack: str, defense: str) -> None:
        sc = _scenario({"text_dir": root, "context": 16, "width": 16, "layers": 1, "heads": 2},
                       {"clients": 6, "rounds": 1, "partition": "by_group", "local_steps": 2, "batch_size": 4,
                        "lr": 0.003, "local_optimizer": "adamw", "server_optimizer": "nesterov",
                        "malicious_fraction": 0.34}, attack={"name": attack},
                       defense={"name": defense, **cheap.get(defense, {})})
        Federation(sc).run()

    refused: dict[str, str] = {}
    runs = [(a, "mean") for a in redteam.ATTACKS.names()] + [("sign_flip", d) for d in redteam.DEFENSES.names()]
    for attack, defense in runs:
        try:
            run(attack, defense)
        except RedteamError as exc:
            message = str(exc)
            assert "\n" not in message and len(message) < 400, (attack, defense, message)
            refused[attack if defense == "mean" else defense] = message
    # every defense runs, but a pipeline's hop checks, which refuse a data-parallel run in one line
    hop_checks = {d for d in redteam.DEFENSES.names() if getattr(redteam.DEFENSES.get(d), "acts_at", None) == "pipeline"}
    assert hop_checks and all("needs a [pipeline] section" in refused[d] for d in hop_checks)
    # and spot-check replay, which cannot redo AdamW's inner steps (per-client moments) and says so
    replays = {d for d in redteam.DEFENSES.names() if getattr(redteam.DEFENSES.get(d), "replays_work", False)}
    assert replays and all("local_optimizer = 'adamw'" in refused[d] for d in replays)
    # and BackdoorIndicator, whose indicator task is labelled OOD images (Li & Dai, USENIX Security 2024)
    image_only = {"indicator"}
    assert all("token ids: use an image workload" in refused[d] for d in image_only)
    assert not any(d in refused for d in redteam.DEFENSES.names()
                   if d != "mean" and d not in hop_checks | replays | image_only)
    for name in ("sign_flip", "alie", "ipm", "min_max", "trigger_phrase", "outer_push", "outer_replacement"):
        assert name not in refused, refused.get(name)
    assert "pixel pattern needs float image inputs" in refused["backdoor"]


def test_partial_straggler_policy_by_hand() -> None:
    # upload = 400,000 B at 8 Mbit/s (1 MB/s) + 100 ms RTT = 0.5 s; deadline 2 s leaves
    # 1.5 s of compute: ⌊1.5/0.1⌋ = 15 → capped at H = 10; ⌊1.5/0.3⌋ = 5; ⌊1.5/2⌋ = 0
    from redteam.transport.network import Network, NetworkConfig

    def steps(policy: str) -> list[int]:
        net = Network(NetworkConfig(deadline_s=2.0, stragglers=policy), 3, np.random.default_rng(0),
                      bandwidth_mbps=[8, 8, 8], latency_ms=[100, 100, 100], compute_s_per_step=[0.1, 0.3, 2.0])
        return net.steps_by_deadline([0, 1, 2], 10, 400_000).tolist()

    assert steps("partial") == [10, 5, 0] and steps("drop") == [10, 10, 10]
    with pytest.raises(InvalidParameter, match="stragglers = 'late'"):
        NetworkConfig(stragglers="late")


def test_partial_stragglers_send_what_they_finished(tmp_path: Path) -> None:
    # a deadline that half the clients miss with all H = 10 steps: "drop" loses them,
    # "partial" gets their shorter pseudo-gradients in time
    wl = {"text_dir": str(_equal_groups(tmp_path / "c", 8, 200)), "context": 8, "width": 16, "layers": 1, "heads": 2}

    def stragglers(policy: str) -> int:
        sc = parse_scenario({
            "scenario": {"name": "deadline", "seed": 1}, "workload": {"name": "text", **wl},
            "federation": {"clients": 6, "rounds": 2, "partition": "by_group", "local_steps": 10, "batch_size": 4,
                           "lr": 0.003, "local_optimizer": "adamw", "server_optimizer": "nesterov"},
            "transport": {"codec": "none", "network": {
                "deadline_s": 1.0, "compute_s_per_step": 0.1, "compute_sigma": 0.5, "bandwidth_mbps": 1000.0,
                "latency_ms": 10.0, "stragglers": policy}}})
        fed = Federation(sc)
        steps: list[dict[int, int] | None] = []
        real = stages.train

        def spy(*a, **k):
            out = real(*a, **k)
            steps.append(out.client_steps)
            return out

        stages.train = spy
        try:
            records = fed.run().records
        finally:
            stages.train = real
        if policy == "partial":
            assert steps[0] is not None and min(steps[0].values()) < 10
        return sum("straggler" in why for r in records for why in r.dropped.values())

    assert stragglers("drop") > 0
    assert stragglers("partial") < stragglers("drop")


def test_pseudo_gradients_take_topk_error_feedback_signed_chunks_and_a_hierarchy(tmp_path: Path) -> None:
    # the LM's pseudo-gradients go through the same wire as any update: top-k with error
    # feedback, signed chunks, a two-level merge; the run learns and every update is accepted
    wl = {"text_dir": str(_equal_groups(tmp_path / "c", 10, 400)), "context": 16, "width": 16, "layers": 1, "heads": 2}
    sc = parse_scenario({
        "scenario": {"name": "wire", "seed": 0}, "workload": {"name": "text", **wl},
        "federation": {"clients": 8, "rounds": 3, "partition": "by_group", "local_steps": 5, "batch_size": 4,
                       "lr": 0.003, "local_optimizer": "adamw", "server_optimizer": "nesterov"},
        "transport": {"codec": "topk", "codec_params": {"fraction": 0.2}, "error_feedback": True, "chunk_size": 2048},
        "hierarchy": {"fan_out": 2, "depth": 2},
        "defense": {"pipeline": [{"name": "signed_chunks"}, {"name": "mean"}]},
    })
    fed = Federation(sc)
    records = fed.run().records
    assert all(all(r.accepted) and not r.rejected for r in records)
    assert records[-1].loss < records[0].loss
    assert fed.states.has("residual")  # error feedback kept per client
