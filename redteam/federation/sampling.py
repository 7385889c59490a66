"""Who takes part in a round, and whether the attack acts in it (the field's evaluation protocol).

Backdoor benchmarks (BackFed, Dao et al., arXiv 2507.04903; the FLPoison SoK of Heyi Zhang
et al., arXiv 2502.03801) sample K of N clients each round and let the attack act only
inside a window of rounds; how the attackers are drawn into those rounds is the "fixed pool vs random
sampling" question of Sun et al., "Can You Really Backdoor Federated Learning?" (2019).

:class:`RoundPlan` is the one small interface the round loop asks (see :mod:`.regimes`):
for round r, :meth:`RoundPlan.draw` gives the participants, and :meth:`RoundPlan.roles`
the clients that act maliciously in it. The loop has no branch on the protocol: every
scenario has a plan, and the default plan (every online client, every round, the attack
always on) draws nothing from any random stream, so a scenario without the protocol's keys
runs exactly as before.

Participation (``[federation] clients_per_round = K``): each round, K clients drawn
uniformly without replacement among the *eligible* ones — online and not banned (a client the
provenance gate excluded, or one banned for equivocation, is never drawn and takes no place
among the K) — from the run's own ``sampling`` stream. The rule when fewer than K are
eligible: the round takes all of them (it is smaller than K; a banned client never fills it).
With K or more eligible a round holds exactly K clients, whatever the attacker selection.
``attacker_selection`` says how attackers enter a round *in which the attack acts*:

* ``"random"`` (default): like everyone else — an attacker takes part when it is drawn;
* ``"every_round"``: every available attacker takes part, and K − (their number) honest
  clients are drawn (Sun et al.'s fixed pool: the adversary is in every round);
* ``"count"``: ``attackers_per_round`` = a of the available attackers are drawn, and K − a
  honest clients (BackFed's fixed number of attackers per poisoning round). When fewer than
  K − a honest clients are eligible (churn, bans), the places they leave are drawn among the
  remaining eligible attackers, so that the round still holds K (more than a attackers act in
  it then).

In a round the attack does not act in (outside ``[attack] window``, or between its
``every``-th rounds) every client is drawn uniformly, attackers included, and they behave
honestly. The draws depend on the window, not on the attack, so the no-attack baseline of a
run draws exactly the same participants as the attacked run: the attackers of an
``every_round`` plan take part in the baseline too, as the honest clients they would be.

Ground truth for detection: a client is malicious in a round only if it acts in it (the
attack is not ``none``, the round is in the window, and the client is an attacker); a
client that did not take part is not judged (``RoundRecord.participating``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..scenario import AttackWindow, FederationSpec

__all__ = ["RoundPlan"]


@dataclass
class RoundPlan:
    """The participation rule and the attack window of one run."""

    spec: FederationSpec
    window: AttackWindow
    is_malicious: np.ndarray  # (n,) bool: the run's attackers
    rng: np.random.Generator

    def active(self, rnd: int) -> bool:
        """Whether the attack acts in round ``rnd`` (its window and ``every``)."""
        return self.window.active(rnd)

    def roles(self, rnd: int, attacking: bool) -> np.ndarray:
        """``(n,)`` bool: the clients that act maliciously in round ``rnd`` (none when the
        attack acts on nothing, ``attacking = False``: the baseline's ``none``)."""
        return self.is_malicious & (attacking and self.active(rnd))

    def draw(self, rnd: int, available: np.ndarray, banned: np.ndarray | None = None) -> np.ndarray:
        """The sorted ids of round ``rnd``'s participants among ``available`` (sorted ids),
        never one of ``banned``: exactly K when K or more are eligible, else all the eligible
        ones (module docstring). Without K every available client is returned, banned ones
        included: the loop records those as rejected, as it does in every round."""
        k = self.spec.clients_per_round
        if k is None:
            return available
        if banned is not None and banned.size:
            available = available[~np.isin(available, banned)]
        if available.size <= k:
            return available
        rule = self.spec.attacker_selection if self.active(rnd) else "random"
        if rule == "random":
            chosen = self.rng.choice(available, size=k, replace=False)
        else:
            mal = available[self.is_malicious[available]]
            honest = available[~self.is_malicious[available]]
            a = mal.size if rule == "every_round" else min(int(self.spec.attackers_per_round or 0), mal.size)
            a = min(a, k)
            picked = self.rng.choice(mal, size=a, replace=False) if a < mal.size else mal
            rest = self.rng.choice(honest, size=min(k - a, honest.size), replace=False)
            chosen = np.concatenate([picked, rest])
            short = k - chosen.size  # too few honest clients eligible: fill with the other attackers
            if short > 0:
                others = mal[~np.isin(mal, picked)]
                chosen = np.concatenate([chosen, self.rng.choice(others, size=short, replace=False)])
        return np.sort(chosen.astype(np.int64))
