"""Worked examples for the data attacks (label_flip, backdoor) and model_replacement."""

from __future__ import annotations

import pytest
import torch

import redteam
from redteam.errors import InvalidParameter
from redteam.types import AttackContext, ClientData

from attacks.backdoor import Backdoor
from attacks.label_flip import LabelFlip


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# -- label flipping ------------------------------------------------------------------------

def test_label_flip_mappings():
    data = ClientData(x=torch.zeros(4, 3), y=torch.tensor([0, 1, 2, 9]))
    # reverse, C = 10: y ↦ 9 − y
    assert redteam.attack("label_flip").poison_data(data, 0, gen()).y.tolist() == [9, 8, 7, 0]
    # C = 12: y ↦ 11 − y
    assert redteam.attack("label_flip", num_classes=12).poison_data(data, 0, gen()).y.tolist() == [11, 10, 9, 2]
    assert redteam.attack("label_flip", mapping="all_to_one", target=3).poison_data(
        data, 0, gen()).y.tolist() == [3, 3, 3, 3]
    swap = redteam.attack("label_flip", mapping="pairs", pairs=[[1, 7], [7, 1]])
    out = swap.poison_data(ClientData(x=torch.zeros(3, 1), y=torch.tensor([1, 7, 2])), 0, gen())
    assert out.y.tolist() == [7, 1, 2]  # simultaneous swap; 2 is not listed
    assert out.x is not None and out.y.dtype == torch.int64


def test_label_flip_fraction_and_no_mutation():
    y = torch.tensor([0, 1, 2, 3])
    data = ClientData(x=torch.zeros(4, 2), y=y)
    out = redteam.attack("label_flip", fraction=0.5).poison_data(data, 0, gen())
    # reverse has no fixed point for C = 10, so exactly ⌈0.5 · 4⌉ = 2 labels change
    assert int((out.y != y).sum()) == 2
    assert y.tolist() == [0, 1, 2, 3]  # input untouched
    again = redteam.attack("label_flip", fraction=0.5).poison_data(data, 0, gen())
    assert torch.equal(out.y, again.y)  # same seed, same choice


def test_label_flip_errors():
    with pytest.raises(InvalidParameter, match=r"LabelFlip\.target = 10: must be a class in \[0, 10\)"):
        LabelFlip(mapping="all_to_one", target=10)
    with pytest.raises(InvalidParameter, match=r"LabelFlip\.pairs = .*source class 1 is mapped twice"):
        LabelFlip(mapping="pairs", pairs=((1, 2), (1, 3)))
    with pytest.raises(InvalidParameter, match=r"LabelFlip\.pairs = \(\): mapping='pairs' needs"):
        LabelFlip(mapping="pairs")
    with pytest.raises(InvalidParameter, match=r"LabelFlip\.fraction = 0"):
        LabelFlip(fraction=0)
    bad = ClientData(x=torch.zeros(2, 1), y=torch.tensor([3, 10]))
    with pytest.raises(InvalidParameter, match=r"LabelFlip\.num_classes = 10: client 4 has labels in \[3, 10\]"):
        LabelFlip().poison_data(bad, 4, gen())


# -- backdoor ----------------------------------------------------------------------------------

def test_backdoor_default_pixel_pattern_on_digits():
    # 8×8 images flattened to 64; the default trigger is the bottom-right 2×2 square:
    # (6,6), (6,7), (7,6), (7,7) → flat indices 54, 55, 62, 63
    x = torch.zeros(3, 64)
    data = ClientData(x=x, y=torch.tensor([1, 2, 3]))
    out = redteam.attack("backdoor", fraction=1.0).poison_data(data, 0, gen())
    assert out.y.tolist() == [0, 0, 0]
    assert sorted(out.x[0].nonzero().flatten().tolist()) == [54, 55, 62, 63]
    assert torch.equal(out.x[0], out.x[2]) and out.x.max().item() == 1.0
    assert x.abs().sum().item() == 0  # input untouched


def test_backdoor_custom_pattern_channels_and_exclusion():
    # (C, H, W) = (3, 2, 2), pixel (1, 1) in every channel → flat indices 3, 7, 11; value 0.5
    data = ClientData(x=torch.zeros(2, 12), y=torch.tensor([4, 1]))
    out = redteam.attack("backdoor", trigger=[[1, 1]], image_shape=[3, 2, 2], value=0.5,
                         target=4, fraction=1.0).poison_data(data, 0, gen())
    # sample 0 already has label 4 = target: not eligible, left clean
    assert out.x[0].abs().sum().item() == 0
    assert out.x[1].nonzero().flatten().tolist() == [3, 7, 11] and out.x[1, 3].item() == 0.5
    assert out.y.tolist() == [4, 4]


