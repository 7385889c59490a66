"""Sign flipping (Karimireddy, He & Jaggi, ICML 2021; IPM with ε = 1): both variants by hand."""

from __future__ import annotations

import math

import pytest
import torch

import redteam
from attacks.basic import NoAttack, SignFlip
from redteam.errors import InvalidParameter
from redteam.types import AttackContext


def _ctx(own, visible):
    own = torch.tensor(own, dtype=torch.float32)
    visible = torch.tensor(visible, dtype=torch.float32)
    return AttackContext(round=0, n_clients=own.shape[0] + visible.shape[0],
                         malicious=tuple(range(own.shape[0])), own_updates=own,
                         visible_updates=visible, global_params=torch.zeros(own.shape[1]),
                         generator=torch.Generator().manual_seed(0))


OWN = [[1.0, -2.0], [0.0, 3.0]]
HONEST = [[1.0, 2.0], [3.0, 4.0], [5.0, -6.0]]  # mean [3, 0]


def test_own_variant_negates_each_own_row():
    # −[1, −2] = [−1, 2]; −[0, 3] = [0, −3]
    out = SignFlip(variant="own").craft_updates(_ctx(OWN, HONEST))
    torch.testing.assert_close(out, torch.tensor([[-1.0, 2.0], [0.0, -3.0]]))


def test_own_variant_with_scale():
    # −2.5·[1, −2] = [−2.5, 5]; −2.5·[0, 3] = [0, −7.5]
    out = SignFlip(variant="own", scale=2.5).craft_updates(_ctx(OWN, HONEST))
    torch.testing.assert_close(out, torch.tensor([[-2.5, 5.0], [0.0, -7.5]]))


def test_mean_variant_sends_the_negated_visible_mean_from_every_malicious_client():
    # mean of the visible rows: ([1,2] + [3,4] + [5,−6]) / 3 = [3, 0] → every row [−3, 0]
    # (the own rows play no part)
    out = SignFlip(variant="mean").craft_updates(_ctx(OWN, HONEST))
    torch.testing.assert_close(out, torch.tensor([[-3.0, 0.0], [-3.0, 0.0]]))


def test_mean_variant_with_scale_and_independent_rows():
    # −2·[3, 0] = [−6, 0] for both rows; the rows are separate storage (a later in-place
    # change of one malicious row must not change the other)
    out = SignFlip(variant="mean", scale=2.0).craft_updates(_ctx(OWN, HONEST))
    torch.testing.assert_close(out, torch.tensor([[-6.0, 0.0], [-6.0, 0.0]]))
    out[0, 0] = 99.0
    assert float(out[1, 0]) == -6.0


def test_mean_variant_non_omniscient_sees_only_its_colluders():
    # under the default threat model the trainer passes visible = own; the mean of
    # [1, −2] and [0, 3] is [0.5, 0.5] → both rows [−0.5, −0.5]
    assert SignFlip.omniscient is False
    out = SignFlip(variant="mean").craft_updates(_ctx(OWN, OWN))
    torch.testing.assert_close(out, torch.tensor([[-0.5, -0.5], [-0.5, -0.5]]))


def test_default_is_the_own_variant_plain_flip():
    sf = SignFlip()
    assert (sf.variant, sf.scale) == ("own", 1.0)
    assert redteam.attack("sign_flip") == sf


def test_no_attack_changes_nothing():
    ctx = _ctx(OWN, HONEST)
    assert torch.equal(NoAttack().craft_updates(ctx), ctx.own_updates)


@pytest.mark.parametrize("kw, name", [
    ({"variant": "median"}, "variant"), ({"scale": 0}, "scale"), ({"scale": -1.0}, "scale"),
    ({"scale": math.nan}, "scale"), ({"scale": math.inf}, "scale"), ({"scale": "2"}, "scale"),
    ({"scale": True}, "scale"),
])
def test_bad_parameters_are_one_line_errors(kw, name):
    with pytest.raises(InvalidParameter) as ei:
        redteam.attack("sign_flip", **kw)
    assert name in str(ei.value) and "\n" not in str(ei.value)


@pytest.mark.parametrize("kw, msg", [
    ({"variant": "x"}, "SignFlip.variant = 'x': must be 'own' or 'mean'"),
    ({"scale": 0}, "SignFlip.scale = 0: must be a finite number > 0"),
])
def test_direct_construction_messages(kw, msg):
    with pytest.raises(InvalidParameter) as ei:
        SignFlip(**kw)
    assert str(ei.value) == msg
