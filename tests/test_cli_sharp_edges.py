"""Issue 11 §3, "no sharp edges": bad output paths, empty files, matrix-only files and bad
option values are one-line errors (exit 2) found before any work; a failed expectation
makes `redteam matrix` exit 1; usage errors are one line too."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import redteam.runner.single as single
from redteam.cli import main

TINY = textwrap.dedent(
    """\
    [scenario]
    name = "edges"
    seed = 4
    [workload]
    name = "synthetic"
    samples = 300
    [federation]
    clients = 4
    rounds = 1
    malicious_fraction = 0.25
    """
)
MATRIX = TINY + '[matrix]\nattacks = ["sign_flip"]\ndefenses = ["mean"]\nseeds = 1\n'


def _one_line(capsys, argv, code=2):
    got = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert got == code, (out, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("redteam: error: "), err
    return lines[0]


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if a federation is trained."""
    import redteam.federation.loop as loop

    def refuse(*a, **k):
        raise AssertionError("work was done before the bad input was noticed")

    monkeypatch.setattr(loop.Federation, "run", refuse)
    monkeypatch.setattr(single, "run_scenario", refuse)


def test_matrix_out_is_a_regular_file(tmp_path, capsys, no_work):
    f = tmp_path / "m.toml"
    f.write_text(MATRIX)
    target = tmp_path / "taken"
    target.write_text("a file")
    msg = _one_line(capsys, ["matrix", f, "--out", target])
    assert "--out" in msg and "not a directory" in msg
    msg = _one_line(capsys, ["matrix", f, "--out", target / "sub"])
    assert "is a file, not a directory" in msg
    assert target.read_text() == "a file"


def test_run_json_is_a_directory_refused_before_the_run(tmp_path, capsys, no_work):
    f = tmp_path / "s.toml"
    f.write_text(TINY)
    d = tmp_path / "outdir"
    d.mkdir()
    msg = _one_line(capsys, ["run", f, "--json", d, "--quiet"])
    assert "--json" in msg and "is a directory" in msg
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outdir", "s.toml"]  # no stray outdir.tmp
    under_file = tmp_path / "s.toml" / "r.json"
    assert "is a file, not a directory" in _one_line(capsys, ["run", f, "--json", under_file, "--quiet"])


@pytest.mark.parametrize("command", ["run", "matrix"])
def test_empty_scenario_file_is_refused(tmp_path, capsys, no_work, command):
    f = tmp_path / "empty.toml"
    f.write_text("# nothing here\n")
    argv = [command, f] + (["--out", tmp_path / "o"] if command == "matrix" else [])
    assert "the scenario file is empty" in _one_line(capsys, argv)
    assert not (tmp_path / "o").exists()


def test_workers_zero_is_refused(tmp_path, capsys, no_work):
    f = tmp_path / "m.toml"
    f.write_text(MATRIX)
    msg = _one_line(capsys, ["matrix", f, "--out", tmp_path / "o", "--executor", "process", "--workers", "0"])
    assert "--workers = 0: must be an integer ≥ 1" in msg
    assert not (tmp_path / "o").exists()


def test_run_on_a_matrix_only_file_is_refused(tmp_path, capsys, no_work):
    f = tmp_path / "m.toml"
    f.write_text(MATRIX)
    msg = _one_line(capsys, ["run", f, "--quiet"])
    assert "has a [matrix] and no [attack]" in msg and "redteam matrix" in msg


