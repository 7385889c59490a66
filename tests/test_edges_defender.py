"""The defender's ranking at its boundaries (issue 39, survivors of an outside mutation audit),
each worked by hand from synthetic store rows (:mod:`redteam.report.defender`: "defenses still
tied share a rank"; ``≈1`` when a harm interval overlaps the leader's; a defense with unfinished
cells ranks after the complete ones):

* intervals that *touch* overlap — common, since harm is clamped at 0;
* a defense with unfinished cells is never marked indistinguishable from the leader;
* ranks after a tie skip (1, 1, 3: competition ranking), they are not dense (1, 1, 2)."""

from __future__ import annotations

import pytest

from redteam.report import report_from_rows


def _rounds(acc: float) -> list[dict]:
    """A baseline's two rounds; the first carries the untrained level 0.10."""
    u = {"accuracy": 0.10, "loss": None, "chance_accuracy": 0.10}
    return [{"round": 0, "accuracy": 0.3, "loss": 2.0, "accepted": [True] * 4, "participating": [True] * 4,
             "malicious": [False] * 4, "rejected": {}, "extra": {"untrained": u}},
            {"round": 1, "accuracy": acc, "loss": 0.5, "accepted": [True] * 4, "participating": [True] * 4,
             "malicious": [False] * 4, "rejected": {}, "extra": {}}]


def _cell(defense: str, attack: str, unders: list[float | None], clean: float = 0.9) -> list[dict]:
    """One cell, a row per seed: accuracy under attack per seed (None: that seed not finished)."""
    out = []
    for rep, u in enumerate(unders):
        done = u is not None
        m = {"final_accuracy": u, "final_accuracy_last_k": u, "accuracy_drop": clean - u, "asr": None,
             "recall": 0.0, "tp": 0, "fp": 0} if done else None
        out.append({"cell_id": f"{defense}[{attack}]", "attack": attack, "defense": defense, "settings": {},
                    "replicate": rep, "seed": 100 + rep, "finished": done, "metrics": m,
                    "rounds": _rounds(u) if done else None, "baseline_rounds": _rounds(clean)})
    return out


def _group(rows: list[dict]):
    (g,) = report_from_rows(rows).defenders.groups
    return g, {r.defense: r for r in g.rows}


def test_touching_harm_intervals_are_indistinguishable():
    """Clean 0.90 everywhere, untrained 0.10 (span 0.80). "a" loses nothing in either seed: harm
    [0, 0]. "b" ends at 0.90 and 0.86: mean harm 0.025, and its interval's upper accuracy is at or
    above the best clean, so its harm interval starts at exactly 0 — it touches a's. Ranked 2nd,
    marked ≈1."""
    g, r = _group(_cell("a", "ipm", [0.9, 0.9]) + _cell("b", "ipm", [0.9, 0.86]))
    assert (r["a"].harm, r["a"].harm_lo, r["a"].harm_hi) == (0.0, 0.0, 0.0)
    assert r["b"].harm == pytest.approx(0.025) and r["b"].harm_lo == 0.0 and r["b"].harm_hi > 0.025
    assert r["a"].rank == 1 and r["b"].rank == 2
    assert r["b"].tied_with_leader and r["b"].rank_text == "≈1"
    assert "Indistinguishable from a at 95 % over 2 seeds: b." in g.headline


def test_a_defense_with_unfinished_cells_is_not_marked_indistinguishable():
    """"c" has the same finished figures as "b" above (its interval touches the leader's) but one
    seed of a second attack is still running: it ranks after the complete defenses and is not ≈1."""
    rows = (_cell("a", "ipm", [0.9, 0.9]) + _cell("a", "alie", [0.9, 0.9])
            + _cell("c", "ipm", [0.9, 0.86]) + _cell("c", "alie", [0.9, None]))
    g, r = _group(rows)
    assert r["c"].pending == 1 and r["c"].harm_lo == 0.0
    assert r["a"].rank == 1 and r["c"].rank == 2
    assert not r["c"].tied_with_leader and r["c"].rank_text == "2"
    assert not any(h.startswith("Indistinguishable") for h in g.headline)


def test_ranks_after_a_tie_skip_the_shared_places():
    """"a" and "a2" are identical (harm 0, same clean accuracy): both rank 1, and "c" (harm 0.5)
    ranks 3 — two defenses are ahead of it — not 2."""
    rows = _cell("a", "ipm", [0.9]) + _cell("a2", "ipm", [0.9]) + _cell("c", "ipm", [0.5])
    g, r = _group(rows)
    assert r["a"].rank == r["a2"].rank == 1
    assert r["c"].harm == pytest.approx(0.5) and r["c"].rank == 3
    assert [x.rank_text for x in g.rows] == ["1", "1", "3"]
    assert g.headline[1].startswith("Pick: a (tied: a2)")
