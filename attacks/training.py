"""Attacks that shape the malicious clients' own local training (``Surface.TRAINING``).

The engine applies a :class:`~redteam.types.TrainingHook` inside the batched local
training of the malicious rows: an extra loss term, a gradient mask and a projection
after every step. (Neurotoxin's per-step mask lives in ``attacks.compression``.)

* ``constrain_and_scale`` — Bagdasaryan, Veit, Hua, Estrin & Shmatikov, "How To Backdoor
  Federated Learning", AISTATS 2020, §4 "constrain-and-scale". *Constrain*: train on
  L = α·L_class + (1 − α)·L_ano with L_ano = ‖w − G‖₂, the distance the anomaly
  detector (a norm bound) looks at (the released code's ``model_dist_norm_var``). The
  hook adds the extra loss to the class loss, so the objective is that L divided by α:
  L_class + ((1 − α)/α)·‖w − G‖ — the same minimiser and direction; the step size is the
  attacker's ``lr`` on this form. *Scale*: the trained update X − G is boosted by γ,
  by default the model-replacement γ = n/η (with the weighting of the server's rule,
  ``attacks.replacement``), and capped so that ‖γ(X − G)‖ ≤ S (the paper: the attacker
  knows the anomaly detector and scales up to its bound S). By default S is *read from
  the server's defense* (``norm_bound = "defense"``; the attack is white-box, ``adaptive``,
  like ``model_replacement``): the bound of a ``norm_bound`` or ``clip`` stage
  (:func:`server_norm_bound`), no cap when the defense holds none; a number is a fixed S,
  ``"none"`` never caps (the boost alone, rejected by any bound it exceeds). Combine with
  ``backdoor`` (data).
* ``edge_case`` — Wang, Sreenivasan, Rajput, Vishwakarma, Agarwal, Sohn, Lee &
  Papailiopoulos, "Attack of the Tails: Yes, You Really Can Backdoor Federated
  Learning", NeurIPS 2020: edge-case (rare, tail-of-the-distribution) inputs labelled as
  the target, trained with projected gradient descent: after every local step the model
  is projected onto ‖w − G‖ ≤ ε (the released script projects every
  ``project_frequency = 10`` iterations and at the end). The radius is sized to the norm
  bound the defense enforces — the released ``run_simulated_averaging.sh`` runs CIFAR-10
  with ``--eps 2 --norm_bound 2`` — so by default (``eps = "defense"``, white-box) ε =
  ``margin``·M with M the bound of the server's ``norm_bound`` or ``clip`` stage
  (:func:`server_norm_bound`), and no projection when the defense holds no norm bound
  (the paper's black-box attack, the stronger one against a plain mean). A number is a
  fixed ε (2.0: the released CIFAR-10 value, above every honest update norm of the
  digits federation of ``scenarios/envelope.toml``, 0.36–1.4, so it never acts there);
  ``"none"`` never projects. Optional model replacement scales the PGD update by n/η
  afterwards (their "PGD with replacement") and projects the boosted update back onto the
  same ball ‖Δ‖ ≤ ε (ε as above: with ``eps = "defense"`` inside the server's bound, as the
  paper's attacker stays within the norm bound it knows); with no ball the boost is uncapped.
  **Stand-in for the edge-case set**: the digits workload has no ARDIS or
  Southwest-airline set, so the edge cases are the attacker's own samples of class
  ``source`` rotated by ``rotation``·90° (rare-looking: digits never appear rotated),
  labelled ``target`` — the ARDIS "7 → 1" task with rotation standing in for the
  foreign handwriting. ASR is measured on the rotated test samples of ``source``.
* ``dba`` — Xie, Huang, Chen & Li, "DBA: Distributed Backdoor Attacks against Federated
  Learning", ICLR 2020: a global pixel trigger split into local triggers; each colluding
  client stamps only its own local trigger, the full trigger is used at test time. ASR
  is measured on the full trigger (``targeted_test``) and reported per local trigger
  (``targeted_parts``; the trainer records them as ``extra["asr_parts"]``). As in the
  paper, attacker i stamps local trigger i mod K (``assignment = "rank"``): i is the
  order in which this attack instance first poisons the client — the trainer poisons
  the malicious clients in ascending id, so i is the attacker's rank among them (the
  only memory the attack keeps, one entry per client id; inside ``compose`` the part is
  built once, so the memory is the same as alone). ``"client_mod"`` uses client id mod
  K instead (two attackers may share a part). The paper gives every local trigger its
  own attacker (K local triggers, K or more attackers): with fewer, some local triggers
  are never stamped and never trained, and the full-trigger ASR measures a partly
  trained trigger. The attack then warns (:class:`UntrainedTriggerWarning`, when the
  trainer asks for the per-part tests, after poisoning every attacker) naming them.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from redteam.types import Attack, AttackContext, ClientData, Surface, TrainingHook, param_error

from ._common import fit_norm
from .backdoor import Backdoor
from .compression import ball_projection
from .label_flip import poison_indices
from .replacement import ModelReplacement

if TYPE_CHECKING:
    import torch

__all__ = ["ConstrainAndScale", "EdgeCase", "DBA", "DBA_PARTS", "anomaly_loss", "server_norm_bound",
           "UntrainedTriggerWarning"]

#: where an attack that adapts to the server's norm bound reads it from (``"defense"``) or
#: that it ignores every bound (``"none"``); a number is a fixed bound
BOUND_SOURCES = ("defense", "none")


def _positive(obj: Any, name: str, v: float | None, allow_none: bool = True) -> None:
    if v is None and allow_none:
        return
    if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0):
        raise param_error(obj, name, v, "must be a finite number > 0" + (", or unset" if allow_none else ""))


def _steps(obj: Any, v: int | None) -> None:
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
        raise param_error(obj, "steps", v, "must be an integer ≥ 1, or unset (the federation's)")


def _bound_param(obj: Any, name: str, v: Any) -> None:
    if v is None or (isinstance(v, str) and v in BOUND_SOURCES):
        return
    if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0):
        raise param_error(obj, name, v, "must be a finite number > 0, 'defense' (read the server's norm bound) "
                                        "or 'none'")


def server_norm_bound(defense: Any, ctx: AttackContext | None = None) -> float | None:
    """The L2 bound M the server's ``defense`` holds each update to, as a white-box attacker
    reads it (``None``: it holds none).

    Looks at the defense, or at every stage of a pipeline, for ``norm_bound``
    (:class:`defenses.norm.NormBound`, either mode) and ``clip``
    (:class:`defenses.clipping.Clip`); several bounds: the smallest. A static bound is M
    itself. An adaptive one (``multiplier`` k: M = k × the median norm of the round) is
    the attacker's estimate k × the lower median of the norms of the rows it sees
    (``ctx.visible_updates``: every honest row if omniscient, else its own; all-zero rows
    — clients that have not trained yet — left out), and ``None`` when there are none
    (round 0 of a training hook). Other rules (centered clipping, FLAME's median
    clipping) are not read.
    """
    import torch

    from defenses.clipping import Clip
    from defenses.norm import NormBound, l2_norms

    if defense is None:
        return None
    bounds: list[float] = []
    for stage in defense.parts():
        if isinstance(stage, Clip):
            bounds.append(float(stage.bound))
        elif isinstance(stage, NormBound):
            if stage.multiplier is None:
                bounds.append(float(stage.bound))
                continue
            rows = None if ctx is None else ctx.visible_updates
            if rows is None or rows.shape[0] == 0:
                continue
            norms = l2_norms(rows)
            norms = norms[torch.isfinite(norms) & (norms > 0)]
            if norms.numel():
                bounds.append(float(stage.multiplier) * float(norms.median()))
    return min(bounds) if bounds else None


def anomaly_loss(weight: float):
    """``(w, G, x, y) ↦ weight·‖w − G‖₂`` — vmap-able (torch ops only)."""
    import torch

    c = float(weight)

    def extra(flat: "torch.Tensor", global_params: "torch.Tensor", xb: "torch.Tensor",
              yb: "torch.Tensor") -> "torch.Tensor":
        diff = flat - global_params
        # sqrt of a sum of squares with a tiny floor: differentiable at w = G (first step)
        return c * torch.sqrt((diff * diff).sum() + 1e-12)

    return extra


def _boost(ctx: AttackContext, boost: float | None, weighting: str, norm_bound: float | None,
           rows: "torch.Tensor") -> "torch.Tensor":
    """rows × γ (model replacement's γ, or ``boost``), each capped at norm ``norm_bound``."""
    import torch

    gamma = ModelReplacement(boost=boost, weighting=weighting).factors(ctx)  # type: ignore[arg-type]
    out = rows * gamma[:, None].to(rows.dtype)
    if norm_bound is not None and out.shape[0]:
        over = torch.linalg.vector_norm(out, dim=1, dtype=torch.float64) > norm_bound
        if bool(over.any()):
            out = torch.where(over[:, None].to(out.device), fit_norm(out, norm_bound, out), out)
    return out


@dataclass(frozen=True, slots=True)
class ConstrainAndScale(Attack):
    """Bagdasaryan et al.'s constrain-and-scale (see the module docstring).

    * ``alpha`` ∈ (0, 1]: weight of the class loss (1 disables the anomaly term, as the
      released ``params.yaml``'s ``alpha_loss: 1.0``; default 0.5 is our choice);
    * ``lr``, ``steps``: the attacker's local learning rate and steps (unset: the
      federation's; the released code retrains 15 epochs at ``poison_lr`` 0.05);
    * ``boost`` (unset: n/η), ``weighting`` (as ``model_replacement``);
    * ``norm_bound`` S, the cap of the scaled update: ``"defense"`` (default: the bound the
      server's defense enforces, :func:`server_norm_bound`; no cap without one), a number
      (a fixed S), or ``"none"`` (never capped; ``None`` in Python is the same).
    """

    alpha: float = 0.5
    lr: float | None = None
    steps: int | None = None
    boost: float | None = None
    weighting: Literal["defense", "uniform", "samples"] = "defense"
    norm_bound: float | Literal["defense", "none"] | None = "defense"
    surfaces: ClassVar[tuple[str, ...]] = (Surface.TRAINING, Surface.UPDATES)
    adaptive: ClassVar[bool] = True
    summary: ClassVar[str] = "Constrain-and-scale: train with an anomaly (distance) loss, then boost up to the bound"
    reference: ClassVar[str] = "Bagdasaryan et al., AISTATS 2020"

    def validate_alpha(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1):
            raise param_error(self, "alpha", v, "must be in (0, 1]")

    def validate_lr(self, v: float | None) -> None:
        _positive(self, "lr", v)

    def validate_steps(self, v: int | None) -> None:
        _steps(self, v)

    def validate_boost(self, v: float | None) -> None:
        _positive(self, "boost", v)

    def validate_weighting(self, v: str) -> None:
        if v not in ("defense", "uniform", "samples"):
            raise param_error(self, "weighting", v, "must be 'defense', 'uniform' or 'samples'")

    def validate_norm_bound(self, v: Any) -> None:
        _bound_param(self, "norm_bound", v)

    def cap(self, ctx: AttackContext) -> float | None:
        """The bound S the scaled rows are capped at this round (``None``: no cap)."""
        if self.norm_bound is None or self.norm_bound == "none":
            return None
        if self.norm_bound == "defense":
            return server_norm_bound(ctx.defense, ctx)
        return float(self.norm_bound)

    def training_hook(self, ctx: AttackContext) -> TrainingHook:
        extra = anomaly_loss((1 - self.alpha) / self.alpha) if self.alpha < 1 else None
        return TrainingHook(extra_loss=extra, lr=self.lr, steps=self.steps)

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        return _boost(ctx, self.boost, self.weighting, self.cap(ctx), ctx.own_updates)


@dataclass(frozen=True, slots=True)
class EdgeCase(Attack):
    """Edge-case backdoor with PGD (Wang et al., NeurIPS 2020; see the module docstring).

    * ``source`` (7) → ``target`` (1): the ARDIS task; ``rotation``: quarter turns (1);
    * ``fraction`` of the attacker's ``source`` samples turned into edge cases (1.0),
      ``mode`` ``"append"`` (default: clean samples kept, as the paper mixes edge cases
      with clean data) or ``"replace"``;
    * ``eps``: the PGD radius ‖w − G‖ ≤ ε: ``"defense"`` (default: ``margin`` × the norm
      bound the server's defense enforces, :func:`server_norm_bound`, read afresh every
      round; no projection without one), a number (a fixed ε; 2.0 is the released
      CIFAR-10 script's), or ``"none"`` (never project: the paper's black-box attack;
      ``None`` in Python is the same);
    * ``margin`` ∈ (0, 1]: with ``eps = "defense"``, the share of the bound to project on
      (default 0.99: just inside, so the float32 rounding of the trained delta never
      lands it past a rejecting bound);
    * ``lr``, ``steps``: the attacker's local training (unset: the federation's);
    * ``replacement``: scale the PGD update by n/η afterwards, then project it onto the
      ball of radius ε (the one ``eps`` gives; none: uncapped) (default false).
    """

    source: int = 7
    target: int = 1
    rotation: int = 1
    fraction: float = 1.0
    mode: Literal["append", "replace"] = "append"
    eps: float | Literal["defense", "none"] | None = "defense"
    lr: float | None = None
    steps: int | None = None
    replacement: bool = False
    image_shape: tuple[int, ...] = (8, 8)
    margin: float = 0.99
    summary: ClassVar[str] = "Edge-case backdoor: rare inputs (rotated digits) to a target class, PGD-projected"
    reference: ClassVar[str] = "Wang et al., NeurIPS 2020 (Attack of the Tails)"

    @property
    def surfaces(self) -> tuple[str, ...]:  # type: ignore[override]
        return (Surface.DATA, Surface.TRAINING) + ((Surface.UPDATES,) if self.replacement else ())

    @property
    def adaptive(self) -> bool:
        """White-box (the trainer shows it the defense): to read the bound, or to boost."""
        return self.replacement or self.eps == "defense"

    def validate_margin(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1):
            raise param_error(self, "margin", v, "must be in (0, 1]")

    def radius(self, ctx: AttackContext) -> float | None:
        """The PGD radius ε of this round (``None``: no projection)."""
        if self.eps is None or self.eps == "none":
            return None
        if self.eps == "defense":
            bound = server_norm_bound(ctx.defense, ctx)
            return None if bound is None else float(self.margin) * bound
        return float(self.eps)

    def validate_source(self, v: int) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise param_error(self, "source", v, "must be a class id ≥ 0")

    def validate_target(self, v: int) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0 or v == self.source:
            raise param_error(self, "target", v, f"must be a class id ≥ 0 other than source = {self.source}")

    def validate_rotation(self, v: int) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v % 4 == 0:
            raise param_error(self, "rotation", v, "must be a number of quarter turns not divisible by 4")

    def validate_fraction(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1):
            raise param_error(self, "fraction", v, "must be in (0, 1]")

    def validate_mode(self, v: str) -> None:
        if v not in ("append", "replace"):
            raise param_error(self, "mode", v, "must be 'append' or 'replace'")

    def validate_eps(self, v: Any) -> None:
        _bound_param(self, "eps", v)

    def validate_lr(self, v: float | None) -> None:
        _positive(self, "lr", v)

    def validate_steps(self, v: int | None) -> None:
        _steps(self, v)

    def validate_image_shape(self, v: tuple[int, ...]) -> None:
        if (not isinstance(v, (tuple, list)) or len(v) not in (2, 3)
                or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in v)):
            raise param_error(self, "image_shape", v, "must be (H, W) or (C, H, W) with positive sizes")
        if v[-1] != v[-2] and self.rotation % 2:
            raise param_error(self, "image_shape", v, "an odd number of quarter turns needs square images")

    def edge(self, x: "torch.Tensor") -> "torch.Tensor":
        """The edge-case version of images ``x`` (N, …): rotated by ``rotation`` quarter turns."""
        import torch

        n = x.shape[0]
        per = math.prod(self.image_shape)
        if not x.dtype.is_floating_point or math.prod(x.shape[1:]) != per:
            raise param_error(self, "image_shape", self.image_shape,
                              f"inputs are {x.dtype} with {math.prod(x.shape[1:])} values per sample, "
                              f"expected float images of {per}")
        img = x.reshape(n, *self.image_shape)
        return torch.rot90(img, self.rotation, dims=(-2, -1)).reshape(x.shape)

    def poison_data(self, data: ClientData, client: int, generator: "torch.Generator") -> ClientData:
        import torch

        x, y = data.x, data.y
        eligible = y == self.source
        idx = poison_indices(int(y.shape[0]), self.fraction, generator, eligible).to(x.device)
        if idx.numel() == 0:  # this client holds no sample of the source class
            return data
        ex = self.edge(x[idx])
        ey = torch.full_like(y[idx], self.target)
        if self.mode == "append":
            return ClientData(x=torch.cat([x, ex]), y=torch.cat([y, ey]))
        nx, ny = x.clone(), y.clone()
        nx[idx], ny[idx] = ex, ey
        return ClientData(x=nx, y=ny)

    def targeted_test(self, x: "torch.Tensor", y: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
        """The rotated held-out samples of ``source``, labelled ``target``."""
        import torch

        keep = y == self.source
        return self.edge(x[keep]), torch.full_like(y[keep], self.target)

    def training_hook(self, ctx: AttackContext) -> TrainingHook | None:
        eps = self.radius(ctx)
        proj = ball_projection(eps) if eps is not None else None
        if proj is None and self.lr is None and self.steps is None:
            return None
        return TrainingHook(project=proj, lr=self.lr, steps=self.steps)

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        if not self.replacement:
            return ctx.own_updates.clone()
        # PGD with replacement: the boosted update is projected back onto the PGD ball ‖Δ‖ ≤ ε
        # (with eps = "defense", margin × the server's bound), so that it passes the bound the
        # attack was sized to; no ball (eps = "none", or no bound in the defense): the boost alone
        return _boost(ctx, None, "defense", self.radius(ctx), ctx.own_updates)


#: the default global trigger of ``dba`` on 8×8 digits: four 1×2 bars with gaps (DBA's
#: MNIST layout of four 1×4 bars, scaled to the small image); :func:`dba_default_triggers`
#: gives it for any image size
DBA_PARTS: tuple[tuple[tuple[int, int], ...], ...] = (
    ((0, 0), (0, 1)), ((0, 4), (0, 5)), ((2, 0), (2, 1)), ((2, 4), (2, 5)),
)


def dba_default_triggers(image_shape: tuple[int, ...]) -> tuple[tuple[tuple[int, int], ...], ...]:
    """``dba``'s default local triggers for images of ``image_shape`` ((H, W) or (C, H, W)).

    DBA (Xie et al., ICLR 2020) splits one global pattern — two rows of two horizontal bars in
    the top-left corner — into its four bars, one local trigger each. The layout scales with
    the image: bars of L = max(2, W // 7) pixels, the second bar of a row starting at column
    L + max(2, L // 2), the second row at max(2, H // 8). On 28×28 this is the paper's MNIST
    trigger (1×4 bars at rows 0 and 3, columns 0–3 and 6–9); on 8×8 it is :data:`DBA_PARTS`."""
    h, w = int(image_shape[-2]), int(image_shape[-1])
    length = max(2, w // 7)
    col2 = length + max(2, length // 2)
    row2 = max(2, h // 8)
    return tuple(tuple((r, c0 + i) for i in range(length)) for r in (0, row2) for c0 in (0, col2))


class UntrainedTriggerWarning(UserWarning):
    """``dba`` has fewer attackers than local triggers: some local triggers are never trained."""


@dataclass(frozen=True, slots=True)
class DBA(Attack):
    """Distributed backdoor (Xie et al., ICLR 2020; see the module docstring).

    * ``local_triggers``: each a list of ``[row, col]`` pixels; their union is the global
      trigger. Unset: four bars scaled to ``image_shape`` (:func:`dba_default_triggers`; on
      8×8 digits :data:`DBA_PARTS`, on 28×28 the paper's MNIST layout). :attr:`triggers` is
      the list in use;
    * ``assignment``: ``"rank"`` (default, the paper's attacker i → part i) or
      ``"client_mod"`` (client id mod K), see the module docstring;
    * ``target``, ``fraction``, ``mode``, ``value``, ``image_shape``: as ``backdoor``.
    """

    local_triggers: tuple[tuple[tuple[int, int], ...], ...] | None = None
    target: int = 0
    fraction: float = 0.5
    mode: Literal["replace", "append"] = "replace"
    value: float = 1.0
    image_shape: tuple[int, ...] = (8, 8)
    assignment: Literal["rank", "client_mod"] = "rank"
    _ranks: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    surfaces: ClassVar[tuple[str, ...]] = (Surface.DATA,)
    summary: ClassVar[str] = "DBA: a pixel trigger split across colluding clients, the full trigger at test time"
    reference: ClassVar[str] = "Xie et al., ICLR 2020"

    @property
    def triggers(self) -> tuple[tuple[tuple[int, int], ...], ...]:
        """The local triggers in use: ``local_triggers``, or the default scaled to ``image_shape``."""
        if self.local_triggers is None:
            return dba_default_triggers(tuple(self.image_shape))
        return tuple(tuple(tuple(p) for p in part) for part in self.local_triggers)  # type: ignore[misc]

    def validate_local_triggers(self, v: Any) -> None:
        if v is None:
            return
        if not isinstance(v, (tuple, list)) or len(v) < 2:
            raise param_error(self, "local_triggers", v, "must be a list of at least 2 local triggers")
        for i, part in enumerate(v):
            try:
                self._backdoor(part)
            except Exception as exc:  # noqa: BLE001 - re-raised naming the part
                raise param_error(self, f"local_triggers[{i}]", part, str(exc).split(": ", 1)[-1]) from None

    def validate_fraction(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1):
            raise param_error(self, "fraction", v, "must be in (0, 1]")

    def validate_image_shape(self, v: Any) -> None:
        if self.local_triggers is not None:
            return  # checked with each local trigger
        try:
            for part in self.triggers:
                self._backdoor(part)
        except Exception as exc:  # noqa: BLE001 - re-raised naming the image shape
            raise param_error(self, "image_shape", v, "the default local triggers do not fit: "
                              + str(exc).split(": ", 1)[-1] + " (give local_triggers)") from None

    def _backdoor(self, pixels: Any) -> Backdoor:
        return Backdoor(trigger=tuple(tuple(p) for p in pixels), value=self.value, image_shape=tuple(self.image_shape),
                        target=self.target, fraction=self.fraction, mode=self.mode)

    def validate_assignment(self, v: str) -> None:
        if v not in ("rank", "client_mod"):
            raise param_error(self, "assignment", v, "must be 'rank' or 'client_mod'")

    def part_of(self, client: int) -> int:
        """The local trigger client ``client`` stamps (first sight fixes its rank)."""
        if self.assignment == "client_mod":
            return client % len(self.triggers)
        rank = self._ranks.setdefault(int(client), len(self._ranks))
        return rank % len(self.triggers)

    def untrained_parts(self) -> tuple[int, ...]:
        """The local triggers no client poisoned so far stamps (empty before any poisoning)."""
        if not self._ranks:
            return ()
        used = {self.part_of(c) for c in self._ranks}
        return tuple(i for i in range(len(self.triggers)) if i not in used)

    def global_trigger(self) -> Backdoor:
        pixels = tuple(dict.fromkeys(tuple(p) for part in self.triggers for p in part))
        return self._backdoor(pixels)

    def poison_data(self, data: ClientData, client: int, generator: "torch.Generator") -> ClientData:
        self._ranks.setdefault(int(client), len(self._ranks))  # who was poisoned (rank: first sight)
        return self._backdoor(self.triggers[self.part_of(client)]).poison_data(data, client, generator)

    def targeted_test(self, x: "torch.Tensor", y: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
        """Held-out non-target samples with the **full** trigger, labelled ``target``."""
        return self.global_trigger().targeted_test(x, y)

    def targeted_parts(self, x: "torch.Tensor", y: "torch.Tensor") -> dict[str, tuple["torch.Tensor", "torch.Tensor"]]:
        """The same samples with each local trigger alone: ``{"part0": (x, y), …}``.

        The trainer asks for them after poisoning every malicious client; if some local
        trigger is then stamped by no attacker, an :class:`UntrainedTriggerWarning` says
        which (the paper gives every local trigger its own attacker)."""
        missing = self.untrained_parts()
        if missing:
            k, f = len(self.triggers), len(self._ranks)
            fix = (f"use at least {k} malicious clients or fewer local_triggers" if self.assignment == "rank" else
                   f"with assignment = 'client_mod' the attackers' ids mod {k} must cover every part "
                   "(or use assignment = 'rank')")
            warnings.warn(
                f"dba: {f} attacker(s) for {k} local triggers: local trigger(s) "
                f"{', '.join(map(str, missing))} are stamped by no attacker and never trained, so the "
                f"full-trigger ASR measures a partly trained trigger; DBA (Xie et al., ICLR 2020) gives every "
                f"local trigger its own attacker: {fix}",
                UntrainedTriggerWarning, stacklevel=2)
        return {f"part{i}": self._backdoor(p).targeted_test(x, y) for i, p in enumerate(self.triggers)}
