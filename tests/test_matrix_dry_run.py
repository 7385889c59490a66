"""`redteam matrix --dry-run` says what a run would do, and every report lists the seed of
each run of each cell with the command that reruns it (issue 18 §4, parts 1 and 2)."""

from __future__ import annotations

import hashlib
import json
import shlex
import textwrap
from pathlib import Path

import pytest

from redteam.cli import main
from redteam.matrix import derive_seed
from redteam.runner.matrix_run import MatrixPlan, Probe, Unit, estimate_seconds, run_matrix
from redteam.runner.store import ResultsStore

TINY = textwrap.dedent(
    """\
    [scenario]
    name = "tiny"
    seed = 5
    [workload]
    name = "synthetic"
    samples = 200
    [federation]
    clients = 4
    rounds = 2
    malicious_fraction = 0.25
    [matrix]
    attacks = ATTACKS
    defenses = ["mean"]
    seeds = 2
    [matrix.settings]
    "federation.lr" = [0.1, 0.2]
    """
)
BOTH = '["sign_flip", "ipm"]'


def _scenario(tmp_path: Path, attacks: str = BOTH) -> Path:
    f = tmp_path / "tiny.toml"
    f.write_text(TINY.replace("ATTACKS", attacks))
    return f


def _tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` with its content hash (to show nothing was written)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _dry(capsys, *argv: object) -> tuple[int, str, str]:
    code = main(["matrix", *map(str, argv), "--dry-run"])
    out, err = capsys.readouterr()
    return code, out, err


CELLS = ["mean[sign_flip,lr=0.1]", "mean[ipm,lr=0.1]", "mean[sign_flip,lr=0.2]", "mean[ipm,lr=0.2]"]


def test_dry_run_lists_every_cell_and_seed_and_creates_nothing(tmp_path, capsys):
    f = _scenario(tmp_path)
    before = _tree(tmp_path)
    code, out, err = _dry(capsys, f, "--out", tmp_path / "out", "--no-probe")
    assert code == 0, err
    assert not (tmp_path / "out").exists()  # no store, no directory
    assert _tree(tmp_path) == before
    for cell in CELLS:
        assert cell in out
    # the seeds the runs use: derived from the scenario seed, the settings and the replicate
    for lr in (0.1, 0.2):
        for rep in (0, 1):
            assert f"{rep}: {derive_seed(5, [('federation.lr', lr)], rep)}" in out
    # 2 settings × 2 seeds baselines (shared by both attacks) + 2 attacks × 2 settings × 2 seeds
    assert "4 no-attack baseline(s)" in out and "+ 8 attacked" in out
    assert "to compute: 12 run(s) (4 baseline(s), 8 attacked)" in out
    assert "store: none at" in out
    assert "not estimated (--no-probe)" in out and "probe of" not in out


def test_dry_run_seeds_are_the_ones_the_store_records(tmp_path, capsys):
    f = _scenario(tmp_path)
    run_matrix(f, tmp_path / "out")
    code, out, _ = _dry(capsys, f, "--out", tmp_path / "out", "--no-probe", "--resume")
    assert code == 0
    with ResultsStore(tmp_path / "out", create=False) as st:
        plan = st.plan()
    assert len(plan) == 8
    for row in plan:
        assert f"{row.replicate}: {row.seed}" in out
    assert "to compute: 0 run(s)" in out


def test_dry_run_counts_the_runs_an_existing_store_holds_and_writes_nothing(tmp_path, capsys):
    f = _scenario(tmp_path, '["sign_flip"]')
    out_dir = tmp_path / "out"
    run_matrix(f, out_dir)  # sign_flip cells and every baseline
    f.write_text(TINY.replace("ATTACKS", BOTH))  # ipm added: its cells share the baselines
    before = _tree(out_dir)
    code, out, err = _dry(capsys, f, "--out", out_dir, "--no-probe", "--resume")
    assert code == 0, err
    assert _tree(out_dir) == before  # read, never written (no -wal/-shm left either)
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.startswith("│ mean[")}
    assert set(rows) == set(CELLS)
    for cell, line in rows.items():  # per cell: its 2 baselines + 2 attacked runs
        assert line.rstrip(" │").endswith("4/4" if "sign_flip" in cell else "2/4"), line
    assert "holds 8 of the 12 planned runs" in out
    assert "to compute: 4 run(s) (0 baseline(s), 4 attacked)" in out
    # the definition changed (cells added): what --resume would say, and how to accept it
    assert "cell added: mean[ipm,lr=0.1]" in out and "--recompute-changed" in out
    # the real run would refuse, with or without --resume: the dry run names the flag that works
    # (--recompute-changed, not --resume: issue 40 §5), exits 0, and stops advising once it is given
    for extra in ((), ("--resume",)):
        code, out, _ = _dry(capsys, f, "--out", out_dir, "--no-probe", *extra)
        note = " ".join(out.split()).split("note: ", 1)[1]
        assert code == 0 and note.startswith("the scenario's definition changed since the store was filled: a run "
                                             "needs --recompute-changed"), note
        assert "a run needs --resume" not in out
    code, out, _ = _dry(capsys, f, "--out", out_dir, "--no-probe", "--recompute-changed")
    assert code == 0 and "note:" not in out
    f.write_text(TINY.replace("ATTACKS", '["sign_flip"]'))  # the definition the store holds: only --resume is missing
    code, out, _ = _dry(capsys, f, "--out", out_dir, "--no-probe")
    assert code == 0 and "a run needs --resume" in out
    assert _tree(out_dir) == before


def test_dry_run_probe_gives_an_estimate(tmp_path, capsys):
    f = _scenario(tmp_path)
    code, out, err = _dry(capsys, f, "--out", tmp_path / "out", "--device", "cpu")
    assert code == 0, err
    text = " ".join(out.split())
    assert "estimate: ≈" in text and "from a 2-round probe of" in text and "with 1 worker(s)" in text
    assert "mean[sign_flip,lr=0.1] seed 0" in text  # the first cell, attacked
    assert not (tmp_path / "out").exists()


def test_estimate_is_rounds_times_runs_over_workers():
    def unit(rounds: int) -> Unit:
        return Unit("k", False, "c", "a", "d", {}, 0, 0, {}, rounds=rounds)

    plan = MatrixPlan(scenario=Path("x.toml"), name="x", has_matrix=True, out=Path("o"), store=None, cells=(),
                      baselines=0, attacked=4, finished=0, todo=tuple(unit(r) for r in (10, 10, 20, 20)),
                      store_runs=0, resume=False, changes=(), executor="process", workers=2)
    p = Probe("c seed 0", seconds=1.5, setup_s=0.5, round_s=1.0, warmup_s=3.0)
    # warm-up once, then (setup + rounds × round) per run, the runs shared by 2 workers
    assert estimate_seconds(plan, p) == pytest.approx(3.0 + (2 * (0.5 + 10) + 2 * (0.5 + 20)) / 2)
    # two warm-ups of 80 rounds: their rounds at the per-round time, shared by the workers too
    w = Probe("c seed 0", seconds=1.5, setup_s=0.5, round_s=1.0, warmup_s=3.0, warmups=(80, 80))
    assert estimate_seconds(plan, w) == pytest.approx(3.0 + (2 * (0.5 + 10) + 2 * (0.5 + 20) + 160) / 2)


def test_the_probe_counts_a_costly_first_round_once_per_run(tmp_path, monkeypatch):
    # an attack that trains something once per run makes its first round slow (5 s) and the
    # others fast (0.1 s): the second round is the per-round time, the first's extra is setup.
    # Before, a one-round probe took 5 s a round: 8 rounds read 41 s instead of 6.7.
    import redteam.runner.matrix_run as mr

    f = _scenario(tmp_path, '["sign_flip"]')
    plan = mr.plan_matrix(f, tmp_path / "out")
    clock = iter([0.0, 6.0, 10.0, 16.1])  # the 1-round call took 6.0 s, the 2-round call 6.1 s
    monkeypatch.setattr(mr.time, "perf_counter", lambda: next(clock))
    walls = {1: [5.0], 2: [5.0, 0.1]}
    monkeypatch.setattr(mr, "execute_unit", lambda doc, *a, **k: {
        "records": [{"wall_time_s": w} for w in walls[doc["federation"]["rounds"]]]})
    p = mr.probe(plan)
    assert (p.rounds, p.seconds) == (2, pytest.approx(6.1))
    assert p.round_s == pytest.approx(0.1) and p.setup_s == pytest.approx(5.9)
    assert p.warmup_s == pytest.approx(0.0)  # the 1-round call cost what the timed call's first round did
    assert p.run_seconds(8) == pytest.approx(6.7)
    assert p.warmups == ()


def test_warm_ups_are_counted_once_per_replicate(tmp_path):
    # a warm-up is the clean run before the cells: the attacks and defenses share it, a setting
    # it trains with (the learning rate) does not, and the replicate seeds it ([scenario] warmup_seed)
    from redteam.runner.matrix_run import plan_matrix, plan_warmups

    f = tmp_path / "w.toml"
    f.write_text(TINY.replace("ATTACKS", BOTH).replace("seed = 5", "seed = 5\nwarmup_rounds = 3"))
    plan = plan_matrix(f, tmp_path / "out")
    assert len(plan.todo) == 2 * 2 + 2 * 2 * 2  # baselines (lr × seed) + attacked (attack × lr × seed)
    assert plan_warmups(plan) == (3,) * 4  # lr × seed: not one per attack or per baseline
    f.write_text(TINY.replace("ATTACKS", BOTH))
    assert plan_warmups(plan_matrix(f, tmp_path / "out")) == ()


def test_dry_run_checks_what_a_run_checks(tmp_path, capsys):
    f = _scenario(tmp_path)
    code, _, err = _dry(capsys, f, "--out", tmp_path / "out", "--workers", "0", "--executor", "process")
    assert code == 2 and err.startswith("redteam: error: --workers") and err.count("\n") == 1
    code = main(["matrix", str(f), "--out", str(tmp_path / "out"), "--no-probe"])
    err = capsys.readouterr().err
    assert code == 2 and "only with --dry-run" in err
    assert not (tmp_path / "out").exists()


def test_help_teaches_dry_run(capsys):
    with pytest.raises(SystemExit):
        main(["matrix", "--help"])
    out = capsys.readouterr().out
    assert "--dry-run" in out and "--no-probe" in out and "--recompute-changed" in out
    assert "estimate" in out and "seed" in out


# ----------------------------------------------------------- seeds in every report


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("seeds")
    f = _scenario(tmp)
    run_matrix(f, tmp / "out")
    return f, tmp / "out"


def _store_seeds(out: Path) -> dict[str, list[tuple[int, int]]]:
    with ResultsStore(out, create=False) as st:
        seeds: dict[str, list[tuple[int, int]]] = {}
        for row in st.plan():
            seeds.setdefault(row.cell_id, []).append((row.replicate, row.seed))
    return seeds


def test_json_report_lists_each_cells_seeds_as_the_store_has_them(store, capsys):
    f, out = store
    assert main(["report", str(out), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    expected = _store_seeds(out)
    got = {c["cell_id"]: [(s["replicate"], s["seed"]) for s in c["seeds"]] for c in doc["cells"]}
    assert got == expected and len(got) == 4
    for c in doc["cells"]:
        for s in c["seeds"]:
            assert s["finished"] is True
            assert s["reproduce"] == f"redteam run {shlex.quote(str(f))} --cell {shlex.quote(c['cell_id'])} " \
                                     f"--seed {s['seed']}"


def test_markdown_and_html_list_the_seeds(store, capsys, tmp_path):
    _, out = store
    assert main(["report", str(out), "--format", "md"]) == 0
    md = capsys.readouterr().out
    section = md.split("## Seeds", 1)[1].split("\n## ", 1)[0]
    for cell, runs in _store_seeds(out).items():
        for rep, seed in runs:
            assert f"| {rep} | {seed} | yes |" in section
            assert f"--cell '{cell}' --seed {seed}`" in section
    page = tmp_path / "r.html"
    assert main(["report", str(out), "--format", "html", "--out", str(page)]) == 0
    html = page.read_text().split('<h2 id="seeds">', 1)[1].split("<h2", 1)[0]
    for runs in _store_seeds(out).values():
        for rep, seed in runs:
            assert f"<td>{rep}</td><td>{seed}</td>" in html


