"""The engine's side of the ``[privacy]`` observers: what each is shown, and how its answer is scored.

A ``Surface.PRIVACY`` attack is passive: it reads, the run goes on unchanged (an observed run and
its no-observer twin train bit for bit alike). Two kinds:

* an **inversion** (``observes = "update"``) sees, in round ``[privacy] observe_round``, one
  client's row as the server receives it (``observe = "row"``: a curious server, an eavesdropper;
  under secure aggregation the masked row) or the update the server applies (``"aggregate"``: what
  anyone who downloads the model sees). Its :class:`~redteam.types.Reconstruction` is matched to
  the samples the client(s) really trained on that round, each reconstruction to a distinct sample
  (the assignment of largest total PSNR, as batch-inversion papers evaluate), and scored:
  ``reconstruction_psnr`` / ``reconstruction_ssim`` (means over the matched pairs) and
  ``label_recovery`` (share of the true labels, as a multiset, it names);
* a **membership inference** (``observes = "model"``) sees the final global model and scores
  ``[privacy] candidates`` members (drawn from the honest clients' training data) and as many
  non-members (held-out samples of the same distribution), shuffled; the rest of the held-out
  split is its population for shadow models, which it trains through the harness: a federation of
  the run's shape (clients, rounds, local procedure, server step) on an IID split of what it is
  given. Scored: ``mia_auc``, ``mia_tpr_at_0.1pct_fpr`` and ``mia_tpr_at_1pct_fpr``.

The truth an inversion is scored against: with ``[federation] sampling = "with_replacement"`` and a
fixed step count, the exact samples each observed client drew that round (the batch draws replayed
from the training stream's state before the round); otherwise its whole local dataset (the
matching then picks the closest samples, which can only flatter the observer; said in the record).

Everything an observer draws comes from the run's ``privacy`` stream, so observing moves no other
stream. The results land in the round's ``RoundRecord.extra["privacy"]`` (the inversion's round)
and the last round's (membership, ε); :func:`redteam.scoring.privacy_metrics` reads them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..errors import RedteamError
from ..types import ModelObservation, Reconstruction, UpdateObservation

if TYPE_CHECKING:
    from ..federation.stages import RoundInputs

__all__ = ["Observers", "batch_truth", "score_reconstruction", "score_membership", "run_epsilon"]


@dataclass
class Observers:
    """The run's observers, built from ``[privacy]`` (``None`` where a kind is absent)."""

    inversion: Any = None
    inversion_name: str = ""
    membership: Any = None
    membership_name: str = ""

    @classmethod
    def of(cls, spec: Any) -> "Observers":
        from ..registry import ATTACKS

        out = cls()
        for o in getattr(spec, "observers", ()) or ():
            plugin = ATTACKS.create(o.name, dict(o.params))
            if plugin.observes == "update":
                out.inversion, out.inversion_name = plugin, o.name
            elif plugin.observes == "model":
                out.membership, out.membership_name = plugin, o.name
        return out


