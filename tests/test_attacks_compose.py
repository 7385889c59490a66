"""compose: data + update attacks in one scenario slot (backdoor + model replacement)."""

import pytest
import torch

import redteam
from redteam.errors import InvalidParameter
from redteam.types import AttackContext, ClientData


def _ctx(own):
    own = torch.tensor(own)
    return AttackContext(round=0, n_clients=4, malicious=(3,), own_updates=own, visible_updates=own,
                         global_params=torch.zeros(2), generator=torch.Generator().manual_seed(0), server_lr=1.0)


def test_update_attacks_chain_in_order():
    # sign_flip(own): (1, 2) -> (-1, -2); model_replacement boost n/η = 4/1 -> (-4, -8)
    atk = redteam.attack("compose", attacks=[{"name": "sign_flip"}, {"name": "model_replacement"}])
    out = atk.craft_updates(_ctx([[1.0, 2.0]]))
    assert out.tolist() == [[-4.0, -8.0]]
    assert atk.surfaces == ("updates",)


def test_data_and_update_surfaces_and_targeted_test():
    atk = redteam.attack("compose", attacks=[{"name": "backdoor", "target": 3, "fraction": 1.0},
                                             {"name": "model_replacement", "boost": 2.0}])
    assert set(atk.surfaces) == {"data", "updates"}
    x = torch.zeros(5, 64)
    y = torch.tensor([0, 1, 2, 3, 4])
    poisoned = atk.poison_data(ClientData(x, y), 0, torch.Generator().manual_seed(0))
    assert (poisoned.y == 3).all()  # every non-target sample relabelled (fraction 1)
    tx, ty = atk.targeted_test(x, y)
    assert tx.shape[0] == 4 and (ty == 3).all()  # the target-class sample is excluded
    assert atk.craft_updates(_ctx([[1.0, -1.0]])).tolist() == [[2.0, -2.0]]


def test_untargeted_composition_has_no_targeted_test():
    # issue 32: every attack answers targeted_test (None: not targeted); it used to raise
    # AttributeError, which crashed the gossip regime on compose(sign_flip, ipm)
    atk = redteam.attack("compose", attacks=[{"name": "sign_flip"}, {"name": "ipm"}])
    x, y = torch.zeros(2, 64), torch.zeros(2, dtype=torch.long)
    assert atk.targeted_test(x, y) is None and atk.clean_test(x, y) is None and atk.targeted_parts(x, y) is None
    both = redteam.attack("compose", attacks=[{"name": "sign_flip"}, {"name": "backdoor", "target": 1}])
    tx, ty = both.targeted_test(torch.rand(4, 64), torch.zeros(4, dtype=torch.long))
    assert bool((ty == 1).all()) and tx.shape[1] == 64


@pytest.mark.parametrize(
    "attacks,msg",
    [([], "non-empty"), ([{"name": "bakdoor"}], "did you mean 'backdoor'"), ([{"x": 1}], "attacks[0]"),
     ([{"name": "compose", "attacks": []}], "cannot contain compose"),
     ([{"name": "gaussian", "std": -1.0}], "std")],
)
def test_bad_parts(attacks, msg):
    with pytest.raises(InvalidParameter, match=msg.replace("[", r"\[").replace("]", r"\]")):
        redteam.attack("compose", attacks=attacks)
