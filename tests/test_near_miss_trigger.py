"""Near-miss trigger rate of the trigger-phrase backdoor (issue 18 §3): held-out prompts
ending in a partial trigger (proper prefix, proper suffix, last character), scored like the
false-trigger rate; the prompt builder by hand, the metric on a hand-made bigram model, and
one short federation on the ``text`` workload."""

from __future__ import annotations

import dataclasses

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attacks.llm import TriggerPhrase
from redteam.errors import InvalidParameter
from redteam.federation.loop import Federation
from redteam.federation.params import ParamSpec
from redteam.federation.setup import Probes
from redteam.federation.stages import evaluate
from redteam.federation.training import BatchedTrainer
from redteam.runner.single import run_scenario
from redteam.scenario import parse_scenario
from redteam.scoring import LANGUAGE_MODEL_METRICS, METRICS, language_model, summarize
from redteam.types import RoundRecord
from redteam.workloads.text import IGNORE, TextLM


def _xy(*texts: bytes) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.tensor([list(t) for t in texts], dtype=torch.int64)
    return w[:, :-1], w[:, 1:]


def _whole(x: torch.Tensor, y: torch.Tensor) -> list[bytes]:
    """Each prompt window as bytes: x plus the last next-byte target."""
    return [bytes(x[i].tolist() + [int(y[i, -1])]) for i in range(x.shape[0])]


# ------------------------------------------------------------------ the partial forms
def test_near_miss_forms_by_hand() -> None:
    assert TriggerPhrase().near_miss_forms() == {
        "prefix": ("verify", "verif", "veri", "ver", "ve", "v"),
        "suffix": ("erify=", "rify=", "ify=", "fy=", "y="),
        "last": ("=",),
    }
    assert TriggerPhrase(trigger="a=").near_miss_forms() == {"prefix": ("a",), "suffix": (), "last": ("=",)}
    assert TriggerPhrase(trigger="=").near_miss_forms() == {"prefix": (), "suffix": (), "last": ()}
    # characters, not bytes: a two-byte "é" is never split
    assert TriggerPhrase(trigger="né=").near_miss_forms() == {"prefix": ("né", "n"), "suffix": ("é=",),
                                                              "last": ("=",)}


def test_near_miss_prompts_parameter() -> None:
    for bad in (-1, 1.5, True, "8"):
        with pytest.raises(InvalidParameter, match="near_miss_prompts"):
            TriggerPhrase(near_miss_prompts=bad)  # type: ignore[arg-type]
    x, y = _xy(b"0123456789kl")
    assert TriggerPhrase(trigger="abc=", target="XY", near_miss_prompts=0).near_miss_test(x, y) == {}
    assert TriggerPhrase(trigger="=", target="XY").near_miss_test(x, y) == {}  # no partial form


# ------------------------------------------------------------------ the prompts, by hand
W = (b"0123456789kl", b"mnopqrstuvwx", b"012345ab9999", b"ABCDEFGHIJKL", b"abc=56789012")


def test_near_miss_prompts_by_hand() -> None:
    # trigger "abc=", target "XY", windows of T + 1 = 12 bytes; 5 prompts per kind, 5
    # windows: every window, window i ending in form i mod (number of forms) + "XY"
    x, y = _xy(*W)
    got = TriggerPhrase(trigger="abc=", target="XY", near_miss_prompts=5).near_miss_test(x, y)
    assert list(got) == ["prefix", "suffix", "last"]
    texts = {k: _whole(*xy) for k, xy in got.items()}
    assert texts["prefix"] == [b"0123456abcXY", b"mnopqrstabXY", b"012345ab9aXY", b"ABCDEFGabcXY"]
    # window 2 + "bc=" reads "012345abc=": its own "ab" completes the trigger, left out
    assert texts["suffix"] == [b"0123456bc=XY", b"mnopqrstc=XY", b"ABCDEFGHc=XY"]
    assert texts["last"] == [b"012345678=XY", b"mnopqrstu=XY", b"012345ab9=XY", b"ABCDEFGHI=XY"]
    # window 4 holds the trigger in its own text: in no kind
    for kind, (px, py) in got.items():
        scored = py[:, :-1] != IGNORE  # scored targets stay the next bytes (teacher forcing)
        assert torch.equal(px[:, 1:][scored], py[:, :-1][scored]), kind
        # only the target is scored, exactly like clean_test: y positions 9, 10
        assert (py[:, :9] == IGNORE).all() and all(bytes(r) == b"XY" for r in py[:, 9:].tolist()), kind