def batch_truth(fed: Any, rin: "RoundInputs", clients: list[int], train_state: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """The samples ``clients`` trained on in the round ``rin`` (inputs, labels, exact): their
    batch draws replayed from the training stream's state ``train_state`` before the round, or
    (``exact = False``) their whole local data where the draws cannot be replayed."""
    from ..federation.training import batch_positions, batch_uniforms

    cfg = fed.local
    data = rin.data
    part = [int(c) for c in rin.part.tolist()]
    replayable = (train_state is not None and cfg.sampling == "with_replacement" and cfg.epochs is None
                  and fed.network.config.stragglers != "partial")
    xs, ys = [], []
    if replayable:
        gen = torch.Generator(device="cpu")
        gen.set_state(train_state)
        sizes = data.sizes.cpu()[torch.as_tensor(part, dtype=torch.long)]
        draws = [batch_positions(batch_uniforms(gen, len(part), cfg.batch_size), sizes) for _ in range(cfg.steps)]
        pos = torch.cat(draws, dim=1)  # (m, steps · B)
        for c in clients:
            k = part.index(c)
            own = data.client(c)
            idx = torch.unique(pos[k])
            xs.append(own.x[idx.to(own.x.device)])
            ys.append(own.y[idx.to(own.y.device)])
    else:
        for c in clients:
            own = data.client(c)
            xs.append(own.x)
            ys.append(own.y)
    return torch.cat(xs), torch.cat(ys), replayable


def invert(fed: Any, observer: Any, rin: "RoundInputs", observed: torch.Tensor, clients: list[int],
           train_state: torch.Tensor | None, generator: torch.Generator) -> dict[str, Any]:
    """Ask the inversion for its reconstruction of ``observed`` (the row or aggregate it saw) and
    score it against what ``clients`` trained on; the record's ``extra["privacy"]["inversion"]``."""
    from ..federation.stages import model_view

    tx, ty, exact = batch_truth(fed, rin, clients, train_state)
    cfg = fed.local
    b = int(tx.shape[0]) if not exact else min(int(tx.shape[0]), cfg.batch_size * len(clients))
    obs = UpdateObservation(update=observed.detach().clone(), params=rin.params.detach().clone(),
                            model=model_view(fed), lr=float(cfg.lr), local_steps=int(cfg.steps),
                            batch_size=int(cfg.batch_size), num_samples=b, generator=generator)
    rec = observer.reconstruct(obs)
    if not isinstance(rec, Reconstruction):
        raise RedteamError(f"privacy observer {type(observer).__name__}: reconstruct returned "
                           f"{type(rec).__name__}, expected a redteam.types.Reconstruction")
    lo, hi = float(fed.test_x.min()), float(fed.test_x.max())
    shape = tuple(getattr(fed.setup.workload, "image_shape", None) or ()) or None
    out = score_reconstruction(rec, tx, ty, data_range=max(hi - lo, 1e-12), image_shape=shape, value_range=(lo, hi))
    out.update({"clients": [int(c) for c in clients], "samples": int(tx.shape[0]), "exact_truth": bool(exact)})
    return out


def score_reconstruction(rec: Reconstruction, truth_x: torch.Tensor, truth_y: torch.Tensor, *,
                         data_range: float, image_shape: tuple[int, ...] | None = None,
                         value_range: tuple[float, float] | None = None) -> dict[str, Any]:
    """PSNR / SSIM of each reconstruction against the true sample it is matched to (a distinct one
    each, largest total PSNR), their means, and the label recovery rate."""
    from .reconstruction import label_recovery, match, ssim

    images = rec.images.detach().to(torch.float32).cpu().reshape(-1, *truth_x.shape[1:])
    truth = truth_x.detach().to(torch.float32).cpu()
    if not bool(torch.isfinite(images).all()):
        images = torch.nan_to_num(images, nan=0.0, posinf=0.0, neginf=0.0)
    if value_range is not None:  # an attacker knows the pixels' range: what it would show is clamped to it
        images = images.clamp(value_range[0], value_range[1])
    pairs = match(images, truth, data_range=data_range)
    p = pairs.psnr
    s = ssim(images[pairs.recon], truth[pairs.truth], data_range=data_range, image_shape=image_shape)
    labels = rec.labels.detach().to(torch.int64).cpu().reshape(-1)
    p = torch.clamp(p, max=100.0)  # an exact copy's PSNR is infinite: 100 dB stands for it in the mean
    return {"psnr": float(p.mean()), "ssim": float(s.mean()),
            "label_recovery": float(label_recovery(labels, truth_y.detach().to(torch.int64).cpu())),
            "reconstructed": int(images.shape[0])}


def membership(fed: Any, observer: Any, params: torch.Tensor, candidates: int, generator: torch.Generator,
               rng: np.random.Generator) -> dict[str, Any]:
    """Ask the membership observer to score members and non-members of the final model ``params``."""
    from ..federation.stages import model_view

    su = fed.setup
    part = su.partition
    honest = [c for c in range(len(part.clean)) if not bool(su.is_malicious[c])]
    mx = torch.cat([part.clean[c].x for c in honest])
    my = torch.cat([part.clean[c].y for c in honest])
    hx, hy = su.dataset.test_x, su.dataset.test_y
    k = min(int(candidates), int(mx.shape[0]), int(hx.shape[0]) // 2)
    if k < 2:
        raise RedteamError(f"[privacy] candidates: {candidates} asked, but the members ({mx.shape[0]}) or half the "
                           f"held-out split ({hx.shape[0] // 2}) leave fewer than 2 of each")
    mi = torch.as_tensor(rng.choice(int(mx.shape[0]), size=k, replace=False), dtype=torch.long)
    perm = torch.as_tensor(rng.permutation(int(hx.shape[0])), dtype=torch.long)
    ni, pop = perm[:k], perm[k:]
    cx = torch.cat([mx[mi].cpu(), hx[ni].cpu()])
    cy = torch.cat([my[mi].cpu(), hy[ni].cpu()])
    truth = torch.cat([torch.ones(k, dtype=torch.bool), torch.zeros(k, dtype=torch.bool)])
    order = torch.as_tensor(rng.permutation(2 * k), dtype=torch.long)
    cx, cy, truth = cx[order], cy[order], truth[order]
    dev = fed.device
    train_size = int(sum(int(part.clean[c].y.shape[0]) for c in honest))
    obs = ModelObservation(params=params.detach().clone(), model=model_view(fed), candidates_x=cx.to(dev),
                           candidates_y=cy.to(dev), population_x=hx[pop].to(dev), population_y=hy[pop].to(dev),
                           train=shadow_trainer(fed), train_size=train_size, generator=generator)
    scores = torch.as_tensor(observer.membership_scores(obs)).detach().to(torch.float64).cpu().reshape(-1)
    if scores.shape[0] != 2 * k:
        raise RedteamError(f"privacy observer {type(observer).__name__}: membership_scores returned "
                           f"{scores.shape[0]} scores for {2 * k} candidates")
    out = score_membership(scores, truth)
    out.update({"candidates": 2 * k, "population": int(pop.shape[0])})
    return out


def score_membership(scores: torch.Tensor, is_member: torch.Tensor) -> dict[str, Any]:
    """AUC and TPR at 0.1 % and 1 % FPR of membership scores (higher = member)."""
    from .membership import roc_auc, tpr_at_fpr

    s = torch.nan_to_num(scores.to(torch.float64), nan=-math.inf)
    return {"auc": float(roc_auc(s, is_member)), "tpr_at_0.1pct_fpr": float(tpr_at_fpr(s, is_member, 0.001)),
            "tpr_at_1pct_fpr": float(tpr_at_fpr(s, is_member, 0.01))}


def shadow_trainer(fed: Any) -> Any:
    """``ModelObservation.train``: a federation of the run's shape (its N clients, K per round,
    rounds, local procedure, server learning rate, plain averaging) on an IID split of ``(x, y)``,
    from a fresh initialisation drawn from ``generator``; all clients trained in one batched call."""
    from ..federation.training import StackedData
    from ..types import ClientData

    su = fed.setup
    sc = su.scenario.federation
    n, rounds = int(sc.clients), int(sc.rounds)
    k = int(sc.clients_per_round or n)
    lr = float(fed.server_lr)
    cfg = su.local
    if cfg.optimizer != "sgd" or cfg.sampling != "with_replacement":
        import dataclasses

        cfg = dataclasses.replace(cfg, optimizer="sgd", sampling="with_replacement")

    def train(x: torch.Tensor, y: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        m = int(x.shape[0])
        if m < n:
            raise RedteamError(f"shadow model: {m} samples cannot be dealt to the run's {n} clients")
        perm = torch.randperm(m, generator=generator)
        parts = [perm[i::n] for i in range(n)]
        data = StackedData.stack([ClientData(x[p.to(x.device)], y[p.to(y.device)]) for p in parts]).to(fed.device)
        model = su.workload.build_model(generator)
        params = su.spec.flatten(model).to(fed.device)
        for _ in range(rounds):
            chosen = torch.randperm(n, generator=generator)[:k].sort().values.to(fed.device)
            local = su.trainer.train(params, data, chosen, cfg, generator)
            params = params + lr * (local - params).mean(dim=0)
        return params

    return train


def run_epsilon(fed: Any, delta: float) -> dict[str, Any] | None:
    """ε at ``delta`` of the defense stages that ``accounts_privacy`` (the largest, when several)."""
    from .accountant import epsilon

    sc = fed.scenario.federation
    n = int(sc.clients)
    k = int(sc.clients_per_round or n)
    best: dict[str, Any] | None = None
    for st in fed.defense.parts():
        if not st.accounts_privacy:
            continue
        mech = st.dp_mechanism(n, k, int(sc.rounds))
        if mech is None:
            continue
        eps = epsilon(mech, delta)
        if best is None or eps > best["_eps"]:
            best = {"_eps": eps, "epsilon": eps if math.isfinite(eps) else None, "delta": delta, "mechanism": type(st).__name__,
                    "noise_multiplier": float(mech.noise_multiplier), "population": n, "per_round": k,
                    "rounds": int(sc.rounds), "sampling": mech.sampling, "accountant": "dp-accounting RDP"}
    if best is not None:
        if best.pop("_eps") == math.inf:
            best["note"] = "no noise (noise_multiplier = 0): ε is infinite"
    cfg = fed.local
    if cfg.dp_clip is not None:  # DP-SGD on the clients: example-level, the smallest client's
        from .accountant import ExampleLevelDP

        sizes = fed.setup.partition.data.sizes
        n_min = int(sizes[sizes > 0].min()) if bool((sizes > 0).any()) else 1
        mech_e = ExampleLevelDP(cfg.dp_noise_multiplier, cfg.batch_size / n_min, int(sc.rounds) * int(cfg.steps))
        eps_e = epsilon(mech_e, delta)
        best = dict(best or {})
        best["example_epsilon"] = eps_e if math.isfinite(eps_e) else None
        best["dp_sgd"] = {"clip": cfg.dp_clip, "noise_multiplier": cfg.dp_noise_multiplier,
                          "sample_rate": min(1.0, cfg.batch_size / n_min), "steps": mech_e.steps}
    return best
