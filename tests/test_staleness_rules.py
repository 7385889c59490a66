"""The two staleness-aware filters (defenses/staleness.py) on examples worked by hand.

Zeno++ is Xie, Koyejo & Gupta, "Zeno++: Robust Fully Asynchronous SGD", ICML 2020; AFLGuard is
Fang, Liu, Gong & Bentley, "AFLGuard: Byzantine-robust Asynchronous Federated Learning", ACSAC 2022.
The papers write gradients g; the rows here are deltas Δ = −g (local − global), so every vector of
a worked example appears negated in the code. The papers' text could not be opened where these
tests were written, so the docstrings name each rule's test in words and by the papers' own
symbols rather than by an equation number.

Every example uses the server gradient v = (3, 4) (‖v‖ = 5), i.e. the server delta g_s = (−3, −4),
and integer-friendly candidates whose scores and distances come out exactly.
"""

from __future__ import annotations

import pytest
import torch

from defenses.staleness import AFLGuard, ZenoPlusPlus
from redteam.errors import InvalidParameter
from redteam.testing import check_defense
from redteam.types import ServerContext

V = (3.0, 4.0)  # the server's gradient on its trusted data; ‖v‖ = 5
#: candidate gradients g (rows are −g): aligned and twice v's length; flipped and doubled;
#: orthogonal to v with v's length; short, at cosine 0.8 to v; aligned and 100 times v's length
ZENO_G = [(6.0, 8.0), (-6.0, -8.0), (4.0, -3.0), (0.0, 0.5), (300.0, 400.0)]


def _rows(grads) -> torch.Tensor:
    return -torch.tensor(grads, dtype=torch.float64)


def _ctx(rows: torch.Tensor, grad=V, state=None, calls=None) -> ServerContext:
    def root():
        if calls is not None:
            calls.append(1)
        return -torch.tensor(grad, dtype=rows.dtype)

    return ServerContext.default(rows, root_update=root, state=state or {})


def test_zeno_pp_worked_example_at_the_released_settings():
    """Zeno++'s test: rescale the candidate to the validation gradient's length, g̃ = (‖v‖/‖g‖)·g,
    and accept when γ⟨v, g̃⟩ − ρ‖g̃‖² ≥ −γε. Defaults γ = 0.1, ρ = 0.001, ε = 0.

    Every g̃ has length 5, so ρ‖g̃‖² = 0.025 and γ⟨v, g̃⟩ = 0.1 · 25 · cos(g, v):
      (6, 8)     → g̃ = (3, 4),   cos  1  : 2.5 − 0.025 =  2.475  accept
      (−6, −8)   → g̃ = (−3, −4), cos −1  : −2.5 − 0.025 = −2.525 reject
      (4, −3)    → g̃ = (4, −3),  cos  0  : 0 − 0.025   = −0.025  reject
      (0, 0.5)   → g̃ = (0, 5),   cos 0.8 : 2.0 − 0.025 =  1.975  accept
      (300, 400) → g̃ = (3, 4),   cos  1  : 2.475               accept (its length does not count)
    The merged update is the mean of the accepted g̃, negated: −((3, 4) + (0, 5) + (3, 4))/3 =
    (−2, −13/3). With ε = 0.5 the bar is −γε = −0.05 and the orthogonal candidate passes too."""
    rows = _rows(ZENO_G)
    dec = ZenoPlusPlus()(rows, _ctx(rows))
    assert dec.accepted.tolist() == [True, False, False, True, True]
    assert dec.state["scores"] == pytest.approx([2.475, -2.525, -0.025, 1.975, 2.475])
    assert dec.aggregate.tolist() == pytest.approx([-2.0, -13.0 / 3.0])
    assert dec.reasons[1] == "Zeno++ score -2.525 < −γε = -0"
    slack = ZenoPlusPlus(eps=0.5)(rows, _ctx(rows))
    assert slack.accepted.tolist() == [True, False, True, True, True]
    # the defaults' bar on the cosine is ρ/γ − ε/‖v‖² = 0.01: unit candidates at cosine 0.009 and
    # 0.011 to v score 2.5·cos − 0.025 = −0.0025 (rejected) and +0.0025 (accepted)
    along, across = torch.tensor([0.6, 0.8], dtype=torch.float64), torch.tensor([0.8, -0.6], dtype=torch.float64)
    near = -torch.stack([c * along + (1 - c * c) ** 0.5 * across for c in (0.009, 0.011)])
    at_bar = ZenoPlusPlus()(near, _ctx(near))
    assert at_bar.accepted.tolist() == [False, True]
    assert at_bar.state["scores"] == pytest.approx([-0.0025, 0.0025])


def test_zeno_pp_raw_penalty_is_the_released_scripts_convention():
    """The released scripts charge ρ on the candidate's squared length *before* rescaling:
    γ⟨v, g̃⟩ − ρ‖g‖² ≥ −γε. Same candidates: ρ‖g‖² = 0.1, 0.1, 0.025, 0.00025, 250, so the scores
    are 2.4, −2.6, −0.025, 1.99975 and 2.5 − 250 = −247.5: the 100-times-longer aligned candidate,
    accepted under the paper's rescaled penalty, is now rejected. Merged: −((3, 4) + (0, 5))/2."""
    rows = _rows(ZENO_G)
    dec = ZenoPlusPlus(penalty="raw")(rows, _ctx(rows))
    assert dec.accepted.tolist() == [True, False, False, True, False]
    assert dec.state["scores"] == pytest.approx([2.4, -2.6, -0.025, 1.99975, -247.5])
    assert dec.aggregate.tolist() == pytest.approx([-1.5, -4.5])