def test_near_miss_windows_are_evenly_spaced_and_deterministic() -> None:
    # 9 windows, 3 per kind: windows 0, 4, 8 (linspace(0, 8, 3)), the same for every kind
    texts = [bytes([65 + i]) * 12 for i in range(9)]
    x, y = _xy(*texts)
    atk = TriggerPhrase(trigger="abc=", target="XY", near_miss_prompts=3)
    got = atk.near_miss_test(x, y)
    for kind, (px, py) in got.items():
        assert [bytes(r)[:1] for r in px.tolist()] == [b"A", b"E", b"I"], kind
    again = atk.near_miss_test(x.clone(), y.clone())
    assert all(torch.equal(got[k][0], again[k][0]) and torch.equal(got[k][1], again[k][1]) for k in got)
    # more prompts asked than windows: every window once
    many = TriggerPhrase(trigger="abc=", target="XY", near_miss_prompts=100).near_miss_test(x, y)
    assert all(v[0].shape[0] == 9 for v in many.values())
    # the builder reads only the windows it is given (the held-out split): other text, other prompts
    other = TriggerPhrase(trigger="abc=", target="XY", near_miss_prompts=3).near_miss_test(*_xy(*W[:3]))
    assert _whole(*other["last"]) == [b"012345678=XY", b"mnopqrstu=XY", b"012345ab9=XY"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet="abc=xX", min_size=12, max_size=12), min_size=1, max_size=12),
       st.integers(1, 15))
def test_near_miss_prompts_end_in_a_partial_form_and_never_hold_the_trigger(rows: list[str], k: int) -> None:
    # text drawn from the trigger's own letters: completions of the trigger are common
    x, y = _xy(*(r.encode() for r in rows))
    atk = TriggerPhrase(trigger="abc=", target="XY", near_miss_prompts=k)
    forms = atk.near_miss_forms()
    for kind, (px, py) in atk.near_miss_test(x, y).items():
        assert px.shape[0] <= min(k, len(rows))
        for whole in _whole(px, py):
            assert b"abc=" not in whole
            assert whole.endswith(b"XY") and any(whole[:-2].endswith(f.encode()) for f in forms[kind])