def test_the_reproduce_command_reruns_the_cell_exactly(store, capsys, tmp_path):
    f, out = store
    assert main(["report", str(out), "--format", "json"]) == 0
    cell = json.loads(capsys.readouterr().out)["cells"][3]  # mean[ipm,lr=0.2]: not the base cell
    run = cell["seeds"][1]
    argv = shlex.split(run["reproduce"])
    assert argv[0] == "redteam"
    rerun = tmp_path / "rerun.json"
    assert main([*argv[1:], "--json", str(rerun), "--quiet", "--device", "cpu"]) == 0
    capsys.readouterr()
    doc = json.loads(rerun.read_text())
    with ResultsStore(out, create=False) as st:
        row = next(r for r in st.plan() if r.cell_id == cell["cell_id"] and r.replicate == run["replicate"])
        attacked, baseline = st.run(row.run_key), st.run(row.baseline_key)
    assert doc["scenario"]["seed"] == run["seed"]
    assert doc["scenario"]["digest"] == row.run_key  # the very scenario the matrix ran
    assert [r["accuracy"] for r in doc["runs"][1]["rounds"]] == [r["accuracy"] for r in attacked["rounds"]]
    assert [r["accuracy"] for r in doc["runs"][0]["rounds"]] == [r["accuracy"] for r in baseline["rounds"]]


def test_run_cell_unknown_is_a_one_line_error(store, capsys):
    f, _ = store
    assert main(["run", str(f), "--cell", "mean[ipm,lr=0.3]"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("redteam: error: --cell 'mean[ipm,lr=0.3]'") and "did you mean" in err
    assert err.count("\n") == 1


def test_report_from_rows_has_no_seeds_rather_than_a_wrong_store(store, tmp_path):
    # a report not made from a store (or from another scenario's store) lists no seeds
    from redteam.report.formats import cell_seeds
    from redteam.report.load import load_report, report_from_rows

    _, out = store
    rep = load_report(out)
    assert cell_seeds(rep)
    with ResultsStore(out, create=False) as st:
        rows = st.results(with_rounds=True)
    assert cell_seeds(report_from_rows(rows, source=out / "results.sqlite")) == {}  # no digest: not checked
    other = report_from_rows(rows, source=out / "results.sqlite", meta={"scenario_digest": "0" * 64})
    assert cell_seeds(other) == {}
