"""Gradient inversion on ``digits``: how well ``dlg``, ``idlg`` and ``inverting_gradients`` rebuild
a client's samples from its update, and what one reconstruction costs.

    python benchmarks/bench_inversion.py                        # 5 seeds, B = 1, one SGD step, IG at 24,000 its
    python benchmarks/bench_inversion.py --ig-iterations 500    # a cheaper Inverting Gradients
    python benchmarks/bench_inversion.py --batch 4 --steps 1    # a batch of 4 (labels: Yin et al.'s rule)
    python benchmarks/bench_inversion.py --steps 5              # a 5-step FedAvg update (g ≈ −Δ / (η·K))
    python benchmarks/bench_inversion.py --noise 10             # Gaussian noise of 10× the update's norm

The victim: the digits workload's MLP (64-64-10, unstandardised pixels in [0, 1]) at its seeded
initialisation (seed s), one client holding ``--batch`` training images (from index 7·s) that runs
``--steps`` local SGD steps of lr 0.1 on batches of ``--batch`` (the federation's defaults
otherwise), as the engine's own trainer does. The observer sees that update (plus, with
``--noise r``, Gaussian noise of total norm about r·‖update‖: per entry σ = r·‖update‖ / √d) and
reconstructs with the attack's defaults. Each reconstruction is scored after clamping to [0, 1]
(the pixel range) by PSNR / SSIM (:mod:`redteam.privacy.reconstruction`, matched to the true
samples by :func:`~redteam.privacy.reconstruction.match`) and label recovery. Each line is one
run (JSON); the summary gives the mean with a 95 % Student-t interval over seeds and the median
wall seconds per reconstruction (one process, this machine's CPU, shared with whatever else runs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from attacks.inversion import DLG, IDLG, InvertingGradients
from redteam.federation.params import ParamSpec
from redteam.federation.training import BatchedTrainer, LocalTraining, StackedData
from redteam.privacy import label_recovery, match, ssim
from redteam.scoring import mean_ci
from redteam.types import ClientData, UpdateObservation
from redteam.workloads.digits import Digits

from _timing import cpu_name

LR = 0.1


def observation(seed: int, batch: int, steps: int, noise: float) -> tuple[UpdateObservation, torch.Tensor, torch.Tensor]:
    """The observer's view of one client's update, and the client's true samples and labels."""
    wl = Digits()
    data = wl.load(0)
    model = wl.build_model(torch.Generator().manual_seed(seed))
    spec = ParamSpec.of(model)
    trainer = BatchedTrainer(wl, model, spec)
    params = spec.flatten(model).detach()
    x, y = data.train_x[7 * seed:7 * seed + batch], data.train_y[7 * seed:7 * seed + batch]
    local = trainer.train(params, StackedData.stack([ClientData(x, y)]), torch.tensor([0]),
                          LocalTraining(steps=steps, batch_size=batch, lr=LR), torch.Generator().manual_seed(seed))
    update = local[0] - params
    if noise > 0:
        g = torch.Generator().manual_seed(10_000 + seed)
        sigma = noise * float(update.norm()) / update.numel() ** 0.5
        update = update + sigma * torch.randn(update.shape, generator=g)
    obs = UpdateObservation(update=update, params=params, model=trainer.view(data.num_classes, tuple(x.shape[1:])),
                            lr=LR, local_steps=steps, batch_size=batch, num_samples=batch,
                            generator=torch.Generator().manual_seed(100 + seed))
    return obs, x, y


def attacks(ig_iterations: int) -> dict[str, object]:
    return {"dlg": DLG(), "idlg": IDLG(), "inverting_gradients": InvertingGradients(max_iterations=ig_iterations)}


#: the values each score can take (the intervals are clamped to them)
BOUNDS = {"psnr": (None, None), "ssim": (-1.0, 1.0), "labels": (0.0, 1.0)}


def summarize(rows: dict[str, list[dict]]) -> list[str]:
    """One line per attack: each score's mean [95 % Student-t interval] over seeds, how many runs
    reached 30 dB, the median seconds per reconstruction."""
    out = []
    for name, rs in rows.items():
        parts = []
        for key, bounds in BOUNDS.items():
            ci = mean_ci([r[key] for r in rs], bounds=bounds)
            parts.append(f"{key} {ci['mean']:.3f} [{ci['lo']:.3f}, {ci['hi']:.3f}]")
        above = sum(r["psnr"] >= 30 for r in rs)
        secs = statistics.median(r["seconds"] for r in rs)
        out.append(f"{name:20s} " + ", ".join(parts) + f"; PSNR ≥ 30 dB in {above}/{len(rs)}; {secs:.2f} s per reconstruction")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--noise", type=float, default=0.0)
    ap.add_argument("--ig-iterations", type=int, default=24_000)
    ap.add_argument("--attacks", nargs="+", default=["dlg", "idlg", "inverting_gradients"])
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"# {cpu_name()}, torch {torch.__version__}, 1 thread")
    rows: dict[str, list[dict]] = {}
    for seed in range(args.seeds):
        obs, x, y = observation(seed, args.batch, args.steps, args.noise)
        for name in args.attacks:
            atk = attacks(args.ig_iterations)[name]
            t = time.perf_counter()
            rec = atk.reconstruct(obs)
            secs = time.perf_counter() - t
            images = torch.nan_to_num(rec.images, nan=0.5).clamp(0, 1)
            m = match(images, x, 1.0)
            row = {"attack": name, "seed": seed, "psnr": round(m.mean_psnr(), 2),
                   "ssim": round(float(ssim(images[m.recon], x[m.truth], 1.0, image_shape=(8, 8)).mean()), 4),
                   "labels": round(label_recovery(rec.labels, y), 3), "seconds": round(secs, 3)}
            print(json.dumps(row), flush=True)
            rows.setdefault(name, []).append(row)
    print(f"# batch {args.batch}, {args.steps} SGD step(s) of lr {LR}, noise {args.noise}× the update's norm, "
          f"{args.seeds} seeds; Inverting Gradients at {args.ig_iterations} iterations")
    for line in summarize(rows):
        print(line)

if __name__ == "__main__":
    main()
