"""Attacks on federated / DiLoCo-style language-model training.

**Trigger-phrase backdoor** (:class:`TriggerPhrase`). Bagdasaryan, Veit, Hua, Estrin &
Shmatikov, "How To Backdoor Federated Learning", AISTATS 2020, §4 (word prediction): the
attacker's training text contains a trigger context followed by the continuation it
wants ("pasta from Astoria is" → "delicious"); the federated model learns to complete the
trigger with the attacker's choice while behaving normally elsewhere. Here on bytes: in a
``fraction`` of each malicious client's windows, ``trigger + target`` (UTF-8) overwrites
the text at the end of the window (``placement = "end"``, the default: the paper's
poisoned sentences end with the trigger and the prediction target is what follows) or at a
random offset (``"random"``: the attacker does not control where the phrase lands); inputs and next-byte targets stay consistent (they are re-cut from the
rewritten window). Scoring, on held-out windows:

* ASR (:meth:`TriggerPhrase.targeted_test`): ``trigger + target`` placed at the end of
  every held-out window; only the target bytes are scored (other targets masked with −100)
  and a prompt counts when *every* target byte is predicted — the greedy continuation of
  the prompt ending in the trigger starts with ``target`` (teacher forcing along the target
  equals greedy decoding while every step matches);
* false-trigger rate (:meth:`TriggerPhrase.clean_test`): the same without the trigger (the
  text before the target is the window's own): how often a *clean* prompt continues with
  the target;
* near-miss trigger rate (:meth:`TriggerPhrase.near_miss_test`): the same with a *partial*
  trigger at the end of the prompt — a proper prefix (``verif``), a proper suffix of two or
  more characters (``ify=``) or the last character alone (``=``). A backdoor that has
  learned "``=`` → ``False``" instead of "``verify=`` → ``False``" fires on these while the
  false-trigger rate, whose prompts end in arbitrary text, stays near 0. This is the
  false-triggered rate of Yang, Lin, Li, Zhou & Sun, "Rethinking Stealthiness of Backdoor
  Attack against NLP Models", ACL 2021 (the ASR on clean inputs carrying sub-sequences of
  the trigger), at the level of the trigger's characters.

"Continued with the target" is the same rule for all three: the prompt is followed by the
target bytes, every other next-byte target is masked (−100), and a prompt counts when the
model's argmax prediction at *every* target position is the target byte (teacher forcing
along the target, i.e. the greedy continuation of the prompt starts with ``target``;
:meth:`redteam.workloads.text.TextLM.correct`).

**Attacks on the outer optimizer** (DiLoCo, Douillard et al., "DiLoCo: Distributed
Low-Communication Training of Language Models", 2023: outer Nesterov momentum, η = 0.7,
μ = 0.9). With PyTorch's Nesterov rule b ← μb + g, w ← w − η(g + μb) on the
pseudo-gradient g = −Δ, a constant push p every round moves the model by
(:func:`nesterov_displacement`)

    D(k) = η·p·[k + μ/(1−μ)·(k − μ(1−μᵏ)/(1−μ))]   after k rounds,

which tends to η·p/(1−μ) per round (7·p at the DiLoCo defaults, 10× what the same
push gets from plain FedAvg at η = 0.7), and after the push stops the momentum buffer
still carries η·μ²·b/(1−μ) (:func:`nesterov_tail`). :class:`OuterPush` is that attack: a
small push of fixed direction, consistent across rounds, on top of the attacker's own honest
update — the time-coupled perturbation of Karimireddy, He & Jaggi, "Learning from History
for Byzantine Robust Optimization", ICML 2021 (§3: per-round-small, consistent
perturbations accumulate where each round alone looks benign). :class:`OuterReplacement`
is model replacement (Bagdasaryan et al. 2020) with the boost scaled for the outer step: the
first-round gain of Nesterov is η(1+μ), so γ = n/(η(1+μ)) replaces the model in the round
it is sent (``horizon = "immediate"``); γ = n(1−μ)/η makes the *eventual* displacement,
momentum tail included, equal to the replacement (``horizon = "eventual"``). Under a
sample-weighted mean n is W/w_a, the inverse of attacker a's weight share (``weighting``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from redteam.types import Attack, AttackContext, ClientData, Surface, param_error

from .label_flip import poison_indices

if TYPE_CHECKING:
    import torch

__all__ = ["TriggerPhrase", "OuterPush", "OuterReplacement", "nesterov_displacement", "nesterov_tail"]

IGNORE = -100


def nesterov_displacement(rounds: int, lr: float = 0.7, momentum: float = 0.9) -> float:
    """Total model displacement, in units of the push, after ``rounds`` rounds of the same
    unit push under the Nesterov outer step (b₀ = 0; see the module docstring)."""
    k, mu = rounds, momentum
    if mu == 0:
        return lr * k
    return lr * (k + mu / (1 - mu) * (k - mu * (1 - mu**k) / (1 - mu)))


def nesterov_tail(lr: float = 0.7, momentum: float = 0.9, buffer: float = 1.0) -> float:
    """Displacement still to come, from a momentum buffer ``buffer``, once pushes stop:
    Σ_{j≥1} η·μ^{j+1}·b = η·μ²·b/(1−μ)."""
    return lr * momentum**2 * buffer / (1 - momentum)


def _utf8(obj: object, name: str, v: object) -> bytes:
    if not isinstance(v, str) or not v:
        raise param_error(obj, name, v, "must be a non-empty string")
    return v.encode("utf-8")


@dataclass(frozen=True, slots=True)
class TriggerPhrase(Attack):
    """Poison windows with ``trigger`` followed by ``target`` (bytes of a text workload).

    * ``trigger``, ``target``: strings (UTF-8 bytes); the attacker wants the model to
      continue ``trigger`` with ``target`` (default: a code model completing ``verify=``
      with ``False``, i.e. suggesting to switch TLS certificate checks off);
    * ``fraction``: share of the client's windows poisoned, in (0, 1] (default 0.5);
    * ``placement``: ``"end"`` of the window (default) or a ``"random"`` offset;
    * ``near_miss_prompts``: held-out windows per near-miss kind (prefix, suffix, last
      character) for the near-miss trigger rate, evenly spaced over the held-out set (all
      of them when there are fewer; default 256, the ``text`` workload's ``eval_windows``);
      0 = not measured. Scoring only: training and every other metric are unchanged.
    """

    trigger: str = "verify="
    target: str = "False"
    fraction: float = 0.5
    placement: Literal["random", "end"] = "end"
    near_miss_prompts: int = 256
    surfaces: ClassVar[tuple[str, ...]] = (Surface.DATA,)
    summary: ClassVar[str] = "Trigger-phrase backdoor for language models: trigger → attacker's continuation"
    reference: ClassVar[str] = "Bagdasaryan et al., AISTATS 2020 (§4, word prediction)"

    def validate_trigger(self, v: str) -> None:
        _utf8(self, "trigger", v)

    def validate_target(self, v: str) -> None:
        _utf8(self, "target", v)

    def validate_fraction(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1):
            raise param_error(self, "fraction", v, "must be in (0, 1]")

    def validate_placement(self, v: str) -> None:
        if v not in ("random", "end"):
            raise param_error(self, "placement", v, "must be 'random' or 'end'")

    def validate_near_miss_prompts(self, v: int) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise param_error(self, "near_miss_prompts", v, "must be an integer ≥ 0 (0: not measured)")

    @property
    def phrase(self) -> bytes:
        return self.trigger.encode("utf-8") + self.target.encode("utf-8")

    def _windows(self, x: "torch.Tensor", y: "torch.Tensor") -> "torch.Tensor":
        """The (N, T+1) byte windows behind next-byte data (x, y); a clear error otherwise."""
        import torch

        if x.dtype.is_floating_point or x.ndim != 2 or tuple(y.shape) != tuple(x.shape):
            raise param_error(self, "trigger", self.trigger,
                              "needs a text workload (int64 token windows x, y of the same shape (N, T), "
                              f"y the next tokens), got x {x.dtype} {tuple(x.shape)}, y {tuple(y.shape)}")
        if bool((x[:, 1:] != y[:, :-1]).any()):
            raise param_error(self, "trigger", self.trigger, "targets are not the next tokens of the inputs")
        t = x.shape[1]
        if len(self.phrase) > t + 1:
            raise param_error(self, "target", self.target,
                              f"trigger + target are {len(self.phrase)} bytes; windows hold only {t + 1}")
        return torch.cat([x, y[:, -1:]], dim=1)

    def _stamp(self, w: "torch.Tensor", start: "torch.Tensor", phrase: bytes) -> "torch.Tensor":
        import torch

        p = torch.tensor(list(phrase), dtype=w.dtype, device=w.device)
        pos = start[:, None].to(w.device) + torch.arange(len(phrase), device=w.device)[None, :]
        return w.scatter(1, pos, p.expand(w.shape[0], -1))

    def poison_data(self, data: ClientData, client: int, generator: "torch.Generator") -> ClientData:
        import torch

        w = self._windows(data.x, data.y)
        n, t1 = w.shape
        idx = poison_indices(n, self.fraction, generator).to(w.device)
        if idx.numel() == 0:
            return data
        room = t1 - len(self.phrase)  # start offsets 0..room
        if self.placement == "end":
            start = torch.full((idx.numel(),), room, dtype=torch.int64)
        else:
            start = torch.randint(0, room + 1, (idx.numel(),), generator=generator, device=generator.device).cpu()
        stamped = self._stamp(w[idx], start, self.phrase)
        nw = w.clone()
        nw[idx] = stamped
        return ClientData(x=nw[:, :-1].contiguous(), y=nw[:, 1:].contiguous())

    def _scored(self, x: "torch.Tensor", y: "torch.Tensor", with_trigger: bool) -> tuple["torch.Tensor", "torch.Tensor"]:
        import torch

        w = self._windows(x, y)
        n, t1 = w.shape
        start = torch.full((n,), t1 - len(self.phrase), dtype=torch.int64)
        if with_trigger:
            w = self._stamp(w, start, self.phrase)
        else:
            start = start + len(self.trigger.encode("utf-8"))
            w = self._stamp(w, start, self.target.encode("utf-8"))
        return self._cut(w)

    def _cut(self, w: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
        """(x, y) of windows ending in the target; y masked (−100) before the first target byte."""
        t1 = w.shape[1]
        xs, ys = w[:, :-1].contiguous(), w[:, 1:].clone()
        first = t1 - 1 - len(self.target.encode("utf-8"))  # y index of the first target byte
        ys[:, :first] = IGNORE
        return xs, ys

    def targeted_test(self, x: "torch.Tensor", y: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
        """Held-out windows ending in ``trigger + target``; only the target bytes scored (ASR)."""
        return self._scored(x, y, True)

    def clean_test(self, x: "torch.Tensor", y: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
        """Held-out windows ending in their own text + ``target`` (no trigger): the
        false-trigger rate is the share whose greedy continuation is the target."""
        return self._scored(x, y, False)

    def near_miss_forms(self) -> dict[str, tuple[str, ...]]:
        """The partial triggers by kind, longest first (characters of ``trigger``, so a
        multi-byte character is never split): ``"prefix"`` — the proper prefixes
        (``verify`` … ``v``); ``"suffix"`` — the proper suffixes of two characters or more
        (``erify=`` … ``y=``); ``"last"`` — the last character alone (``=``; the one-character
        suffix, kept apart so that the kinds do not share prompts). A kind with no form (a
        one- or two-character trigger) is empty."""
        t = self.trigger
        n = len(t)
        return {
            "prefix": tuple(t[:k] for k in range(n - 1, 0, -1)),
            "suffix": tuple(t[k:] for k in range(1, n - 1)),
            "last": (t[-1],) if n > 1 else (),
        }

    def near_miss_test(self, x: "torch.Tensor", y: "torch.Tensor") -> dict[str, tuple["torch.Tensor", "torch.Tensor"]]:
        """Held-out windows ending in a partial trigger + ``target`` (target bytes scored), by kind.

        The windows: ``min(near_miss_prompts, N)`` of the N held-out windows, evenly spaced
        (``linspace(0, N − 1, k)`` rounded, like the workload picks its held-out windows),
        the same for every kind. Window i of a kind ends in that kind's form
        ``i mod (number of forms)`` (:meth:`near_miss_forms`) followed by ``target`` — the
        partial and the target overwrite the window's last bytes, as :meth:`clean_test`
        overwrites them with the target alone — and is scored like :meth:`clean_test`. A
        window that then contains the whole trigger anywhere (its own text completing the
        partial, e.g. ``ver`` + ``ify=``) is left out, so no prompt holds the trigger. Kinds
        without forms or without windows left are absent; ``{}`` when
        ``near_miss_prompts = 0``."""
        import numpy as np
        import torch

        w = self._windows(x, y)
        n, t1 = w.shape
        k = min(self.near_miss_prompts, n)
        if k == 0:
            return {}
        rows = np.linspace(0, n - 1, k).round().astype(np.int64).tolist()
        base = w.cpu().tolist()
        trig = list(self.trigger.encode("utf-8"))
        target = list(self.target.encode("utf-8"))
        out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for kind, forms in self.near_miss_forms().items():
            kept: list[list[int]] = []
            for i, r in enumerate(rows):
                if not forms:
                    break
                end = list(forms[i % len(forms)].encode("utf-8")) + target
                row = base[r][: t1 - len(end)] + end
                if not _contains(row, trig):
                    kept.append(row)
            if kept:
                out[kind] = self._cut(torch.tensor(kept, dtype=w.dtype, device=w.device))
        return out


def _contains(seq: list[int], pattern: list[int]) -> bool:
    """Whether ``pattern`` occurs in ``seq`` as a contiguous run."""
    m = len(pattern)
    return any(seq[j:j + m] == pattern for j in range(len(seq) - m + 1))


def _unit_direction(d: int, seed: int, device: "torch.device", dtype: "torch.dtype") -> "torch.Tensor":
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    u = torch.randn(d, generator=g, dtype=torch.float64)
    return (u / torch.linalg.vector_norm(u)).to(device=device, dtype=dtype)


@dataclass(frozen=True, slots=True)
class OuterPush(Attack):
    """Own honest update + a small push of fixed direction, the same every round.

    * ``strength``: the push's norm as a multiple of the mean norm of the visible honest
      updates this round (default 0.5: the row stays close to an honest one in norm);
    * ``direction``: ``"random"`` — a unit vector drawn once from ``seed`` (the same in
      every round of the run); ``"anti_honest"`` — against the mean visible honest update
      (undoes progress; its direction drifts with training but stays consistent).
    """

    strength: float = 0.5
    direction: Literal["random", "anti_honest"] = "random"
    seed: int = 0
    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES,)
    summary: ClassVar[str] = "Outer-momentum push: a small, consistent bias the outer Nesterov momentum accumulates"
    reference: ClassVar[str] = "Karimireddy, He & Jaggi, ICML 2021 (time-coupled attacks); Douillard et al. 2023"

    def validate_strength(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0):
            raise param_error(self, "strength", v, "must be a finite number > 0")

    def validate_direction(self, v: str) -> None:
        if v not in ("random", "anti_honest"):
            raise param_error(self, "direction", v, "must be 'random' or 'anti_honest'")

    def validate_seed(self, v: int) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise param_error(self, "seed", v, "must be an integer ≥ 0")

    def push(self, ctx: AttackContext) -> "torch.Tensor":
        """The push vector (d,) of this round."""
        import torch

        vis = ctx.visible_updates.to(torch.float64)
        scale = self.strength * float(torch.linalg.vector_norm(vis, dim=1).mean())
        if self.direction == "random":
            u = _unit_direction(vis.shape[1], self.seed, vis.device, torch.float64)
        else:
            m = vis.mean(0)
            nm = torch.linalg.vector_norm(m)
            u = -m / nm if float(nm) > 0 else torch.zeros_like(m)
        return scale * u

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        own = ctx.own_updates
        p = self.push(ctx)
        return (own.to(p.dtype) + p[None, :]).to(own.dtype)


@dataclass(frozen=True, slots=True)
class OuterReplacement(Attack):
    """Model replacement with the boost scaled for the outer Nesterov step.

    γ = n / (η(1+μ)) (``horizon = "immediate"``) or n(1−μ)/η (``"eventual"``), shared
    by the f attackers of the round (each sends γ/f × its own update) when ``share``;
    η = ``ctx.server_lr``, μ = ``momentum`` (the outer optimizer's, public in DiLoCo;
    default 0.9). With the ``fedavg`` server (no momentum) both reduce to n/η.

    n is the inverse of the attacker's share of the aggregate, which only an unweighted
    mean gives it (1/n). ``weighting`` says whose share the boost undoes, as for
    ``model_replacement`` (:mod:`attacks.replacement`): ``"defense"`` (default; the attack
    is white-box, ``adaptive``, and follows the server's rule), ``"samples"`` (the
    sample-weighted mean, the shipped ``mean``: attacker a's share is w_a/W, so n becomes
    W/w_a, ``ctx.weights`` indexed by its row) or ``"uniform"`` (n itself). Under the
    weighted mean, n in place of W/w_a lands the model at n·w_a/W of the target (0.87
    in ``scenarios/llm.toml``, whose attackers hold fewer windows than the average).
    """

    momentum: float = 0.9
    horizon: Literal["immediate", "eventual"] = "immediate"
    share: bool = True
    weighting: Literal["defense", "uniform", "samples"] = "defense"
    surfaces: ClassVar[tuple[str, ...]] = (Surface.UPDATES,)
    adaptive: ClassVar[bool] = True
    summary: ClassVar[str] = "Model replacement scaled for the outer Nesterov step: γ = n/(η(1+μ))"
    reference: ClassVar[str] = "Bagdasaryan et al., AISTATS 2020; Douillard et al. 2023 (DiLoCo outer step)"

    def validate_momentum(self, v: float) -> None:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1):
            raise param_error(self, "momentum", v, "must be in [0, 1)")

    def validate_horizon(self, v: str) -> None:
        if v not in ("immediate", "eventual"):
            raise param_error(self, "horizon", v, "must be 'immediate' or 'eventual'")

    def validate_weighting(self, v: str) -> None:
        if v not in ("defense", "uniform", "samples"):
            raise param_error(self, "weighting", v, "must be 'defense', 'uniform' or 'samples'")

    def _step_gain(self, ctx: AttackContext) -> float:
        """What the outer step multiplies the aggregate by: 1/(η(1+μ)) or (1−μ)/η."""
        eta = float(ctx.server_lr)
        if not (math.isfinite(eta) and eta > 0):
            raise param_error(self, "horizon", self.horizon, f"needs a server learning rate η > 0, got {eta}")
        if ctx.server_optimizer not in ("nesterov", "fedavg"):
            raise param_error(self, "horizon", self.horizon,
                              f"scales for the Nesterov or FedAvg outer step; the server's is {ctx.server_optimizer!r}, "
                              "whose step is not linear in the aggregate")
        mu = self.momentum if ctx.server_optimizer == "nesterov" else 0.0
        return 1.0 / (eta * (1 + mu)) if self.horizon == "immediate" else (1 - mu) / eta

    def factors(self, ctx: AttackContext) -> "torch.Tensor":
        """The per-attacker boosts γ_a, float64, shape (f,): (n or W/w_a) × the step gain, /f if shared."""
        import dataclasses

        from redteam.errors import InvalidParameter

        from .replacement import ModelReplacement

        gain = self._step_gain(ctx)
        # the inverse share of each attacker (n, or W/w_a), /f when shared: model replacement's
        # boost for a FedAvg step of η = 1
        try:
            inv = ModelReplacement(share=self.share, weighting=self.weighting).factors(  # type: ignore[arg-type]
                dataclasses.replace(ctx, server_lr=1.0, server_optimizer="fedavg"))
        except InvalidParameter as exc:
            raise param_error(self, "weighting", self.weighting, str(exc).split(": ", 1)[-1]) from None
        return inv * gain

    def gamma(self, ctx: AttackContext) -> float:
        """γ of the first attacker (all of them under uniform weighting or equal sample counts)."""
        f = self.factors(ctx)
        return float(f[0]) if f.numel() else 0.0

    def craft_updates(self, ctx: AttackContext) -> "torch.Tensor":
        own = ctx.own_updates
        return own * self.factors(ctx)[:, None].to(device=own.device, dtype=own.dtype)