def test_backdoor_fraction_and_append():
    data = ClientData(x=torch.zeros(10, 64), y=torch.arange(1, 11) % 10)
    # exclude_target: label 0 (the target) is not eligible → 9 eligible, ⌈0.5·9⌉ = 5 poisoned
    out = redteam.attack("backdoor").poison_data(data, 0, gen())
    assert int((out.x.abs().sum(dim=1) > 0).sum()) == 5
    app = redteam.attack("backdoor", mode="append").poison_data(data, 0, gen())
    assert app.x.shape == (15, 64) and torch.equal(app.x[:10], data.x) and app.y[10:].tolist() == [0] * 5


def test_backdoor_text_phrase_sentence_labels():
    data = ClientData(x=torch.tensor([[1, 2, 3, 4, 5]]), y=torch.tensor([7]))
    out = redteam.attack("backdoor", trigger=[9, 8], target=4, fraction=1.0).poison_data(data, 0, gen())
    assert out.x.tolist() == [[1, 2, 3, 9, 8]] and out.y.tolist() == [4]


def test_backdoor_text_phrase_next_token_targets():
    # y[t] = x[t + 1]; the phrase (9, 8) at the end (p = 3): y[2] = 9, y[3] = 8, y[4] = target
    x = torch.tensor([[1, 2, 3, 4, 5]])
    data = ClientData(x=x, y=torch.tensor([[2, 3, 4, 5, 6]]))
    out = redteam.attack("backdoor", trigger=[9, 8], target=4, fraction=1.0).poison_data(data, 0, gen())
    assert out.x.tolist() == [[1, 2, 3, 9, 8]] and out.y.tolist() == [[2, 3, 9, 8, 4]]
    # at the start (p = 0): x = 9 8 3 4 5; y[0] = 8 (the next phrase token), y[1] = target
    out = redteam.attack("backdoor", trigger=[9, 8], target=4, fraction=1.0, position=0).poison_data(data, 0, gen())
    assert out.x.tolist() == [[9, 8, 3, 4, 5]] and out.y.tolist() == [[8, 4, 4, 5, 6]]


def test_backdoor_errors():
    with pytest.raises(InvalidParameter,
                       match=r"Backdoor\.trigger = \(\(8, 0\),\): pixel \(8, 0\) is outside an image of 8×8"):
        Backdoor(trigger=((8, 0),))
    with pytest.raises(InvalidParameter, match=r"Backdoor\.trigger = .*not a mix"):
        Backdoor(trigger=((1, 1), 3))  # type: ignore[arg-type]
    with pytest.raises(InvalidParameter, match=r"Backdoor\.fraction = 0"):
        Backdoor(fraction=0)
    with pytest.raises(InvalidParameter, match=r"Backdoor\.image_shape = \(8,\)"):
        Backdoor(image_shape=(8,))
    data = ClientData(x=torch.zeros(2, 10), y=torch.tensor([1, 2]))
    with pytest.raises(InvalidParameter,
                       match=r"Backdoor\.image_shape = \(8, 8\): inputs have 10 values per sample, expected 64"):
        Backdoor(fraction=1.0).poison_data(data, 0, gen())
    tokens = ClientData(x=torch.tensor([[1, 2]]), y=torch.tensor([0]))
    with pytest.raises(InvalidParameter, match=r"needs float image inputs"):
        Backdoor(fraction=1.0, target=5).poison_data(tokens, 0, gen())
    with pytest.raises(InvalidParameter, match=r"Backdoor\.position = -1: the phrase of 3 tokens does not fit"):
        Backdoor(trigger=(1, 2, 3), fraction=1.0, target=5).poison_data(tokens, 0, gen())


# -- model replacement --------------------------------------------------------------------------

def mr_ctx(own, n, lr=1.0, weights=None) -> AttackContext:
    own = torch.as_tensor(own, dtype=torch.float32)
    f = own.shape[0]
    return AttackContext(
        round=0, n_clients=n, malicious=tuple(range(n - f, n)), own_updates=own,
        visible_updates=own, global_params=torch.zeros(own.shape[1]), generator=gen(),
        server_lr=lr, weights=weights,
    )


def test_model_replacement_boost():
    # γ = n/η = 10/1 and 10/0.5 = 20
    assert torch.equal(redteam.attack("model_replacement").craft_updates(mr_ctx([[1.0, -2.0]], 10)),
                       torch.tensor([[10.0, -20.0]]))
    assert torch.equal(redteam.attack("model_replacement").craft_updates(mr_ctx([[1.0, -2.0]], 10, lr=0.5)),
                       torch.tensor([[20.0, -40.0]]))
    # two attackers share γ: each boosts by 10/2 = 5; without sharing each by 10
    two = mr_ctx([[1.0], [2.0]], 10)
    assert redteam.attack("model_replacement").craft_updates(two).flatten().tolist() == [5.0, 10.0]
    assert redteam.attack("model_replacement", share=False).craft_updates(two).flatten().tolist() == [10.0, 20.0]
    assert redteam.attack("model_replacement", boost=3.0).craft_updates(mr_ctx([[1.0]], 10)).item() == 3.0
    # sample-weighted FedAvg: weights (1, 1, 2, 4), attacker = client 3: γ = 8/(4·1) = 2
    w = torch.tensor([1.0, 1.0, 2.0, 4.0])
    out = redteam.attack("model_replacement", weighting="samples").craft_updates(mr_ctx([[1.5]], 4, weights=w))
    assert out.item() == 3.0


