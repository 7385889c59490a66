"""Aggregator-aware optimisation attacks: the defense itself is the oracle.

Rules that accept every client — coordinate-wise median and trimmed mean, geometric
median, centered clipping — give an acceptance line search (``adaptive``, Min-Max) no
signal: every strength is "accepted". These attacks instead maximise the *damage*, the
distance of the defended aggregate from the honest mean,

    L(γ) = ‖AGR(honest rows ∪ f copies of x_b(γ)) − μ‖,

calling the server's defense (``ctx.defense``, given to ``adaptive`` attacks: a white-box
adversary) on the round's full matrix, with the crafted rows at the malicious clients'
positions. μ is the mean of the honest rows (``ctx.visible_updates``: omniscient).

* ``agr_tailored`` — Shejwalkar & Houmansadr, "Manipulating the Byzantine: Optimizing
  Model Poisoning Attacks and Defenses for Federated Learning", NDSS 2021, the
  AGR-tailored attacks. x_b = μ − γ·p with p ∈ {unit_vec, sign, std} as for Min-Max
  (``attacks.minmax.perturbation``, including ``std_sign``: the released code works on
  gradients, so its μ_g − γσ_g is μ + γσ on our delta rows); every malicious client
  sends the same row. Two objectives (``objective``), chosen per rule as the released
  notebooks do (``"auto"``, the default):

  - ``"damage"`` — median and trimmed mean (their released ``our_attack_median`` /
    ``our_attack_trmean``) and every rule that is not of the Krum family: maximise L(γ).
    The released search: γ = step = ``gamma_init`` (10 in the released notebooks),
    γ_succ = 0, L_prev = −1; while |γ_succ − γ| > ``tol``: if L(γ) > L_prev then
    γ_succ ← γ, γ ← γ + step/2, else γ ← γ − step/2; step ← step/2; L_prev ← L(γ) (the
    comparison is with the *previous probe*, not with the best so far — a hill-climbing
    heuristic, reproduced as is).
  - ``"selection"`` — Krum, Multi-Krum and Bulyan (``defenses.krum``; their released
    ``our_attack_mkrum``, "the same" for Multi-Krum and Bulyan): the largest γ for which
    the rule still selects every malicious copy. The released search is Min-Max's
    halving search (``attacks.minmax.gamma_search``): γ = step = ``gamma_init`` (3 in the
    released CIFAR-10 notebooks, 20 in the FEMNIST ones), γ_succ = 0; while
    |γ_succ − γ| > ``tol`` (1e-5): if x_b(γ) passes, γ_succ ← γ and γ ← γ + step/2,
    otherwise γ ← γ − step/2; step ← step/2. It sends μ − γ_succ·p (μ itself when no γ
    passes). The test (``selection_test``):

    · ``"defense"`` (default): the server's own rule, called on the full matrix:
      Krum's choice is a malicious copy; Multi-Krum's m selected rows (as the server is
      configured: ``scores`` or ``iterative``) hold all f copies; Bulyan's θ = n − 2f
      selected rows hold all f copies. In general: the rule's ``selected`` list holds
      min(f, its length) malicious positions. A rule outside the Krum family (only with
      ``objective = "selection"``) passes when it accepts every malicious row.
    · ``"released"``: the released notebooks' test, whatever the Krum-family server:
      iterative Multi-Krum with f = the number of attackers (``MultiKrum(f=f,
      variant="iterative")``, n − 2f − 2 picks) must pick all f copies (the release's
      ``np.sum(krum_candidate < n_attackers) == n_attackers``). It never passes when
      2f + 2 ≥ n. Our Krum scores count the n − f − 2 nearest *other* rows (the paper);
      the released ``multi_krum`` sums the n − f − 2 smallest entries of a sorted row
      that includes the row's zero distance to itself (one neighbour fewer).

  ``search = "grid"`` instead evaluates ``evals`` values of γ spaced evenly in
  (0, 2·gamma_init]: the damage objective sends the best (one batched defense call for
  coordinate-wise rules), the selection objective the largest that passes (probed from
  the top down, one defense call each, stopping at the first pass).
* ``alie_opt`` / ``ipm_opt`` — the "optimal" ALIE and IPM of the ByzFL library (EPFL;
  used in Allouah et al., "Fixing by Mixing", AISTATS 2023): ALIE's μ + τ·σ and IPM's
  −τ·μ with the factor τ chosen by ByzFL's line search maximising L(τ): start at
  τ₀ = ``start`` (0), step δ = ``delta`` (10); *expansion*: probe τ_best + δ, on
  improvement take it and double δ, otherwise multiply δ by ``ratio`` (0.8) and stop;
  *contraction*: probe τ_best + δ, take it on improvement, multiply δ by ``ratio``;
  ``evals`` (20) evaluations of L in all. ByzFL works on gradients and sends μ_g + τσ_g;
  on our delta rows that is μ − τσ, hence ``sign = -1`` (default) for ``alie_opt``;
  IPM's −τμ is the same in either space.

What is simulated is the flat defense on the uncompressed rows, with an empty defense
state (the attacker does not know a stateful rule's memory, e.g. centered clipping's
previous aggregate) and a generator seeded once per round, so every probe sees the same
randomness. Without a defense in the context (a bare call, or an engine that does not
pass it) the oracle is the plain mean, ByzFL's default aggregator; ``"auto"`` then
maximises the damage. A Krum-family rule inside a :class:`~redteam.pipeline.Pipeline` is
not recognised by ``"auto"`` (its ``selected`` indices are the stage's own); there
``objective = "selection"`` tests acceptance of every malicious row.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Literal

from redteam.types import Attack, AttackContext, ServerContext, Surface, param_error

from ._common import broadcast, work
from .minmax import DEV_TYPES, gamma_search, perturbation

if TYPE_CHECKING:
    import torch

__all__ = ["AGRTailored", "OptimalALIE", "OptimalIPM", "DamageOracle", "SelectionOracle", "byzfl_line_search",
           "released_search"]


#: the most values one batched oracle call may hold (2²⁶ float32 = 256 MiB); more probes
#: are split over several calls
BATCH_ELEMENTS = 1 << 26


def _coordinatewise(defense: Any) -> bool:
    """True for rules that act on each coordinate alone (their call can batch candidates
    side by side along the coordinate axis)."""
    from defenses.median import Median, TrimmedMean

    return isinstance(defense, (Median, TrimmedMean))


def _krum_family(defense: Any) -> bool:
    """True for the rules the released code attacks with the selection search."""
    from defenses.krum import Bulyan, Krum, MultiKrum

    return isinstance(defense, (Krum, MultiKrum, Bulyan))


class _RoundMatrix:
    """The round's full matrix with the honest rows in place and the malicious positions
    to fill, and the server context a probe is judged in (shared by the oracles)."""

    def __init__(self, ctx: AttackContext) -> None:
        import torch

        honest = ctx.visible_updates
        own = ctx.own_updates
        n, f, h = ctx.n_clients, ctx.n_malicious, honest.shape[0]
        dev = own.device
        rows = ctx.rows
        if h + f == n and len(set(rows)) == f and all(0 <= i < n for i in rows):
            mal = torch.tensor(rows, dtype=torch.int64, device=dev)
        else:  # positions unknown (churn, partial view): malicious rows after the honest ones
            n = h + f
            mal = torch.arange(h, n, device=dev)
        is_mal = torch.zeros(n, dtype=torch.bool, device=dev)
        is_mal[mal] = True
        self.n, self.d, self.dtype, self.device = n, int(own.shape[1]), own.dtype, dev
        self.mal = mal
        self.base = torch.empty((n, self.d), dtype=own.dtype, device=dev)
        self.base[~is_mal] = honest.to(device=dev, dtype=own.dtype)
        self.mu = work(honest).mean(dim=0)
        self.defense = ctx.defense
        self.weights = ctx.weights if (ctx.weights is not None and ctx.weights.shape[0] == n) else None
        self.ctx = ctx
        g = ctx.generator
        self.seed = int(torch.randint(0, 2**62, (1,), generator=g, device=g.device))
        self.calls = 0

    def _server_ctx(self, full: "torch.Tensor", batched: bool) -> ServerContext:
        import torch

        c = self.ctx
        extra: dict[str, Any] = {}
        if self.weights is not None:
            extra["weights"] = self.weights.to(device=full.device)
        if not batched:
            extra["global_params"] = c.global_params
            extra["previous_update"] = c.previous_update
        return ServerContext.default(
            full, round=c.round, client_ids=tuple(range(self.n)),
            generator=torch.Generator(device=c.generator.device).manual_seed(self.seed), **extra)


class DamageOracle(_RoundMatrix):
    """L(row) = ‖defense(full matrix with ``row`` at the malicious positions) − μ‖ for a batch.

    Built once per round from the attack context; :meth:`damage` takes ``(k, d)``
    candidate rows (one per probe; every malicious client sends that row) and returns the
    ``(k,)`` float64 distances. Coordinate-wise rules get the k probes in one call
    (matrices placed side by side along the coordinates; split into several calls beyond
    ``BATCH_ELEMENTS`` values); other rules one call each.
    """

    def _aggregate(self, full: "torch.Tensor", batched: bool = False) -> "torch.Tensor":
        from redteam.pipeline import weighted_mean

        self.calls += 1
        if self.defense is None:
            w = self.weights if self.weights is not None else full.new_ones(full.shape[0])
            return weighted_mean(full, w.to(dtype=full.dtype))
        return self.defense(full, self._server_ctx(full, batched)).aggregate

    def damage(self, candidates: "torch.Tensor") -> "torch.Tensor":
        import torch

        k = candidates.shape[0]
        cand = candidates.to(device=self.device, dtype=self.dtype)
        per_call = max(1, BATCH_ELEMENTS // max(1, self.n * self.d))  # probes per batched call
        if k > 1 and per_call > 1 and _coordinatewise(self.defense):
            aggs = []
            for lo in range(0, k, per_call):  # ⌈k / per_call⌉ calls, each at most BATCH_ELEMENTS values
                c = cand[lo:lo + per_call]
                kk = c.shape[0]
                full = self.base.unsqueeze(1).expand(self.n, kk, self.d).clone()
                full[self.mal] = c.unsqueeze(0).expand(self.mal.shape[0], kk, self.d)
                aggs.append(self._aggregate(full.reshape(self.n, kk * self.d), batched=True).reshape(kk, self.d))
            agg = torch.cat(aggs)
        else:
            aggs = []
            for j in range(k):  # bounded by the search's evaluation budget
                full = self.base.clone()
                full[self.mal] = cand[j]
                aggs.append(self._aggregate(full))
            agg = torch.stack(aggs)
        diff = work(agg).to(self.mu.dtype) - self.mu[None, :]
        return torch.linalg.vector_norm(diff, dim=1, dtype=torch.float64)


class SelectionOracle(_RoundMatrix):
    """Is every malicious copy of ``row`` selected? (``agr_tailored``'s selection test.)

    ``test = "defense"``: the server's rule decides. For Krum, Multi-Krum and Bulyan
    (:mod:`defenses.krum`) the probe passes when the rule's ``selected`` list (Krum's
    choice, Multi-Krum's m rows, Bulyan's θ rows) holds min(f, its length) malicious
    positions — every copy it has room for; another rule passes when it accepts every
    malicious row; no defense (the plain mean) passes always. ``test = "released"``: the
    released notebooks' test for every target, iterative Multi-Krum with f = the number
    of attackers picking all f copies (never, when 2f + 2 ≥ n). One defense call per probe
    (the halving search is sequential); :attr:`calls` counts them.
    """

    def __init__(self, ctx: AttackContext, test: str = "defense") -> None:
        super().__init__(ctx)
        from defenses.krum import MultiKrum

        f = int(self.mal.shape[0])
        self.f = f
        self.rule: Any = self.defense
        self.need_all = False  # all f copies, as the released test (not min(f, |selected|))
        if test == "released":
            self.need_all = True
            self.rule = MultiKrum(f=f, variant="iterative") if 2 * f + 2 < self.n else None

    def selected(self, row: "torch.Tensor") -> int:
        """How many malicious positions the rule selects when they all send ``row`` (d,);
        −1 for a rule without a ``selected`` list (or the plain mean)."""
        return self._judge(row)[0]

    def passes(self, row: "torch.Tensor") -> bool:
        return self._judge(row)[1]

    def _judge(self, row: "torch.Tensor") -> tuple[int, bool]:
        import torch

        if self.rule is None:
            return -1, self.defense is None and not self.need_all
        full = self.base.clone()
        full[self.mal] = row.to(device=self.device, dtype=self.dtype)
        self.calls += 1
        dec = self.rule(full, self._server_ctx(full, batched=False))
        sel = dec.state.get("selected") if _krum_family(self.rule) else None
        if sel is None:
            return -1, bool(dec.accepted[self.mal].all())
        chosen = torch.zeros(self.n, dtype=torch.bool, device=self.device)
        if len(sel):
            chosen[torch.as_tensor(sel, dtype=torch.int64, device=self.device)] = True
        hit = int(chosen[self.mal].sum())
        need = self.f if self.need_all else min(self.f, len(sel))
        return hit, hit >= need and hit > 0


def released_search(loss: Callable[[float], float], gamma_init: float, tol: float) -> float:
    """Shejwalkar & Houmansadr's released search for the tailored attacks (module docstring)."""
    gamma, step, succ, prev = float(gamma_init), float(gamma_init), 0.0, -1.0
    while abs(succ - gamma) > tol:
        cur = loss(gamma)
        if prev < cur:
            succ = gamma
            gamma = gamma + step / 2
        else:
            gamma = gamma - step / 2
        step = step / 2
        prev = cur
    return succ


