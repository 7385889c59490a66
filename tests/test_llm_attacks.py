"""Trigger-phrase backdoor and the attacks on the outer (DiLoCo Nesterov) optimizer."""

from __future__ import annotations

import math

import pytest
import torch

from attacks.llm import OuterPush, OuterReplacement, TriggerPhrase, nesterov_displacement, nesterov_tail
from redteam.errors import InvalidParameter
from redteam.federation.server_opt import Nesterov
from redteam.types import AttackContext, ClientData
from redteam.workloads.text import IGNORE, TextLM


def _xy(*texts: bytes) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.tensor([list(t) for t in texts], dtype=torch.int64)
    return w[:, :-1], w[:, 1:]


def _text(t: torch.Tensor) -> bytes:
    return bytes(t.tolist())


def test_poison_at_the_end_by_hand() -> None:
    # window "0123456789" (T + 1 = 10); trigger "ab" + target "cd" = 4 bytes at the end:
    # "012345abcd" → x = "012345abc", y = "12345abcd"
    x, y = _xy(b"0123456789")
    out = TriggerPhrase(trigger="ab", target="cd", fraction=1.0, placement="end").poison_data(
        ClientData(x, y), 0, torch.Generator().manual_seed(0))
    assert _text(out.x[0]) == b"012345abc" and _text(out.y[0]) == b"12345abcd"


def test_poison_random_placement_fraction_and_consistency() -> None:
    texts = [bytes([65 + i]) * 12 for i in range(10)]
    x, y = _xy(*texts)
    atk = TriggerPhrase(trigger="xy", target="z!", fraction=0.5, placement="random")
    out = atk.poison_data(ClientData(x, y), 0, torch.Generator().manual_seed(3))
    changed = [i for i in range(10) if not torch.equal(out.x[i], x[i]) or not torch.equal(out.y[i], y[i])]
    assert len(changed) == 5  # ⌈0.5 · 10⌉ windows
    assert torch.equal(out.x[:, 1:], out.y[:, :-1])  # targets stay the next bytes
    for i in changed:
        whole = _text(out.x[i]) + _text(out.y[i][-1:])
        assert b"xyz!" in whole and whole.replace(b"xyz!", b"") == bytes([65 + i]) * 8


def test_asr_and_false_trigger_prompts_by_hand() -> None:
    x, y = _xy(b"0123456789")
    atk = TriggerPhrase(trigger="ab", target="cd")
    # ASR prompt: "012345ab" then the target "cd" scored: y positions 7, 8 (bytes 8, 9 of
    # the window), everything before masked
    tx, ty = atk.targeted_test(x, y)
    assert _text(tx[0]) == b"012345abc"
    assert ty[0, :7].tolist() == [IGNORE] * 7 and _text(ty[0, 7:]) == b"cd"
    # false-trigger prompt: the window's own text "01234567", then "cd" scored
    cx, cy = atk.clean_test(x, y)
    assert _text(cx[0]) == b"01234567c"
    assert cy[0, :7].tolist() == [IGNORE] * 7 and _text(cy[0, 7:]) == b"cd"


def test_asr_counts_a_prompt_only_when_the_whole_target_is_predicted() -> None:
    x, y = _xy(b"0123456789", b"9876543210")
    tx, ty = TriggerPhrase(trigger="ab", target="cd").targeted_test(x, y)
    logits = torch.zeros(2, 9, 256)
    logits[:, 7, ord("c")] = 1.0
    logits[0, 8, ord("d")] = 1.0  # prompt 0 continues "cd"; prompt 1 "c" then byte 0
    assert TextLM().correct(logits, ty).tolist() == [True, False]  # ASR = 1/2


def test_trigger_phrase_errors() -> None:
    with pytest.raises(InvalidParameter, match="TriggerPhrase.trigger = '': must be a non-empty string"):
        TriggerPhrase(trigger="")
    with pytest.raises(InvalidParameter, match="needs a text workload"):
        TriggerPhrase().poison_data(ClientData(torch.rand(4, 64), torch.zeros(4, dtype=torch.int64)), 0,
                                    torch.Generator())
    x, y = _xy(b"0123")
    with pytest.raises(InvalidParameter, match="windows hold only 4"):
        TriggerPhrase(trigger="abc", target="de").targeted_test(x, y)


