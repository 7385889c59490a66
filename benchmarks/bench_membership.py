"""Membership inference on a known truth: seconds per LiRA call, and both attacks' AUC / TPR at low FPR.

    python benchmarks/bench_membership.py                      # seconds per call at the shipped defaults
    python benchmarks/bench_membership.py --quality --seeds 10 # + AUC, TPR@0.1 %, TPR@1 % over seeds
    python benchmarks/bench_membership.py --quality --shadows 16 --no-leak --seeds 30 --first-seed 10

The setting (:func:`redteam.testing.membership.membership_world`): a 64-64-10 MLP trained by 80
full-batch Adam steps (lr 0.03) on 100 random digits (the members), observed with those 100 and 300
held-out digits as candidates; the population left (1,297 digits) trains the shadows, each on 100
samples by the same procedure. ``--no-leak`` trains the target on 100 other digits instead (AUC
should sit at 0.5). The time is the median wall time of ``LiRA().membership_scores`` (shadow
training included: ``shadows`` trainings of 80 steps, ``shadows + 1`` forwards over 400
candidates) and of the loss attack, after one warm-up call, at ``--threads`` intra-op threads;
``cpu_s_per_lira_call`` is the process's CPU time per LiRA call (warm-up included), the figure to
read on a shared machine.
The quality lines give mean and 95 % Student-t interval over the seeds (``redteam.scoring.mean_ci``).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from _timing import cpu_name, median_time

from attacks.membership import LiRA, LossThresholdMIA
from redteam.privacy.membership import membership_metrics
from redteam.scoring import mean_ci
from redteam.testing.membership import membership_world


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shadows", type=int, default=LiRA().shadows)
    ap.add_argument("--variance", choices=("fixed", "per-candidate"), default="fixed")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quality", action="store_true", help="also score both attacks over --seeds seeds")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--first-seed", type=int, default=0, help="the quality seeds are first-seed, first-seed + 1, …")
    ap.add_argument("--no-leak", action="store_true", help="the target never saw the members")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    lira = LiRA(shadows=args.shadows, fixed_variance=args.variance == "fixed")
    world = membership_world(0, leak=not args.no_leak)
    obs = world.observation
    cpu0 = time.process_time()
    t_lira = median_time(lambda: lira.membership_scores(obs), args.repeats)
    cpu_lira = (time.process_time() - cpu0) / (args.repeats + 1)  # + the warm-up call
    t_loss = median_time(lambda: LossThresholdMIA().membership_scores(obs), args.repeats)
    print(json.dumps({"cpu": cpu_name(), "threads": args.threads, "lira": repr(lira),
                      "candidates": int(obs.candidates_y.numel()), "s_per_lira_call": round(t_lira, 4),
                      "cpu_s_per_lira_call": round(cpu_lira, 4), "s_per_loss_call": round(t_loss, 5)}))
    if not args.quality:
        return
    rows: dict[str, dict[str, list[float]]] = {"loss_threshold_mia": {}, "lira": {}}
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        w = membership_world(seed, leak=not args.no_leak)
        for name, attack in (("loss_threshold_mia", LossThresholdMIA()), ("lira", lira)):
            got = membership_metrics(attack.membership_scores(w.observation), w.is_member)
            print(json.dumps({"seed": seed, "attack": name, **{k: round(v, 4) for k, v in got.items()}}))
            for k, v in got.items():
                rows[name].setdefault(k, []).append(v)
    for name, metrics in rows.items():
        summary = {}
        for k, vs in metrics.items():
            ci = mean_ci(vs, bounds=(0.0, 1.0))
            summary[k] = f"{ci['mean']:.3f} [{ci['lo']:.3f}, {ci['hi']:.3f}]"
        print(json.dumps({"attack": name, "seeds": args.seeds, "leak": not args.no_leak, **summary}))


if __name__ == "__main__":
    main()