def test_zeno_pp_shrink_only_keeps_short_candidates_short():
    """The released WikiText-2 script rescales by c = min(‖v‖/‖g‖, 1): only longer candidates are
    shortened. (0, 0.5) keeps its length: γ⟨v, g⟩ − ρ‖g‖² = 0.1 · 2 − 0.001 · 0.25 = 0.19975,
    accepted, and it enters the mean as (0, 0.5), not (0, 5): −((3, 4) + (0, 0.5) + (3, 4))/3."""
    rows = _rows(ZENO_G)
    dec = ZenoPlusPlus(shrink_only=True)(rows, _ctx(rows))
    assert dec.accepted.tolist() == [True, False, False, True, True]
    assert dec.state["scores"] == pytest.approx([2.475, -2.525, -0.025, 0.19975, 2.475])
    assert dec.aggregate.tolist() == pytest.approx([-2.0, -8.5 / 3.0])


def test_zeno_pp_lazy_refresh_judges_against_the_kept_validation_gradient():
    """Zeno++'s lazy update: v is recomputed every k steps only. With k = 2 and a server gradient
    that flips between the first and the second time it is computed, step 2 still judges against
    the first v (the aligned candidate passes) and step 3 recomputes it (the candidate, now
    against v, is rejected); the server computed v twice in three steps. With k = 1 step 2
    already sees the flipped v."""
    rows = _rows([(6.0, 8.0)])
    seq = [V, (-3.0, -4.0)]
    calls: list[int] = []

    def ctx(state):
        def root():
            calls.append(1)
            return -torch.tensor(seq[min(len(calls), 2) - 1], dtype=rows.dtype)
        return ServerContext.default(rows, root_update=root, state=state)

    rule = ZenoPlusPlus(refresh_every=2)
    d1 = rule(rows, ctx({}))
    d2 = rule(rows, ctx(d1.state))
    d3 = rule(rows, ctx(d2.state))
    assert [d.accepted.tolist() for d in (d1, d2, d3)] == [[True], [True], [False]]
    assert [d.state["server_update_age"] for d in (d1, d2, d3)] == [0, 1, 0]
    assert len(calls) == 2
    calls.clear()
    fresh = ZenoPlusPlus()
    e1 = fresh(rows, ctx({}))
    e2 = fresh(rows, ctx(e1.state))
    assert [e1.accepted.tolist(), e2.accepted.tolist()] == [[True], [False]]
    assert "server_update" not in e1.state  # k = 1 keeps no vector in the state


def test_aflguard_worked_example_at_the_default_lambda():
    """AFLGuard's test: accept a client update g when ‖g − g_s‖ ≤ λ‖g_s‖, g_s the server's update
    on its trusted data at the current model. g_s = (3, 4), λ = 1.5 (default): the bound is 7.5.
      (6, 8)     : ‖(3, 4)‖      = 5    accept
      (−6, −8)   : ‖(−9, −12)‖   = 15   reject (flipped and doubled)
      (7.5, 10)  : ‖(4.5, 6)‖    = 7.5  accept (on the bound)
      (0, 0)     : ‖(−3, −4)‖    = 5    accept (with λ ≥ 1 a zero update always passes)
      (10.5, 0)  : ‖(7.5, −4)‖   = 8.5  reject
    The merged update is the mean of the accepted, negated: −((6, 8) + (7.5, 10) + (0, 0))/3 =
    (−4.5, −6)."""
    rows = _rows([(6.0, 8.0), (-6.0, -8.0), (7.5, 10.0), (0.0, 0.0), (10.5, 0.0)])
    dec = AFLGuard()(rows, _ctx(rows))
    assert dec.accepted.tolist() == [True, False, True, True, False]
    assert dec.state["distances"] == [5.0, 15.0, 7.5, 5.0, 8.5]
    assert dec.state["bound"] == 7.5
    assert dec.aggregate.tolist() == pytest.approx([-4.5, -6.0])
    assert dec.reasons[1] == "AFLGuard: ‖Δ − g_s‖ = 15 > λ‖g_s‖ = 7.5"
    assert AFLGuard(lam=0.9)(rows, _ctx(rows)).accepted.tolist() == [False] * 5


def test_both_tests_are_the_same_on_gradients_and_on_deltas():
    """Negating every vector (the papers' gradients instead of our deltas) changes no decision,
    score or distance: both tests are built from ⟨v, g⟩, ‖g‖ and ‖g − g_s‖."""
    grads = torch.tensor(ZENO_G + [(7.5, 10.0), (10.5, 0.0)], dtype=torch.float64)
    for rule in (ZenoPlusPlus(), ZenoPlusPlus(penalty="raw"), AFLGuard()):
        on_deltas = rule(-grads, _ctx(-grads))
        on_grads = rule(grads, ServerContext.default(grads, root_update=lambda: torch.tensor(V, dtype=torch.float64)))
        assert on_deltas.accepted.tolist() == on_grads.accepted.tolist()
        key = "scores" if isinstance(rule, ZenoPlusPlus) else "distances"
        assert on_deltas.state[key] == pytest.approx(on_grads.state[key])


def test_new_options_are_checked():
    with pytest.raises(InvalidParameter, match="penalty"):
        ZenoPlusPlus(penalty="squared")
    with pytest.raises(InvalidParameter, match="refresh_every"):
        ZenoPlusPlus(refresh_every=0)
    with pytest.raises(InvalidParameter, match="refresh_every"):
        ZenoPlusPlus(refresh_every=True)


@pytest.mark.parametrize("params", [{"penalty": "raw", "shrink_only": True}, {"refresh_every": 3, "eps": 0.1},
                                    {"normalize": False, "penalty": "raw"}])
def test_zeno_pp_options_meet_the_defense_contract(params):
    assert check_defense("zeno_pp", params=params, max_examples=5).examples >= 1
