"""The ``redteam`` command.

Heavy modules (torch) are imported inside the sub-commands, so ``redteam --help``
answers at once.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from typing import Any, Sequence

from .cli_common import _THREADS_HELP, _leaf_parser, _Parser, _threads_arg, usage_error_line
from .errors import RedteamError

__all__ = ["main", "build_parser", "usage_error_line"]

_EPILOG = textwrap.dedent(
    """\
    examples:
      redteam run scenarios/smoke.toml                 attack + defense vs the no-attack baseline
      redteam run scenarios/smoke.toml --json out.json machine-readable results too
      redteam run scenarios/smoke.toml --rounds 5      a quicker look
      redteam matrix scenarios/smoke.toml --dry-run    the cells, their seeds, the runs left, a time estimate
      redteam matrix scenarios/smoke.toml --out results/smoke
                                                       every cell x seed into a results store (--resume continues)
      redteam report results/smoke --format html       the store's report: tables, heatmaps, the defender's summary
      redteam limits scenarios/limits.toml             bandwidth, stragglers, memory and cost of a proposal's numbers
      redteam provenance verify bundle.json --pub client.pub --data data/
                                                       a signed dataset manifest and the files it names
      redteam ledger verify ledger.sqlite              recompute a transparency log's tree and checkpoints
      redteam data list                                the datasets a workload can read, and where they are
      redteam attacks list                             every registered attack, its parameters
      redteam defenses list                            every registered defense
      redteam workloads list                           models + data you can train

    A scenario file (TOML) names a workload, a federation, its transport and hierarchy,
    one attack and one defense (or a pipeline). See docs/scenarios.md.
    """
)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="redteam",
        description="Attack federated and decentralized training on purpose, and measure the defenses.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="store_true", dest="show_version", help="print the version and exit")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser(
        "run",
        help="run a scenario (and its no-attack baseline), print a table, optionally write JSON",
        description=textwrap.dedent(
            """\
            Run the scenario's federation twice with the same seed: once with attack 'none'
            (the baseline) and once with the scenario's attack, both under its defense.
            Prints one row per run: final accuracy, accuracy drop against the baseline,
            rounds to the target accuracy, bytes on the wire, dropped and rejected updates,
            and how well the defense's accept/reject decisions matched the truth."""
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("scenario", help="path of a scenario TOML file (e.g. scenarios/smoke.toml)")
    run.add_argument("--json", metavar="OUT", help="also write the results as JSON to OUT (format redteam.run/v1)")
    run.add_argument(
        "--device", default="auto", choices=("auto", "cpu", "cuda"),
        help="where tensors live: auto = CUDA when available (default), else CPU",
    )
    run.add_argument("--rounds", type=int, metavar="N", help="override [federation].rounds")
    run.add_argument("--seed", type=int, metavar="S",
                     help="the seed of the run (overrides [scenario].seed); a matrix cell's seeds are listed by "
                          "`redteam matrix --dry-run` and in every report")
    run.add_argument("--cell", metavar="ID",
                     help="run this cell of the file's [matrix] (its id as reports show it, e.g. 'median[ipm]') "
                          "instead of the base cell, as the matrix runs it; with the seed of its first replicate "
                          "unless --seed. Reports print the command for each run of each cell")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.add_argument("--threads", type=_threads_arg, default=None, metavar="auto|N",
                     help=_THREADS_HELP)

    mx = sub.add_parser(
        "matrix",
        help="run a scenario matrix (attacks × defenses × settings × seeds) into a results store",
        description=textwrap.dedent(
            """\
            Expand the scenario's [matrix] into cells and run each cell once per seed, with the
            no-attack baseline of the same seed and settings (shared across attacks). Results go
            to a SQLite store in --out, written as each run finishes: a run killed at any moment
            can be continued with --resume, which recomputes nothing that finished.
            Then read it with: redteam report DIR

            Look before you run: --dry-run lists every cell with its attack, defense, settings
            and the seed of each replicate (what `redteam run FILE --cell ID --seed S` takes
            to rerun it), counts the runs the --out store already holds (read, never written:
            no store is created) and the runs left, and times two rounds of the first cell to
            estimate the whole ("≈ 14 min with 2 workers, from a 2-round probe of 1.6 s");
            --no-probe skips the probe.

            One store holds one definition of the scenario: --resume refuses, listing each
            difference, when the file changed since the store was filled (a setting, a cell
            added, removed or changed); --recompute-changed accepts the change, computes
            the changed and added cells and keeps the others (runs no longer planned stay
            in the store but out of every report)."""
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mx.add_argument("scenario", help="scenario TOML file with a [matrix] table (or without: one cell)")
    mx.add_argument("--out", default="results", metavar="DIR", help="results directory (default: ./results)")
    mx.add_argument("--executor", default="local", choices=("local", "process", "ray"),
                    help="local: one run after another; process: a pool on this machine; ray: Ray tasks")
    mx.add_argument("--workers", type=int, metavar="N", help="parallel runs (process/ray; default: cores)")
    mx.add_argument("--ray-address", metavar="ADDR", help="an existing Ray cluster (default: start a local one)")
    mx.add_argument("--resume", action="store_true",
                    help="continue a store that already holds results (refused if the scenario changed since)")
    mx.add_argument("--recompute-changed", action="store_true",
                    help="with a changed scenario: compute its changed and added cells, keep the unchanged ones "
                         "(implies --resume)")
    mx.add_argument("--dry-run", action="store_true",
                    help="run nothing, write nothing: list the cells and their seeds, the runs already in --out "
                         "and those left, and a time estimate from a 2-round probe")
    mx.add_argument("--no-probe", action="store_true",
                    help="with --dry-run: no probe, so no time estimate (nothing is trained)")
    mx.add_argument("--device", default="cpu", choices=("auto", "cpu", "cuda"), help="where tensors live")
    mx.add_argument("--quiet", action="store_true", help="no progress display")
    mx.add_argument("--threads", type=_threads_arg, default=None, metavar="auto|N",
                    help=_THREADS_HELP)

    for group, what in (("attacks", "attack"), ("defenses", "defense"), ("workloads", "workload")):
        g = sub.add_parser(group, help=f"list registered {group}")
        gs = g.add_subparsers(dest="action", metavar="ACTION")
        ls = gs.add_parser("list", help=f"every registered {what}: summary, parameters, reference, package")
        ls.add_argument("--names", action="store_true", help="names only, one per line")

    try:
        from provenance.cli import register  # the provenance and ledger command groups
    except ImportError:
        register = None
    if register is not None:
        register(sub)
    from .report.cli import register as register_report  # `redteam report DIR`

    register_report(sub)
    from .limits.cli import register as register_limits  # `redteam limits FILE`

    register_limits(sub)
    from .data_cli import register as register_data  # `redteam data list | check DIR | fetch NAME`

    register_data(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # named by the command that got them, not by the top level
        _leaf_parser(parser, args).error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.show_version:
        from . import __version__

        print(f"redteam {__version__}")
        return 0
    if not args.command:
        parser.print_help()
        return 0
    try:
        if args.command == "run":
            return _cmd_run(args)
        if args.command == "matrix":
            return _cmd_matrix(args)
        if args.command in ("attacks", "defenses", "workloads"):
            if getattr(args, "action", None) != "list":
                parser.parse_args([args.command, "--help"])
            return _cmd_list(args.command, args.names)
        handler = getattr(args, "handler", None) or getattr(args, "func", None)
        if handler is not None:
            return int(handler(args) or 0)
        parser.print_help()
        return 2
    except RedteamError as exc:
        from .runner.outputs import terminal_safe

        details = getattr(exc, "details", None)
        if details:  # a headline, then one line per item (e.g. each change of a scenario)
            print(f"redteam: error: {terminal_safe(getattr(exc, 'headline', exc))}", file=sys.stderr)
            for line in details:
                print(f"  {terminal_safe(line)}", file=sys.stderr)
        else:
            print(f"redteam: error: {terminal_safe(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("redteam: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of stdout left (`redteam … | head`): stop quietly, as Unix tools do
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        except (OSError, ValueError):
            pass
        return 141  # 128 + SIGPIPE
    except Exception as exc:  # a full disk anywhere else (a warm-up, a signed file): one line, not a traceback
        from .runner.outputs import disk_full_path, is_disk_full, terminal_safe

        if not is_disk_full(exc):
            raise
        where = disk_full_path(exc)
        print(f"redteam: error: disk full{f' while writing {terminal_safe(where)}' if where else ''} "
              f"({terminal_safe(exc)}); free space and run again", file=sys.stderr)
        return 2


# ----------------------------------------------------------------------------- run


def _cmd_run(args: argparse.Namespace) -> int:
    import dataclasses

    from rich.console import Console

    from pathlib import Path

    from .scenario import load_document, parse_scenario

    # wide enough for the results table even when stdout is a pipe or a file
    console = Console(stderr=False, width=None if sys.stdout.isatty() else 160)
    path = Path(args.scenario)
    raw = load_document(path)
    _refuse_empty(raw, path)
    if args.seed is not None and args.seed < 0:
        raise RedteamError(f"--seed = {args.seed}: must be ≥ 0")
    seed = args.seed
    if args.cell is not None:
        sc, first_seed = _matrix_cell(path, args.cell, as_matrix=args.seed is None)
        seed = first_seed if seed is None else seed
    else:
        _base_cell_only(raw, path)
        sc = parse_scenario(raw, file=path.name, base_dir=path.parent)
        _refuse_unmet(sc, path)
        if "matrix" in raw:
            print(f"redteam: note: {_safe(path)} has a [matrix]; `redteam run` runs only its base cell "
                  f"({_safe(sc.attack.name)} vs {_safe(sc.defense_label())}); `redteam matrix` runs every cell "
                  "(--cell ID runs one of them)", file=sys.stderr)
    _refuse_unmet(sc, path)
    if args.rounds is not None:
        if args.rounds < 1:
            raise RedteamError(f"--rounds = {args.rounds}: must be ≥ 1")
        sc = sc.replace(federation=dataclasses.replace(sc.federation, rounds=args.rounds))
        from .scenario import check_protocol

        check_protocol(sc, f"{path.name} with --rounds {args.rounds}")  # a window the shorter run never reaches
    if seed is not None:
        sc = sc.replace(scenario=dataclasses.replace(sc.scenario, seed=seed))

    from .runner.outputs import check_output_file
    from .runner.single import run_scenario, write_json

    if args.json is not None:
        check_output_file(args.json, option="--json")  # before the run, not after it
    n_runs = 1 if sc.attack.name == "none" else 2
    total = sc.federation.rounds * n_runs
    from .report.applicable import workload_is_language_model

    lm = workload_is_language_model(sc.workload.name) is True

    def quality(rec: Any) -> str:
        """The progress line's figure in the workload's own metric (bits per byte for a language model)."""
        if lm:
            import math

            return f"{rec.loss / math.log(2):.3f} bits/byte" if math.isfinite(rec.loss) else "loss non-finite"
        return f"acc {rec.accuracy:.3f}"
    if args.quiet:
        doc = run_scenario(sc, device=args.device, threads=args.threads)
    elif not Console(stderr=True).is_terminal:  # a log, not a terminal: plain lines
        from .runner.progress import PlainProgress

        plain = PlainProgress(sc.name, "rounds")
        plain.update(0, total, "")  # the start: the ETA counts from here
        step = [0]

        def on_round_plain(kind: str, rec: Any) -> None:
            step[0] += 1
            label = "baseline" if kind == "baseline" else f"{sc.attack.name} vs {sc.defense_label()}"
            plain.update(step[0], total, f"{label} round {rec.round + 1} ({quality(rec)})")

        doc = run_scenario(sc, device=args.device, on_round=on_round_plain, threads=args.threads)
    else:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=True,
        ) as progress:
            task = progress.add_task(_markup(f"{sc.name}: baseline"), total=total, status="")

            def on_round(kind: str, rec: Any) -> None:
                label = "baseline" if kind == "baseline" else f"{sc.attack.name} vs {sc.defense_label()}"
                progress.update(
                    task,
                    advance=1,
                    description=_markup(f"{sc.name}: {label}"),
                    status=f"round {rec.round + 1}: {quality(rec)}",
                )

            doc = run_scenario(sc, device=args.device, on_round=on_round, threads=args.threads)
    if args.json:  # the results first: nothing printed afterwards can lose them
        from .runner.outputs import DiskFull, OutputError, is_disk_full

        try:
            path = write_json(doc, args.json)
        except OutputError as exc:
            if not is_disk_full(exc):
                raise
            _print_table(console, doc)  # what is left of the run: on the screen, at least
            raise DiskFull(f"disk full while writing {_safe(args.json)}: the run's results are not saved (the table "
                           "above shows them); free space and run again") from None
    _print_table(console, doc)
    if args.json:
        console.print(f"results written to [bold]{_markup(path)}[/bold]")
    for run in doc["runs"]:  # after the table, so a log's last lines say it
        if run.get("model_destroyed"):
            what = "baseline" if run["baseline"] else f"{run['attack']} vs {run['defense']}"
            print(f"redteam: warning: the {_safe(what)} run's model was destroyed: its loss is non-finite from "
                  f"round {run.get('model_destroyed_round')} of {len(run['rounds'])} to the end, so its accuracy "
                  "and metrics describe a broken model", file=sys.stderr)
    return 0


def _matrix_cell(path: Any, cell_id: str, as_matrix: bool = True) -> tuple[Any, int]:
    """The scenario of the ``[matrix]`` cell ``cell_id`` of the file at ``path`` (what the
    matrix runs for it, less the seed) and the seed of its first replicate; ``as_matrix``: with
    the warm-up seed of that replicate (a ``--seed`` of the user's own: the run's seed seeds it)."""
    import copy
    import difflib
    from pathlib import Path

    from .errors import InvalidScenario
    from .matrix import load_matrix, replicate_seeds
    from .scenario import parse_scenario

    base, matrix, _ = load_matrix(path)
    cells = {c.id: c for c in matrix.cells}
    cell = cells.get(cell_id)
    if cell is None:
        close = difflib.get_close_matches(cell_id, list(cells), n=3)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        names = list(cells)
        listed = ", ".join(names[:6]) + (f", … ({len(names)} in all)" if len(names) > 6 else "")
        raise InvalidScenario(f"--cell {cell_id!r}: {_safe(path)} has no such cell{hint} (cells: {listed}; "
                              f"`redteam matrix {_safe(path)} --dry-run` lists them with their seeds)")
    doc = copy.deepcopy(dict(cell.doc))
    table = doc.get("scenario", {})
    seeds = replicate_seeds(base.seed, cell.settings, matrix.seeds[0], table)
    # the warm-up the matrix's first replicate starts from (the run's own seed is set by the caller)
    if as_matrix and "warmup_seed" in seeds:
        doc["scenario"] = {**table, "warmup_seed": seeds["warmup_seed"]}
    sc = parse_scenario(doc, file=path.name, base_dir=Path(path).parent)
    return sc, seeds["seed"]


def _refuse_unmet(sc: Any, path: Any) -> None:
    """Refuse a scenario whose ``[scenario] requires`` this machine does not meet (one line)."""
    from .requirements import unmet

    missing = unmet(sc.scenario.requires, sc.workload_params)
    if missing:
        raise RedteamError(f"{_safe(path)}: " + "; ".join(missing) + " ([scenario] requires)")


def _safe(text: object) -> str:
    from .runner.outputs import terminal_safe

    return terminal_safe(text)


def _refuse_empty(doc: dict[str, Any], path: Any) -> None:
    """An empty scenario file is a mistake, not a request for every default."""
    from .errors import InvalidScenario
    from .runner.outputs import terminal_safe

    if not doc:
        raise InvalidScenario(f"{terminal_safe(path)}: the scenario file is empty (no tables); "
                              "see docs/scenarios.md (e.g. scenarios/smoke.toml)")


def _base_cell_only(doc: dict[str, Any], path: Any) -> None:
    """``redteam run`` on a file with a ``[matrix]`` runs only the base cell: refuse when
    the file has no base ``[attack]`` (it would run just a no-attack baseline), else say so."""
    from .errors import InvalidScenario
    from .runner.outputs import terminal_safe

    if "matrix" not in doc:
        return
    name = terminal_safe(path)
    if "attack" not in doc:
        raise InvalidScenario(
            f"{name} has a [matrix] and no [attack]: `redteam run` runs one scenario, not a matrix "
            f"(here only a no-attack baseline); use `redteam matrix {name} --out DIR`, or add an [attack] table")


def _markup(text: object) -> str:
    """Text from a scenario file, a plugin or a path, safe inside rich markup: brackets
    escaped, control characters shown as escapes."""
    from rich.markup import escape

    from .runner.outputs import terminal_safe

    return escape(terminal_safe(text))


def _plain(text: object) -> Any:
    """A table cell holding ``text`` literally (never parsed as markup)."""
    from rich.text import Text

    from .runner.outputs import terminal_safe

    return Text(terminal_safe(text))


def _cmd_matrix(args: argparse.Namespace) -> int:
    from rich.console import Console

    from .runner.matrix_run import run_matrix

    if args.no_probe and not args.dry_run:
        raise RedteamError("--no-probe: only with --dry-run (a run has nothing to probe)")
    if args.dry_run:
        return _cmd_matrix_dry_run(args)
    console = Console(width=None if sys.stdout.isatty() else 160)
    options = dict(executor=args.executor, workers=args.workers, threads=args.threads, ray_address=args.ray_address,
                   resume=args.resume, recompute_changed=args.recompute_changed, device=args.device)
    if args.quiet:
        summary = run_matrix(args.scenario, args.out, **options)
    elif not Console(stderr=True).is_terminal:  # a log, not a terminal: plain lines
        from .runner.progress import PlainProgress

        plain = PlainProgress("matrix", "runs")
        summary = run_matrix(args.scenario, args.out, on_progress=plain.update, **options)
    else:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from .runner.progress import Eta

        eta = Eta()  # from the runs finished here, not counting the first one's warm-up
        with Progress(
            TextColumn("[bold]runs"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.fields[eta]}"), TextColumn("{task.fields[current]}"),
            console=Console(stderr=True), transient=True,
        ) as progress:
            task = progress.add_task("matrix", total=None, current="", eta="ETA ?")

            def on_progress(done: int, total: int, label: str) -> None:
                eta.update(done)
                progress.update(task, completed=done, total=total, current=_markup(label),
                                eta=eta.text(done, total))

            summary = run_matrix(args.scenario, args.out, on_progress=on_progress, **options)
    console.print(
        f"{summary.total} runs ({summary.computed} computed, {summary.skipped} already in the store) "
        f"in {summary.wall_time_s:.1f} s → [bold]{_markup(summary.store)}[/bold]"
    )
    try:
        from .report.cli import print_summary
    except ImportError:
        print_summary = None
    if print_summary is not None:
        outcome = print_summary(console, summary.store)
        failed = getattr(outcome, "failed_expectations", 0)
        html_error = getattr(outcome, "html_error", None)
        if html_error:  # the runs are safe; the report is not there: not a clean success
            from .runner.outputs import terminal_safe

            where = terminal_safe(str(args.out))
            print(f"redteam: error: the runs are stored in {where}, but the HTML report could not be written "
                  f"({terminal_safe(' '.join(html_error.split()))}); write it later with "
                  f"`redteam report {where} --format html`", file=sys.stderr)
        if failed:
            print(f"redteam: {failed} expectation(s) failed (listed above)", file=sys.stderr)
            return 1
        if html_error:
            return 2
    return 0


def _duration(seconds: float) -> str:
    """``45 s``, ``14 min``, ``2.3 h``: an estimate's precision."""
    if seconds < 90:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _lines(items: Sequence[object]) -> Any:
    """A table cell of several lines, each taken literally."""
    from rich.text import Text

    return Text("\n").join(_plain(i) for i in items)


def _cmd_matrix_dry_run(args: argparse.Namespace) -> int:
    """``redteam matrix --dry-run``: what a run would do, nothing run, nothing written."""
    from rich.console import Console

    from .report.fit import FitColumn, fit_tables
    from .runner.matrix_run import estimate_seconds, plan_matrix, probe
    from .runner.store import store_file

    console = Console(width=None if sys.stdout.isatty() else 160)
    plan = plan_matrix(args.scenario, args.out, executor=args.executor, workers=args.workers, device=args.device,
                       threads=args.threads, resume=args.resume, recompute_changed=args.recompute_changed)
    n_seeds = max((len(c.seeds) for c in plan.cells), default=0)
    console.print(_plain(f"dry run of {plan.scenario}: nothing is run, nothing is written"))
    console.print(_plain(f"{plan.name}: {len(plan.cells)} cell(s) × {n_seeds} seed(s) = {plan.total} distinct runs "
                         f"({plan.baselines} no-attack baseline(s), shared by the attacks of one defense and "
                         f"settings, + {plan.attacked} attacked)"))
    if plan.store is None:
        console.print(_plain(f"store: none at {plan.out} (a run creates {store_file(plan.out)})"))
    else:
        extra = plan.store_runs - plan.finished
        other = f"; {extra} more finished run(s) there are not in this plan" if extra > 0 else ""
        console.print(_plain(f"store: {plan.store} holds {plan.finished} of the {plan.total} planned runs{other}"))
    columns = [FitColumn("cell", "left"), FitColumn("attack", "left"), FitColumn("defense", "left"),
               FitColumn("settings", "left"), FitColumn("seeds (replicate: seed)", "left"),
               FitColumn("runs in store", "right")]
    rows = []
    for c in plan.cells:
        settings = _lines([f"{k}={v}" for k, v in c.settings.items()] or ["—"])
        seeds = _lines([f"{rep}: {seed}" for rep, seed in c.seeds])
        rows.append([_plain(c.cell_id), _plain(c.attack), _plain(c.defense), settings, seeds,
                     _plain(f"{c.finished}/{c.runs}")])
    for _, table in fit_tables(console.width, columns, rows, keep=1):
        console.print(table)
    console.print(_plain("runs in store: finished runs of the cell (its attacked run and its baseline, per seed) "
                         "already in --out. Rerun one: redteam run "
                         f"{plan.scenario}{' --cell ID' if plan.has_matrix else ''} --seed SEED"))
    if plan.changes:
        console.print(_plain(f"the scenario changed since the store was filled ({len(plan.changes)} difference(s)):"))
        for line in plan.changes:
            console.print(_plain(f"  - {line}"))
    if plan.refusal:
        console.print(_plain(f"note: {plan.refusal}"), style="yellow")
    n_b = sum(1 for u in plan.todo if u.baseline)
    how = "one at a time" if plan.executor == "local" else f"{plan.workers} at a time"
    if not plan.todo:
        console.print(_plain("to compute: 0 run(s): every planned run is in the store"))
        return 0
    console.print(_plain(f"to compute: {len(plan.todo)} run(s) ({n_b} baseline(s), {len(plan.todo) - n_b} attacked), "
                         f"--executor {plan.executor}, {how}"))
    if args.no_probe:
        console.print(_plain("time: not estimated (--no-probe)"))
        return 0
    try:
        found = probe(plan, device=args.device, threads=args.threads)
    except RedteamError as exc:
        print(f"redteam: warning: the probe failed, so no time estimate: {_safe(exc)}", file=sys.stderr)
        return 0
    if found is None:
        return 0
    total = estimate_seconds(plan, found)
    workers = max(1, min(plan.workers, len(plan.todo)))
    warm = (f" and of {len(found.warmups)} warm-up(s) ({sum(found.warmups)} rounds)" if found.warmups else "")
    console.print(_plain(
        f"estimate: ≈ {_duration(total)} with {workers} worker(s), from a {found.rounds}-round probe of "
        f"{found.seconds:.2f} s ({found.label} on --device {args.device}: {found.setup_s:.2f} s to set up, its first "
        f"round's extra included, + {found.round_s:.2f} s per round; the rounds of {len(plan.todo)} run(s){warm} "
        f"÷ {workers}, + {found.warmup_s:.1f} s a fresh process pays once); a rough guide: cells differ in cost"))
    return 0


def _print_table(console: Any, doc: dict[str, Any]) -> None:
    from .report.run_table import print_run_table

    print_run_table(console, doc)


# ---------------------------------------------------------------------------- list


def _cmd_list(group: str, names_only: bool) -> int:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from .registry import ATTACKS, DEFENSES, WORKLOADS
    from .runner.outputs import terminal_safe

    reg = {"attacks": ATTACKS, "defenses": DEFENSES, "workloads": WORKLOADS}[group]
    names = reg.names()
    if names_only:
        print("\n".join(terminal_safe(n) for n in names))
        return 0
    t = Table(title=f"registered {group}", show_lines=True)
    for col in ("name", "summary", "parameters (default)", "reference", "package"):
        t.add_column(col, overflow="fold")  # long words fold onto the next line, never cut to "…"
    for name in names:
        try:
            info = reg.info(name)
        except RedteamError as exc:
            t.add_row(_plain(name), Text(terminal_safe(exc), style="red"), "", "", "")
            continue
        params = Text("\n").join(_plain(f"{p} = {d!r}") for p, _, d in info.parameters) or Text("—")
        t.add_row(_plain(name), _plain(info.summary), params, _plain(info.reference or "—"),
                  _plain(info.distribution))
    Console().print(t)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