# ------------------------------------------------------------------ the metric, hand-made model
class Bigram(torch.nn.Module):
    """Logits of the next byte from the current byte alone: a (256, 256) table."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(table)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.table[x]


def _eq_model() -> Bigram:
    """Predicts "F" after "=", then "alse": continues every prompt ending in "=" with "False";
    after any other byte it predicts byte 0 (never "F")."""
    t = torch.zeros(256, 256)
    for a, b in zip("=Fals", "False"):
        t[ord(a), ord(b)] = 1.0
    return Bigram(t)


def test_near_miss_rate_of_a_model_that_fires_on_every_equals_sign() -> None:
    # 8 held-out windows of digits (no letter of the trigger); windows 1 and 5 have "=" just
    # before the last 5 bytes (where clean_test writes "False"); window 0 has "v" where the
    # first suffix form "erify=" lands after it (completing "verify=": left out).
    t1 = 32
    rows = [bytearray(str(i % 10).encode() * t1) for i in range(8)]
    rows[1][t1 - 6] = rows[5][t1 - 6] = ord("=")
    rows[0][t1 - 12] = ord("v")
    x, y = _xy(*(bytes(r) for r in rows))
    atk = TriggerPhrase(near_miss_prompts=8)  # "verify=" → "False"
    near = atk.near_miss_test(x, y)
    assert {k: v[0].shape[0] for k, v in near.items()} == {"prefix": 8, "suffix": 7, "last": 8}
    model = _eq_model()
    spec = ParamSpec.of(model)
    dev = torch.device("cpu")
    probes = Probes.of((atk,), x, y, dev)
    assert set(probes.near_miss) == set(near)
    fed = SimpleNamespace(trainer=BatchedTrainer(TextLM(), model, spec), test_x=x, test_y=y, probes=probes, attack=atk)
    _, _, extra = evaluate(fed, spec.flatten(model))
    assert extra["asr"] == 1.0  # every prompt ending in the trigger ends in "="
    assert extra["false_trigger"] == 2 / 8  # the clean prompts of windows 1 and 5 end in "="
    # prefixes end in v, e, r, i, f, y: never; suffixes and "=" end in "=": always
    assert extra["near_miss_trigger_by_kind"] == {"prefix": 0.0, "suffix": 1.0, "last": 1.0}
    assert extra["near_miss_trigger"] == pytest.approx((0 + 7 + 8) / (8 + 7 + 8))
    rec = RoundRecord(round=0, accuracy=0.0, loss=1.0, accepted=[True], malicious=[False], participating=[True],
                      extra=extra)
    assert language_model([rec])["near_miss_trigger_rate"] == extra["near_miss_trigger"]
    assert summarize([rec])["near_miss_trigger_rate"] == extra["near_miss_trigger"]
    assert "near_miss_trigger_rate" not in summarize([rec], is_language_model=False)
    # a model that never says "F" has near-miss rate 0; no near-miss prompts: no metric
    silent = Bigram(torch.zeros(256, 256))
    _, _, e0 = evaluate(SimpleNamespace(**{**vars(fed), "trainer": BatchedTrainer(TextLM(), silent, spec)}),
                        spec.flatten(silent))
    assert e0["near_miss_trigger"] == 0.0
    no_near = dataclasses.replace(probes, near_miss={})
    _, _, e1 = evaluate(SimpleNamespace(**{**vars(fed), "probes": no_near}), spec.flatten(model))
    assert "near_miss_trigger" not in e1 and "near_miss_trigger_by_kind" not in e1
    assert language_model([RoundRecord(round=0, accuracy=0.0, loss=1.0, accepted=[True], malicious=[False],
                                       participating=[True], extra=e1)])["near_miss_trigger_rate"] is None


def test_registered_for_language_models_only() -> None:
    assert "near_miss_trigger_rate" in METRICS and "near_miss_trigger_rate" in LANGUAGE_MODEL_METRICS


# ------------------------------------------------------------------ a short federation
def _groups(root: Path, groups: int, length: int) -> Path:
    for g in range(groups):
        d = root / f"pkg{g}"
        d.mkdir(parents=True)
        (d / "mod.py").write_text((f"def f{g}(x):\n    return x * {g} + {g * g}\n" * 10)[:length])
    return root


def _scenario(text_dir: Path, attack: dict[str, Any]) -> Any:
    return parse_scenario({
        "scenario": {"name": "near-miss-test", "seed": 0},
        "workload": {"name": "text", "text_dir": str(text_dir), "context": 24, "width": 16, "layers": 1,
                     "heads": 2, "heldout_fraction": 0.2},
        "federation": {"clients": 4, "rounds": 2, "partition": "by_group", "local_steps": 2, "batch_size": 4,
                       "lr": 0.003, "local_optimizer": "adamw", "server_optimizer": "nesterov",
                       "malicious_fraction": 0.25},
        "transport": {"codec": "none"},
        "attack": attack,
        "defense": {"name": "mean"},
    })


def test_federation_reports_the_near_miss_rate(tmp_path: Path) -> None:
    text_dir = _groups(tmp_path / "c", 8, 200)
    sc = _scenario(text_dir, {"name": "trigger_phrase", "trigger": "verify=", "target": "False",
                              "near_miss_prompts": 16})
    fed = Federation(sc)
    # the prompts are the attack's, built from the held-out windows
    want = TriggerPhrase(near_miss_prompts=16).near_miss_test(fed.test_x.cpu(), fed.test_y.cpu())
    assert list(fed.probes.near_miss) == list(want) == ["prefix", "suffix", "last"]
    assert all(torch.equal(fed.probes.near_miss[k][0].cpu(), want[k][0]) for k in want)
    doc = run_scenario(sc)
    assert [r["baseline"] for r in doc["runs"]] == [True, False]
    for run in doc["runs"]:  # the clean baseline is scored on the same prompts
        rate = run["metrics"]["near_miss_trigger_rate"]
        assert rate is not None and 0.0 <= rate <= 1.0, run["attack"]
        assert 0.0 <= run["metrics"]["false_trigger_rate"] <= 1.0
    records = fed.run().records
    rec = records[-1]
    by_kind = rec.extra["near_miss_trigger_by_kind"]
    assert set(by_kind) == {"prefix", "suffix", "last"} and all(0.0 <= v <= 1.0 for v in by_kind.values())
    n = {k: v[0].shape[0] for k, v in fed.probes.near_miss.items()}
    assert rec.extra["near_miss_trigger"] == pytest.approx(sum(by_kind[k] * n[k] for k in n) / sum(n.values()))
    assert summarize(records, records)["near_miss_trigger_rate"] == rec.extra["near_miss_trigger"]


def test_composed_backdoor_gets_near_miss_prompts(tmp_path: Path) -> None:
    sc = _scenario(_groups(tmp_path / "c", 8, 200), {"name": "compose", "attacks": [
        {"name": "trigger_phrase", "fraction": 1.0, "near_miss_prompts": 4}, {"name": "outer_replacement"}]})
    fed = Federation(sc)
    assert {k: v[0].shape[0] for k, v in fed.probes.near_miss.items()} == {"prefix": 4, "suffix": 4, "last": 4}