def byzfl_line_search(loss: Callable[[float], float], evals: int, start: float, delta: float,
                      ratio: float) -> float:
    """ByzFL's expansion-then-contraction maximiser of ``loss`` (module docstring)."""
    best_x, best_y = start, loss(start)
    left = evals - 1
    while left > 0:  # expansion
        prop = best_x + delta
        y = loss(prop)
        left -= 1
        if y > best_y:
            best_x, best_y = prop, y
            delta *= 2
        else:
            delta *= ratio
            break
    while left > 0:  # contraction
        prop = best_x + delta
        y = loss(prop)
        left -= 1
        if y > best_y:
            best_x, best_y = prop, y
        delta *= ratio
    return best_x


def _positive(obj: Any, name: str, v: float) -> None:
    if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0):
        raise param_error(obj, name, v, "must be a finite number > 0")


def _evals(obj: Any, v: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 200:
        raise param_error(obj, "evals", v, "must be an integer in [1, 200] (defense calls per round)")


def _sign(obj: Any, name: str, v: int) -> None:
    if isinstance(v, bool) or v not in (1, -1):
        raise param_error(obj, name, v, "must be +1 or -1")


@dataclass(frozen=True, slots=True)
class AGRTailored(Attack):
    """Shejwalkar & Houmansadr's AGR-tailored attack: μ − γp, γ chosen against the
    server's rule (see the module docstring).

    * ``dev_type`` (unit_vec | sign | std, default unit_vec, the released function's),
      ``std_sign`` (+1: the released gradient-space μ_g − γσ_g on deltas), ``ddof`` (1);
    * ``objective``: ``"auto"`` (default: ``"selection"`` against Krum, Multi-Krum and
      Bulyan, ``"damage"`` against every other rule, as the released notebooks),
      ``"damage"`` or ``"selection"``;
    * ``selection_test``: ``"defense"`` (default: the server's own selection) or
      ``"released"`` (iterative Multi-Krum with f = the attackers, the notebooks' test);
    * ``gamma_init``: unset = the released notebooks' start for the objective in force,
      10 for the damage search and 3 for the selection search (CIFAR-10 notebooks; their
      FEMNIST ones start at 20); ``tol`` (1e-5);
    * ``search``: ``"released"`` (default) or ``"grid"`` with ``evals`` points (16).
    """

    dev_type: Literal["unit_vec", "sign", "std"] = "unit_vec"
    std_sign: int = 1
    ddof: int = 1
    gamma_init: float | None = None
    tol: float = 1e-5
    search: Literal["released", "grid"] = "released"
    evals: int = 16
    objective: Literal["auto", "damage", "selection"] = "auto"
    selection_test: Literal["defense", "released"] = "defense"
    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES,)
    omniscient: ClassVar[bool] = True
    adaptive: ClassVar[bool] = True
    summary: ClassVar[str] = ("AGR-tailored: μ − γp, γ the largest keeping every copy selected (Krum family) "
                              "or maximising the defended aggregate's distance from μ (other rules)")
    reference: ClassVar[str] = "Shejwalkar & Houmansadr, NDSS 2021"

    #: the released notebooks' starting γ per objective (median / trimmed mean: 10;
    #: Multi-Krum / Bulyan on CIFAR-10: 3)
    GAMMA_INIT: ClassVar[Mapping[str, float]] = MappingProxyType({"damage": 10.0, "selection": 3.0})

    def validate_dev_type(self, v: str) -> None:
        if v not in DEV_TYPES:
            raise param_error(self, "dev_type", v, "must be 'unit_vec', 'sign' or 'std'")

    def validate_std_sign(self, v: int) -> None:
        _sign(self, "std_sign", v)

    def validate_ddof(self, v: int) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise param_error(self, "ddof", v, "must be an integer ≥ 0")

    def validate_gamma_init(self, v: float | None) -> None:
        if v is not None:
            _positive(self, "gamma_init", v)

    def validate_tol(self, v: float) -> None:
        _positive(self, "tol", v)

    def validate_search(self, v: str) -> None:
        if v not in ("released", "grid"):
            raise param_error(self, "search", v, "must be 'released' or 'grid'")

    def validate_evals(self, v: int) -> None:
        _evals(self, v)

    def validate_objective(self, v: str) -> None:
        if v not in ("auto", "damage", "selection"):
            raise param_error(self, "objective", v, "must be 'auto', 'damage' or 'selection'")

    def validate_selection_test(self, v: str) -> None:
        if v not in ("defense", "released"):
            raise param_error(self, "selection_test", v, "must be 'defense' or 'released'")

    def objective_for(self, defense: Any) -> str:
        """The objective in force against ``defense`` (``"damage"`` or ``"selection"``)."""
        if self.objective != "auto":
            return self.objective
        return "selection" if _krum_family(defense) else "damage"

    def gamma(self, ctx: AttackContext) -> tuple[float, "torch.Tensor", "torch.Tensor"]:
        """(γ, μ, p) for this round."""
        import torch

        honest = ctx.visible_updates
        if honest.shape[0] == 0:
            raise param_error(self, "dev_type", self.dev_type, "no honest updates are visible")
        x = work(honest)
        mu = x.mean(dim=0)
        p = perturbation(x, self.dev_type, self.ddof, self.std_sign)
        objective = self.objective_for(ctx.defense)
        g0 = float(self.GAMMA_INIT[objective] if self.gamma_init is None else self.gamma_init)
        grid = torch.linspace(2 * g0 / self.evals, 2 * g0, self.evals, dtype=torch.float64)
        if objective == "selection":
            sel = SelectionOracle(ctx, self.selection_test)
            if self.search == "grid":
                for gm in grid.flip(0).tolist():  # the largest passing γ: top down, stop at the first pass
                    if sel.passes(mu - gm * p):
                        return gm, mu, p
                return 0.0, mu, p
            return gamma_search(lambda gm: sel.passes(mu - gm * p), g0, self.tol), mu, p
        oracle = DamageOracle(ctx)
        if self.search == "grid":
            dmg = oracle.damage(mu[None, :] - grid[:, None].to(mu.dtype) * p[None, :])
            return float(grid[int(torch.argmax(dmg))]), mu, p
        g = released_search(lambda gm: float(oracle.damage((mu - gm * p)[None, :])[0]), g0, self.tol)
        return g, mu, p

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        g, mu, p = self.gamma(ctx)
        return broadcast(mu - g * p, ctx)