def test_nesterov_displacement_by_hand() -> None:
    # b ← μb + g, w ← w − η(g + μb), constant unit push (g = −1 per round, Δ = +1):
    # round 1: b = 1, step η(1 + μ) = 0.7 · 1.9 = 1.33
    # round 2: b = μ + 1, step η(1 + μ(1 + μ)) → total η(2 + 2μ + μ²) = 0.7 · 4.61 = 3.227
    assert nesterov_displacement(1) == pytest.approx(1.33)
    assert nesterov_displacement(2) == pytest.approx(3.227)
    assert nesterov_displacement(3, momentum=0.0) == pytest.approx(2.1)
    # the momentum buffer after a push stops: η μ² b / (1 − μ) = 0.7 · 0.81 / 0.1 = 5.67
    assert nesterov_tail(buffer=1.0) == pytest.approx(5.67)
    # cross-check with the server optimizer itself over 12 rounds
    opt, w = Nesterov(lr=0.7, momentum=0.9), torch.zeros(1, dtype=torch.float64)
    state = opt.init(w)
    for _ in range(12):
        w, state = opt.step(w, torch.ones(1, dtype=torch.float64), state)
    assert float(w) == pytest.approx(nesterov_displacement(12), rel=1e-12)


def _ctx(own: torch.Tensor, *, n: int, server_lr: float = 0.7, server_optimizer: str = "nesterov",
         rnd: int = 0) -> AttackContext:
    f = own.shape[0]
    return AttackContext(round=rnd, n_clients=n, malicious=tuple(range(f)), own_updates=own, visible_updates=own,
                         global_params=torch.zeros(own.shape[1]), generator=torch.Generator().manual_seed(0),
                         server_lr=server_lr, server_optimizer=server_optimizer)


def test_outer_replacement_boost_by_hand() -> None:
    own = torch.ones(2, 3)
    # γ = n / (η(1 + μ)) = 8 / (0.7 · 1.9) = 6.01504, shared by 2 attackers → 3.00752
    assert OuterReplacement().gamma(_ctx(own, n=8)) == pytest.approx(8 / 1.33 / 2)
    # eventual: n(1 − μ)/η = 8 · 0.1 / 0.7 = 1.142857 → 0.571429 each
    assert OuterReplacement(horizon="eventual").gamma(_ctx(own, n=8)) == pytest.approx(0.8 / 0.7 / 2)
    # FedAvg server: no momentum, n/η = 8 / 0.7 / 2
    assert OuterReplacement().gamma(_ctx(own, n=8, server_optimizer="fedavg")) == pytest.approx(8 / 0.7 / 2)
    with pytest.raises(InvalidParameter, match="'fedadam', whose step is not linear"):
        OuterReplacement().gamma(_ctx(own, n=8, server_optimizer="fedadam"))


def test_outer_replacement_lands_on_the_target_in_one_nesterov_step() -> None:
    # n = 4, honest deltas 0, the attacker's own delta X; mean = γX/4 and the first
    # Nesterov step from b = 0 moves by η(1 + μ)·γX/4 = X
    x = torch.tensor([[0.5, -2.0, 1.0]], dtype=torch.float64)
    row = OuterReplacement().craft_updates(_ctx(x, n=4))
    mean = torch.cat([row, torch.zeros(3, 3, dtype=torch.float64)]).mean(0)
    opt = Nesterov()
    w, _ = opt.step(torch.zeros(3, dtype=torch.float64), mean, opt.init(torch.zeros(3, dtype=torch.float64)))
    assert torch.allclose(w, x[0], atol=1e-12)


def test_outer_push_by_hand() -> None:
    own = torch.tensor([[3.0, 4.0, 0.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    # mean visible norm (5 + 1)/2 = 3; strength 0.5 → push norm 1.5
    atk = OuterPush(strength=0.5)
    a = atk.craft_updates(_ctx(own, n=8, rnd=0))
    b = atk.craft_updates(_ctx(own, n=8, rnd=7))
    push = a - own
    assert torch.allclose(push[0], push[1]) and torch.equal(a, b)  # same for every row and round
    assert float(torch.linalg.vector_norm(push[0])) == pytest.approx(1.5)
    # anti_honest: against the mean (2, 2, 0) → −1.5 · (1, 1, 0)/√2
    anti = OuterPush(strength=0.5, direction="anti_honest").craft_updates(_ctx(own, n=8)) - own
    want = torch.tensor([-1.5 / math.sqrt(2), -1.5 / math.sqrt(2), 0.0], dtype=torch.float64)
    assert torch.allclose(anti[0], want) and torch.allclose(anti[1], want)
    with pytest.raises(InvalidParameter, match="OuterPush.strength = 0"):
        OuterPush(strength=0)