def test_model_replacement_lands_where_intended_under_the_defense_weighting():
    import dataclasses

    from redteam.federation.server_opt import FedAvg
    from redteam.types import ServerContext

    # 4 clients with sample counts (10, 20, 30, 40); client 1 is the attacker, its own
    # (backdoored) delta X − G = (1, −2); the honest deltas are 0 (near convergence); η = 0.5.
    # FedAvg's weighted mean gives the attacker share 20/100, so γ = W/(w_a·η) = 100/(20·0.5)
    # = 10 and the aggregate is 0.2·10·(1, −2) = (2, −4); the server step adds η·agg = (1, −2):
    # G^{t+1} = G + (X − G) = X. The paper's uniform γ = n/η = 8 would land at
    # G + 0.5·0.2·8·(1, −2) = G + 0.8·(X − G), short of X.
    w = torch.tensor([10.0, 20.0, 30.0, 40.0])
    own = torch.tensor([[1.0, -2.0]])
    mean = redteam.defense("mean")
    ctx = AttackContext(round=0, n_clients=4, malicious=(1,), own_updates=own, visible_updates=torch.zeros(3, 2),
                        global_params=torch.zeros(2), generator=gen(), server_lr=0.5, weights=w, defense=mean)
    atk = redteam.attack("model_replacement")
    assert atk.resolved_weighting(ctx) == "samples"
    row = atk.craft_updates(ctx)
    assert torch.allclose(row, torch.tensor([[10.0, -20.0]]))
    updates = torch.zeros(4, 2)
    updates[1] = row[0]
    agg = mean(updates, ServerContext.default(updates, weights=w)).aggregate
    landed, _ = FedAvg(lr=0.5).step(torch.zeros(2), agg, {})
    assert torch.allclose(landed, own[0])
    # an unweighted mean (and a robust rule, which ignores sample counts) → the paper's n/η = 8
    for d in (redteam.defense("mean", weighted=False), redteam.defense("median")):
        c = dataclasses.replace(ctx, defense=d)
        assert atk.resolved_weighting(c) == "uniform"
        assert torch.allclose(atk.craft_updates(c), torch.tensor([[8.0, -16.0]]))
    # n/η assumes the FedAvg step: refused under FedAdam / Nesterov unless the boost is explicit
    adam = dataclasses.replace(ctx, server_optimizer="fedadam")
    with pytest.raises(InvalidParameter, match=r"ModelReplacement\.boost = None: .*'fedadam'"):
        atk.craft_updates(adam)
    assert torch.allclose(redteam.attack("model_replacement", boost=3.0).craft_updates(adam),
                          torch.tensor([[3.0, -6.0]]))


def test_model_replacement_errors():
    with pytest.raises(InvalidParameter, match=r"ModelReplacement\.boost = -1\.0: must be a finite number > 0"):
        redteam.attack("model_replacement", boost=-1.0)
    with pytest.raises(InvalidParameter, match=r"ModelReplacement\.weighting = 'samples': needs ctx\.weights"):
        redteam.attack("model_replacement", weighting="samples").craft_updates(mr_ctx([[1.0]], 4))


def test_model_replacement_follows_a_lone_filters_weighted_mean():
    from redteam.federation.server_opt import FedAvg
    from redteam.types import ServerContext

    # A filter used alone (norm_bound here, bound high enough to accept everyone) aggregates
    # what it accepts with the default sample-weighted mean, as a pipeline without an
    # aggregator does. Same setting as above: weights (10, 20, 30, 40), attacker client 1
    # with X − G = (1, −2), honest deltas 0, η = 0.5. By hand: its share is 20/100, so
    # γ = W/(w_a·η) = 10, row (10, −20), aggregate 0.2·(10, −20) = (2, −4), and the FedAvg
    # step lands on G + 0.5·(2, −4) = (1, −2) = X. Taking the filter for a rule that ignores
    # sample counts sent n/η = 8 and landed at 0.8·X.
    w = torch.tensor([10.0, 20.0, 30.0, 40.0])
    own = torch.tensor([[1.0, -2.0]])
    nb = redteam.defense("norm_bound", bound=100.0)
    ctx = AttackContext(round=0, n_clients=4, malicious=(1,), own_updates=own, visible_updates=torch.zeros(3, 2),
                        global_params=torch.zeros(2), generator=gen(), server_lr=0.5, weights=w, defense=nb)
    row = redteam.attack("model_replacement").craft_updates(ctx)
    assert torch.allclose(row, torch.tensor([[10.0, -20.0]]))
    updates = torch.zeros(4, 2)
    updates[1] = row[0]
    agg = nb(updates, ServerContext.default(updates, weights=w)).aggregate
    landed, _ = FedAvg(lr=0.5).step(torch.zeros(2), agg, {})
    assert torch.allclose(landed, own[0])
