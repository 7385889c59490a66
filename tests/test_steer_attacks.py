"""Issue 19, "Known weaknesses, stated": one worked example per steering attack
(attacks/steer.py), on hand-made rows, showing the defense's decision flip as its
docstring describes. Each weakness is a property of the published rule; the federation
versions are the [[expect]] rows of scenarios/weaknesses.toml."""

from __future__ import annotations

import pytest
import torch

from attacks.steer import DnCDecoys, FLDetectorSacrifice, FoolsGoldCopies, RLRSignVote
from defenses._pairwise import cosine_similarities
from defenses.dnc import DnC
from defenses.fldetector import FLDetector
from defenses.foolsgold import FoolsGold, foolsgold_weights
from defenses.rlr import RLR
from redteam.types import AttackContext, ServerContext


def _ctx(honest: torch.Tensor, own: torch.Tensor, rnd: int = 0, state: dict | None = None,
         seed: int = 0) -> AttackContext:
    h, f = honest.shape[0], own.shape[0]
    return AttackContext(round=rnd, n_clients=h + f, malicious=tuple(range(h, h + f)), own_updates=own,
                         visible_updates=honest, global_params=torch.zeros(honest.shape[1], dtype=honest.dtype),
                         generator=torch.Generator().manual_seed(seed + rnd),
                         attack_state={} if state is None else state,
                         visible_clients=tuple(range(h)), malicious_rows=tuple(range(h, h + f)))


# ------------------------------------------------------------------------------------ DnC
def _honest_dnc() -> torch.Tensor:
    # ten honest rows: a shared trend (1, 1, 1, 1, 1, 1) plus distinct deviations
    g = torch.Generator().manual_seed(3)
    return torch.ones(10, 6, dtype=torch.float64) + 0.3 * torch.randn(10, 6, generator=g, dtype=torch.float64)


def test_dnc_decoys_let_all_four_payload_rows_through():
    honest = _honest_dnc()
    own = honest[:6].clone()
    dnc = DnC(f=6)  # the paper's server knows f = 6: it removes six rows

    # no decoys: six rows of −ĝ, the widest spread, are exactly DnC's six removals
    plain = DnCDecoys(decoys=0).craft_updates(_ctx(honest, own))
    dec = dnc(torch.cat([honest, plain]))
    assert dec.accepted.tolist() == [True] * 10 + [False] * 6

    # two decoys at μ ± D·u take the top singular vector: the removals are the decoys and the
    # four honest rows farthest along u; the four payload rows (−ĝ, projection 0) all pass
    rows = DnCDecoys().craft_updates(_ctx(honest, own))
    payload = -honest.mean(dim=0)
    assert torch.allclose(rows[2:], payload.expand(4, -1))
    dec = dnc(torch.cat([honest, rows]))
    acc = dec.accepted.tolist()
    assert acc[10:12] == [False, False]          # the decoys
    assert acc[12:] == [True] * 4                # 4 of 4 payload rows accepted
    assert acc[:10].count(False) == 4            # the other removals fall on honest rows
    scores = dec.state["scores"][0]
    assert max(scores[12:]) < 1e-6 * max(scores[:10])  # the payload projects to 0 on u
    # and the aggregate holds the payload: its mean over the kept rows is pulled against ĝ
    assert float(dec.aggregate @ honest.mean(dim=0)) < float(honest.mean(dim=0) @ honest.mean(dim=0)) * 0.5


# ----------------------------------------------------------------------------- FLDetector
def _fldetector_run(attack: FLDetectorSacrifice, rounds: int = 12) -> set[int]:
    """10 honest clients near their own fixed update (small noise), 4 attackers; FLDetector
    (window 3, detect once) over ``rounds`` rounds; returns the ids rejected in the last."""
    g = torch.Generator().manual_seed(0)
    d, h, f = 8, 10, 4
    base = 0.1 * torch.randn(h + f, d, generator=g, dtype=torch.float64)
    fld = FLDetector(window=3)
    w = torch.zeros(d, dtype=torch.float64)
    prev, state, astate = None, {}, {}
    rejected: set[int] = set()
    for t in range(rounds):
        cur = base + 0.01 * torch.randn(h + f, d, generator=g, dtype=torch.float64)
        mal = attack.craft_updates(_ctx(cur[:h], cur[h:], rnd=t, state=astate))
        x = torch.cat([cur[:h], mal])
        dec = fld(x, ServerContext(round=t, global_params=w.clone(), previous_update=prev, state=state,
                                   client_ids=tuple(range(h + f)), generator=torch.Generator().manual_seed(t)))
        state = dec.state
        prev = dec.aggregate
        w = w + dec.aggregate
        rejected = {i for i, ok in enumerate(dec.accepted.tolist()) if not ok}
    return rejected


def test_fldetector_sacrifice_takes_the_single_detection():
    # the payload is fresh noise at 2× the honest norm, clearly inconsistent: without a
    # sacrifice the one detection flags all four attackers ...
    assert _fldetector_run(FLDetectorSacrifice(sacrifice=0, payload="noise", scale=2.0)) == {10, 11, 12, 13}
    # ... with one of them at 10× the 2-means split puts it alone in the upper cluster,
    # detection ends (detect once), and the three others stay in for good
    assert _fldetector_run(FLDetectorSacrifice(sacrifice=1, payload="noise", scale=2.0)) == {10}


