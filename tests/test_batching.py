"""``[federation] batching`` (issue 34 §6): the clients' gradients by ``vmap`` or one client at a
time. Both paths train the same parameters to float32 rounding; a spot-check replay takes the
trainer's path and reproduces it; ``"auto"`` resolves by the documented rule; a bad value is
refused at parse time."""

from __future__ import annotations

import pytest
import torch

from redteam.errors import InvalidScenario
from redteam.federation.params import ParamSpec
from redteam.federation.training import (BATCHINGS, BatchedTrainer, LocalTraining, StackedData, has_convolution,
                                         resolve_batching)
from redteam.scenario import parse_scenario
from redteam.types import ClientData, TrainingHook
from redteam.workloads.mnist import MNIST5k

# Largest |loop − vmap| over every trained parameter, measured here (torch 2.13 CPU, torch's default
# threads): 1.49e-8 for the CNN and the MLP alike, in both configurations below (one or two float32
# ulps of the parameters), against updates of 0.045–0.058; the bound leaves a margin of over a
# hundred for other BLAS builds and thread counts.
TOL = 2e-6

CNN = MNIST5k(model="cnn", channels=4, hidden=32)
MLP = MNIST5k(model="mlp", hidden=32)


def _setup(wl: MNIST5k, n: int = 5):
    model = wl.build_model(torch.Generator().manual_seed(0))
    spec = ParamSpec.of(model)
    g = torch.Generator().manual_seed(1)
    clients = [ClientData(torch.randn(24 + 5 * i, 784, generator=g), torch.randint(0, 10, (24 + 5 * i,), generator=g))
               for i in range(n)]
    return model, spec, spec.flatten(model).detach(), StackedData.stack(clients)


def _train(wl, batching: str, cfg: LocalTraining, **kw) -> torch.Tensor:
    model, spec, w, data = _setup(wl)
    trainer = BatchedTrainer(wl, model, spec, batching=batching)
    return trainer.train(w, data, torch.arange(5), cfg, torch.Generator().manual_seed(2), **kw)


@pytest.mark.parametrize("wl", [CNN, MLP], ids=["cnn", "mlp"])
@pytest.mark.parametrize("cfg", [LocalTraining(steps=3, batch_size=8, lr=0.1),
                                 LocalTraining(epochs=1.0, batch_size=16, lr=0.1, prox_mu=0.1, weight_decay=0.01)],
                         ids=["steps", "epochs-prox"])
def test_loop_and_vmap_train_the_same_parameters(wl, cfg):
    _, _, w, _ = _setup(wl)
    got = {b: _train(wl, b, cfg) for b in ("vmap", "loop")}
    moved = float((got["vmap"] - w).abs().max())
    diff = float((got["vmap"] - got["loop"]).abs().max())
    assert moved > 1e-3  # they trained
    assert diff <= TOL, f"max |loop − vmap| = {diff:.3g} (largest update {moved:.3g})"


def test_a_hooked_row_takes_the_same_path():
    """A training hook's gradient (extra loss, smaller batch) is computed on the trainer's path
    too, and agrees between the two paths."""
    def extra(flat, gp, x, y):
        return 0.5 * ((flat - gp) ** 2).sum()

    cfg = LocalTraining(steps=3, batch_size=8, lr=0.1)
    for hook in (TrainingHook(extra_loss=extra), TrainingHook(batch=3, steps=4)):
        got = {b: _train(CNN, b, cfg, hook=hook, hook_rows=[1, 3],
                         hook_generator=torch.Generator().manual_seed(5)) for b in ("vmap", "loop")}
        assert float((got["vmap"] - got["loop"]).abs().max()) <= TOL
        plain = _train(CNN, "loop", cfg)
        assert not torch.equal(got["loop"][1], plain[1])  # the hook acted