def test_run_on_a_matrix_file_with_a_base_cell_says_what_runs(tmp_path, capsys):
    f = tmp_path / "m.toml"
    f.write_text(MATRIX + '[attack]\nname = "ipm"\n[defense]\nname = "median"\n')
    assert main(["run", str(f), "--quiet", "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    assert "runs only its base cell (ipm vs median)" in err


def test_matrix_exits_1_when_an_expectation_fails(tmp_path, capsys):
    f = tmp_path / "m.toml"
    # accuracy_drop ≤ 1 always (accuracies are in [0, 1]): min = 2 cannot hold
    f.write_text(MATRIX + '[[expect]]\nattack = "sign_flip"\nmetric = "accuracy_drop"\nmin = 2\n')
    assert main(["matrix", str(f), "--out", str(tmp_path / "o"), "--quiet"]) == 1
    out, err = capsys.readouterr()
    assert "expectations: 0 of 1 hold" in out and "1 expectation(s) failed" in err
    g = tmp_path / "ok.toml"
    g.write_text(MATRIX + '[[expect]]\nattack = "sign_flip"\nmetric = "accuracy_drop"\nmax = 2\n')
    assert main(["matrix", str(g), "--out", str(tmp_path / "o2"), "--quiet"]) == 0


@pytest.mark.parametrize("argv, msg", [
    (["matrix"], "the following arguments are required: scenario"),
    (["run", "x.toml", "--rounds", "many"], "invalid int value: 'many'"),
    (["report"], "the following arguments are required: DIR"),
    (["bogus"], "invalid choice: 'bogus'"),
])
def test_usage_errors_are_one_line(argv, msg):
    proc = subprocess.run([sys.executable, "-m", "redteam.cli", *argv], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("redteam: error: ") and msg in lines[0], proc.stderr


def test_misspelt_expect_key_is_named(tmp_path, capsys, no_work):
    f = tmp_path / "m.toml"
    f.write_text(MATRIX + '[[expect]]\nmetirc = "accuracy_drop"\nmax = 1\n')
    msg = _one_line(capsys, ["matrix", f, "--out", tmp_path / "o"])
    assert "m.toml: [[expect]] #1: unknown key 'metirc' (did you mean 'metric'?)" in msg


def test_error_in_a_matrix_entry_is_labelled_matrix(tmp_path, capsys, no_work):
    f = tmp_path / "m.toml"
    f.write_text(MATRIX.replace('attacks = ["sign_flip"]', 'attacks = ["ipm", { name = "sign_flip", scale = -1 }]'))
    msg = _one_line(capsys, ["matrix", f, "--out", tmp_path / "o"])
    assert "m.toml: [matrix].attacks[1]: SignFlip.scale = -1" in msg


@pytest.mark.parametrize("command", ["run", "matrix"])
def test_plugin_parameter_error_names_file_and_section(tmp_path, capsys, command):
    # b = 100 is valid on its own; only n = 4 clients makes it impossible (2b < n), which
    # the defense learns in the round
    f = tmp_path / "t.toml"
    if command == "run":
        f.write_text(TINY + '[defense]\nname = "trimmed_mean"\nb = 100\n')
        msg = _one_line(capsys, ["run", f, "--quiet", "--device", "cpu"])
        assert msg.startswith("redteam: error: t.toml: [defense]: TrimmedMean.b = 100: must satisfy 2b < n")
    else:
        f.write_text(MATRIX.replace('defenses = ["mean"]', 'defenses = [{ name = "trimmed_mean", b = 100 }]'))
        msg = _one_line(capsys, ["matrix", f, "--out", tmp_path / "o", "--quiet"])
        assert msg.startswith("redteam: error: t.toml: [matrix] cell trimmed_mean(b=100)")
        assert "[defense]: TrimmedMean.b = 100: must satisfy 2b < n" in msg


def test_matrix_device_cuda_without_a_gpu_is_refused_before_the_store(tmp_path, capsys, no_work):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is available")
    f = tmp_path / "m.toml"
    f.write_text(MATRIX)
    assert "no CUDA device is available" in _one_line(capsys, ["matrix", f, "--out", tmp_path / "o",
                                                               "--device", "cuda"])
    assert not (tmp_path / "o").exists()


def test_a_reader_that_leaves_early_ends_the_command_quietly():
    """`redteam … | head`: when stdout's reader has gone, the command stops and says nothing (the
    ledger commands said "redteam: error: : Broken pipe", others printed a traceback)."""
    import subprocess
    import sys

    for argv in (["attacks", "list"], ["attacks", "list", "--names"], ["--help"]):
        proc = subprocess.Popen([sys.executable, "-m", "redteam.cli", *argv], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        proc.stdout.close()  # gone before the command writes anything
        err = proc.stderr.read().decode()
        code = proc.wait(timeout=120)
        if argv == ["--help"]:  # argparse prints the help itself; it must not leave a traceback either
            assert "Traceback" not in err, err
            continue
        # 141 = 128 + SIGPIPE from our handler; 1 from rich's (its tables end that way)
        assert code in (141, 1) and err == "", (code, err)
