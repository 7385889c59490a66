"""The asynchronous server's edges (issue 39, survivors of an outside mutation audit), each a
worked example on a hand-made timeline: an async attack honours ``[attack] window``; under
``[async] trust_claims = false`` the max-staleness drop reads the version the server served, not
the one the client claims; an update exactly at ``max_staleness`` is kept ("staler than
max_staleness: dropped", :mod:`redteam.federation.asyncrun`)."""

from __future__ import annotations

import numpy as np

from redteam.federation.asyncrun import AsyncRun
from redteam.federation.regimes import make_run
from redteam.scenario import parse_scenario

FLAT = {"compute_sigma": 0.0, "bandwidth_sigma": 0.0, "latency_sigma": 0.0}


def _run(compute: list[float], rounds: int, attack: dict | None = None, fraction: float = 0.0,
         **asy) -> AsyncRun:
    doc = {"scenario": {"seed": 3}, "workload": {"name": "digits"},
           "federation": {"clients": len(compute), "rounds": rounds, "local_steps": 1, "partition": "iid",
                          "malicious_fraction": fraction},
           "transport": {"network": dict(FLAT)}, "async": {"buffer_size": 1, **asy}}
    if attack is not None:
        doc["attack"] = attack
    run = make_run(parse_scenario(doc))
    net = run.fed.network  # job durations by hand: compute[i] seconds per local step, instant links
    net.compute_s = np.asarray(compute, dtype=np.float64)
    net.bytes_per_s = np.full(len(compute), np.inf)
    net.latency_s = np.zeros(len(compute))
    return run


def test_an_update_exactly_at_max_staleness_is_kept_one_past_it_dropped():
    """Clients at 1, 2, 3 s per step, K = 1 (tests/test_async.py's timeline): c2 (base 0) arrives
    at t = 3 while the server is at version 3, τ = 3. With max_staleness = 3 it is merged (step 3,
    staleness [3]); with max_staleness = 2 it is dropped."""
    at = _run([1.0, 2.0, 3.0], rounds=4, max_staleness=3)
    recs = at.run().records
    assert recs[3].extra["async"]["clients"] == [2] and recs[3].extra["async"]["staleness"] == [3]
    assert all(r.extra["async"]["stale_dropped"] == 0 for r in recs) and not any(r.dropped for r in recs)
    past = _run([1.0, 2.0, 3.0], rounds=4, max_staleness=2).run().records
    assert past[3].dropped == {2: "stale: τ = 3 > max_staleness = 2"}


def _attacker(clients: int, fraction: float) -> int:
    probe = make_run(parse_scenario({"scenario": {"seed": 3}, "workload": {"name": "digits"},
                                     "federation": {"clients": clients, "malicious_fraction": fraction},
                                     "async": {"buffer_size": 1}}))
    (bad,) = probe.fed.malicious
    return int(bad)


def test_without_trusted_claims_max_staleness_reads_the_served_version():
    """version_lie claims the current version (τ = 0) for an update trained long ago. The slow
    attacker (3.5 s a step against 1 s) is 3 versions stale when it lands: a server that trusts
    claims keeps it at τ = 0; one that keeps its own books (trust_claims = false) drops it at
    max_staleness = 1, saying the true τ."""
    bad = _attacker(4, 0.25)
    compute = [1.0] * 4
    compute[bad] = 3.5
    lie = {"name": "version_lie"}
    trusted = _run(compute, 8, lie, 0.25, max_staleness=1).run().records
    mine = [r.extra["async"] for r in trusted if bad in r.extra["async"]["clients"]]
    assert mine and all(i["staleness"] == [0] and i["true_staleness"][0] > 1 for i in mine)
    assert not any(bad in r.dropped for r in trusted)
    books = _run(compute, 8, lie, 0.25, max_staleness=1, trust_claims=False).run().records
    assert not any(bad in r.extra["async"]["clients"] for r in books)  # never merged
    why = [r.dropped[bad] for r in books if bad in r.dropped]
    assert why and all(w.startswith("stale: τ = ") and int(w.split()[3]) > 1 for w in why)
    assert all(r.malicious[bad] for r in books if bad in r.dropped)  # still counted as an attack


def test_an_async_attack_acts_only_on_jobs_started_inside_its_window():
    """Every client 1 s a step, K = 1 of 4: versions advance every arrival. A job is malicious when
    its client is the attacker *and* it started from a version in ``[attack] window = "3:6"``;
    the attacker's jobs from versions 0..2 and 6.. are honest (weight s(τ), truthful claims)."""
    bad = _attacker(4, 0.25)
    run = _run([1.0] * 4, 12, {"name": "version_lie", "window": "3:6"}, 0.25, staleness="polynomial")
    recs = run.run().records
    theirs = [j for j in run.jobs if j.client == bad and j.row is not None]
    assert {j.base for j in theirs} & {0, 1, 2} and {j.base for j in theirs} & {3, 4, 5}
    assert {j.base for j in theirs} & set(range(6, 12))
    for j in theirs:
        assert j.malicious == (3 <= j.base < 6), (j.base, j.malicious)
        if not j.malicious:  # an honest job claims its own base
            assert j.claimed in (None, j.base), (j.base, j.claimed)
    honest_rows = [r.extra["async"] for r in recs if r.extra["async"]["clients"] == [bad]
                   and not r.malicious[bad]]
    assert honest_rows and all(i["misclaimed"] == 0 for i in honest_rows)
    assert any(r.malicious[bad] for r in recs)