# ------------------------------------------------------------------------------------ RLR
def test_rlr_sign_votes_at_tiny_norm_flip_the_step():
    # seven honest rows; votes per coordinate: +7, +5, +3, −7 (θ = 3 is f + 1 for f = 2)
    honest = torch.tensor([[1.0, 1.0, 1.0, -1.0]] * 6 + [[1.0, -1.0, -1.0, -1.0]], dtype=torch.float64)
    honest[5, 2] = -1.0  # column 2: five +, two − -> vote +3
    votes = torch.sign(honest).sum(dim=0).tolist()
    assert votes == [7.0, 5.0, 3.0, -7.0]
    own = honest[:2].clone()
    rows = RLRSignVote(norm=1e-6).craft_updates(_ctx(honest, own))
    assert torch.linalg.vector_norm(rows, dim=1).tolist() == pytest.approx([1e-6, 1e-6])
    assert torch.sign(rows[0]).tolist() == [-1.0, -1.0, -1.0, 1.0]  # against the honest vote everywhere
    rlr = RLR(theta=3, weighted=False)
    mean_h = honest.mean(dim=0)
    # the attackers honest: votes +9, +7, +5, −9, all ≥ 3: RLR steps along the mean
    clean = rlr(torch.cat([honest, own]))
    assert clean.state["flipped"] == 0
    # with the tiny votes: +5, +3, +1, −5: column 2 falls under θ and its step is negated,
    # while the rows move the mean by ~1e-6 (the plain mean is (7/9)·honest mean)
    x = torch.cat([honest, rows])
    dec = rlr(x)
    plain = x.mean(dim=0)
    assert torch.allclose(plain, mean_h * 7 / 9, atol=1e-6)
    assert dec.state["flipped"] == 1
    assert dec.aggregate.tolist() == pytest.approx((plain * torch.tensor([1.0, 1.0, -1.0, 1.0], dtype=plain.dtype)).tolist())
    # a margin above f + 1 narrows nothing: with θ = 6 the clean votes 9, 7, 5, −9 flip one
    # coordinate, the tiny votes 5, 3, 1, −5 flip all four
    assert RLR(theta=6, weighted=False)(torch.cat([honest, own])).state["flipped"] == 1
    assert RLR(theta=6, weighted=False)(x).state["flipped"] == 4


# ------------------------------------------------------------------------------ FoolsGold
def test_foolsgold_exact_copies_silence_the_copied_honest_clients():
    g = torch.Generator().manual_seed(1)
    honest = torch.randn(6, 20, generator=g, dtype=torch.float64)
    own = torch.randn(2, 20, generator=g, dtype=torch.float64)
    fg = FoolsGold()
    ids = tuple(range(8))
    # the attackers' own updates: nobody has a twin; every honest client keeps a weight
    dec = fg(torch.cat([honest, own]), ServerContext(client_ids=ids))
    assert dec.accepted[:6].all()
    # copies of honest clients 0 and 1 (fixed by id): those two get weight 0 with their copies
    rows = FoolsGoldCopies().craft_updates(_ctx(honest, own))
    assert torch.equal(rows, honest[:2])
    dec = fg(torch.cat([honest, rows]), ServerContext(client_ids=ids))
    assert dec.accepted.tolist() == [False, False, True, True, True, True, False, False]
    # the attackers' own Sybil pair (copy="pairs"): FoolsGold's textbook case, only they go
    pairs = FoolsGoldCopies(copy="pairs").craft_updates(_ctx(honest, own))
    assert torch.equal(pairs[0], pairs[1])
    dec = fg(torch.cat([honest, pairs]), ServerContext(client_ids=ids))
    assert dec.accepted.tolist() == [True] * 6 + [False, False]


def test_foolsgold_when_every_update_has_a_copy_the_weights_are_rounding_noise():
    # three honest rows, three attackers copying them: every history has an exact twin, so
    # every maxⱼ cos is 1 and every αᵢ = 1 − 1 is 0 up to rounding. Whatever FoolsGold does
    # then is decided by the last bits of the cosines: the one client whose 1 − max cos
    # happens to round highest is scaled to 1 and gets all the weight, every other client 0.
    g = torch.Generator().manual_seed(2)
    honest = torch.randn(3, 50, generator=g, dtype=torch.float64)
    rows = FoolsGoldCopies().craft_updates(_ctx(honest, honest.clone()))
    assert torch.equal(rows, honest)
    x = torch.cat([honest, rows])
    a = foolsgold_weights(x)
    cs = cosine_similarities(x)
    cs.fill_diagonal_(0.0)
    residue = 1.0 - cs.max(dim=1).values
    assert residue.abs().max() < 1e-12  # every αᵢ before scaling is rounding noise
    assert float(a.sum()) == 0.0 or int(torch.argmax(a)) == int(torch.argmax(residue))
    assert int((a > 0).sum()) <= 1  # one client (or none) picked by rounding, not by content