@pytest.mark.parametrize("wl", [CNN, MLP], ids=["cnn", "mlp"])
def test_replay_under_the_same_setting_is_bitwise(wl):
    """``replay`` takes the trainer's path: under ``loop`` each row's gradient is computed alone
    in both, so any subset of rows replays bit for bit; under ``vmap`` replaying every row is
    the same batched program, bit for bit."""
    cfg = LocalTraining(steps=3, batch_size=8, lr=0.1, prox_mu=0.05)
    model, spec, w, data = _setup(wl)
    clients = torch.arange(5)
    for batching, rows in (("loop", [3, 0]), ("loop", [0, 1, 2, 3, 4]), ("vmap", [0, 1, 2, 3, 4])):
        trainer = BatchedTrainer(wl, model, spec, batching=batching)
        gen = torch.Generator().manual_seed(7)
        state = gen.get_state()
        trained = trainer.train(w, data, clients, cfg, gen)
        replayed = trainer.replay(w, data, clients, cfg, state, rows, draws=cfg.steps)
        assert torch.equal(replayed, trained[rows]), (batching, rows)


def test_auto_resolves_by_the_rule():
    cnn = CNN.build_model(torch.Generator().manual_seed(0))
    mlp = MLP.build_model(torch.Generator().manual_seed(0))
    assert has_convolution(cnn) and not has_convolution(mlp)
    assert resolve_batching("auto", cnn, "cpu") == "loop"
    assert resolve_batching("auto", mlp, "cpu") == "vmap"
    assert resolve_batching("auto", cnn, torch.device("cuda")) == "vmap"
    assert resolve_batching("auto", mlp, "cuda:0") == "vmap"
    for explicit in ("vmap", "loop"):
        assert resolve_batching(explicit, cnn, "cpu") == explicit
        assert resolve_batching(explicit, mlp, "cuda") == explicit
    with pytest.raises(ValueError, match="batching"):
        resolve_batching("fast", mlp, "cpu")
    assert BatchedTrainer(CNN, cnn, ParamSpec.of(cnn)).path("cpu") == "loop"  # auto is the default
    assert BatchedTrainer(MLP, mlp, ParamSpec.of(mlp)).path("cpu") == "vmap"


def test_a_bad_value_is_refused_at_parse_time_in_one_line():
    for bad in ("fast", "VMAP", 1, True):
        with pytest.raises(InvalidScenario) as exc:
            parse_scenario({"federation": {"batching": bad}}, file="s.toml")
        msg = str(exc.value)
        assert "[federation].batching" in msg and "\n" not in msg
        assert all(f'"{b}"' in msg for b in BATCHINGS)


def test_the_setting_reaches_the_trainer_and_keeps_old_digests():
    base = {"workload": {"name": "digits"}, "federation": {"clients": 4, "rounds": 1, "local_steps": 1}}
    default = parse_scenario(base)
    assert default.federation.batching == "auto"
    explicit = parse_scenario({**base, "federation": {**base["federation"], "batching": "auto"}})
    assert explicit.digest() == default.digest()  # unset and "auto" are the same scenario, as before the key
    loop = parse_scenario({**base, "federation": {**base["federation"], "batching": "loop"}})
    assert loop.digest() != default.digest()

    from redteam.federation.loop import Federation

    fed = Federation(loop)
    assert fed.trainer.batching == "loop" and fed.trainer.path("cpu") == "loop"
    looped, batched = fed.run().records, Federation(default).run().records  # digits' MLP: auto is vmap
    assert abs(looped[-1].loss - batched[-1].loss) <= 1e-5


def test_a_spot_check_verifier_replays_a_looped_federation_exactly():
    """Honest peers trained and replayed on the loop path: every one is checked and passes."""
    from redteam.federation.loop import Federation

    doc = {"scenario": {"name": "spot", "seed": 0}, "workload": {"name": "digits", "hidden": 16},
           "federation": {"clients": 6, "rounds": 2, "local_steps": 3, "batch_size": 8, "lr": 0.1,
                          "partition": "iid", "batching": "loop"},
           "attack": {"name": "none"},
           "defense": {"pipeline": [{"name": "spot_check", "fraction": 1.0}, {"name": "mean"}]}}
    for r in Federation(parse_scenario(doc)).run().records:
        assert r.rejected == {}
        assert r.extra["spot_check"]["checked"] == list(range(6))


def test_the_pipeline_regime_refuses_it():
    with pytest.raises(InvalidScenario, match=r"\[federation\]\.batching = 'vmap' does not apply to \[pipeline\]"):
        parse_scenario({"workload": {"name": "text"}, "pipeline": {}, "federation": {"batching": "vmap"}})