@dataclass(frozen=True, slots=True)
class _ByzFLOptimal(Attack):
    evals: int = 20
    start: float = 0.0
    delta: float = 10.0
    ratio: float = 0.8
    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES,)
    omniscient: ClassVar[bool] = True
    adaptive: ClassVar[bool] = True

    def validate_evals(self, v: int) -> None:
        _evals(self, v)

    def validate_start(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)):
            raise param_error(self, "start", v, "must be a finite number")

    def validate_delta(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v != 0):
            raise param_error(self, "delta", v, "must be a finite non-zero number")

    def validate_ratio(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0.5 < v < 1):
            raise param_error(self, "ratio", v, "must be in (0.5, 1)")

    def _base(self, x: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:  # pragma: no cover
        raise NotImplementedError

    def tau(self, ctx: AttackContext) -> tuple[float, "torch.Tensor", "torch.Tensor"]:
        """(τ, a, b) with the crafted row a + τ·b."""
        honest = ctx.visible_updates
        if honest.shape[0] == 0:
            raise param_error(self, "evals", self.evals, "no honest updates are visible")
        a, b = self._base(work(honest))
        oracle = DamageOracle(ctx)
        t = byzfl_line_search(lambda s: float(oracle.damage((a + s * b)[None, :])[0]),
                              self.evals, float(self.start), float(self.delta), float(self.ratio))
        return t, a, b

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        t, a, b = self.tau(ctx)
        return broadcast(a + t * b, ctx)


@dataclass(frozen=True, slots=True)
class OptimalALIE(_ByzFLOptimal):
    """ByzFL's optimal ALIE: μ + sign·τ·σ (σ with ``ddof``, default 1 as ByzFL), τ from
    ByzFL's line search on the defended aggregate's distance from μ.

    ``sign`` = −1 (default) is ByzFL's gradient-space μ_g + τσ_g on our delta rows; +1
    gives μ + τσ on deltas (the original ALIE code's direction). Line search:
    ``evals`` (20), ``start`` (0), ``delta`` (10), ``ratio`` (0.8), ByzFL's defaults.
    """

    sign: int = -1
    ddof: int = 1
    summary: ClassVar[str] = "Optimal ALIE: μ ± τσ with τ maximising the defended aggregate's distance from μ"
    reference: ClassVar[str] = "Baruch et al., NeurIPS 2019; ByzFL (Allouah et al., AISTATS 2023)"

    def validate_sign(self, v: int) -> None:
        _sign(self, "sign", v)

    def validate_ddof(self, v: int) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise param_error(self, "ddof", v, "must be an integer ≥ 0")

    def _base(self, x: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
        if x.shape[0] <= self.ddof:
            raise param_error(self, "ddof", self.ddof, f"σ needs more than ddof honest updates, got {x.shape[0]}")
        return x.mean(dim=0), self.sign * x.std(dim=0, correction=self.ddof)


@dataclass(frozen=True, slots=True)
class OptimalIPM(_ByzFLOptimal):
    """ByzFL's optimal IPM: −τ·μ, τ from ByzFL's line search on the defended aggregate's
    distance from μ (``evals`` 20, ``start`` 0, ``delta`` 10, ``ratio`` 0.8)."""

    summary: ClassVar[str] = "Optimal IPM: −τμ with τ maximising the defended aggregate's distance from μ"
    reference: ClassVar[str] = "Xie et al., UAI 2019; ByzFL (Allouah et al., AISTATS 2023)"

    def _base(self, x: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
        mu = x.mean(dim=0)
        return mu.new_zeros(mu.shape), -mu
