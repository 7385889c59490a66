"""End-to-end: the `redteam` command as a user runs it."""

import json
import subprocess
import sys

import pytest

from redteam.cli import main


def _redteam(*args, check=True):
    proc = subprocess.run([sys.executable, "-m", "redteam.cli", *args], capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def test_run_smoke_writes_json_and_table(tmp_path):
    out = tmp_path / "res" / "smoke.json"
    proc = _redteam("run", "scenarios/smoke.toml", "--json", str(out), "--rounds", "4", "--quiet", "--device", "cpu")
    assert "smoke" in proc.stdout and "sign_flip" in proc.stdout and "baseline" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["format"] == "redteam.run/v1"
    assert [r["attack"] for r in doc["runs"]] == ["none", "sign_flip"]
    assert len(doc["runs"][1]["rounds"]) == 4
    assert not list(tmp_path.glob("res/*.tmp"))


def test_help_teaches():
    proc = _redteam("--help")
    assert "examples:" in proc.stdout and "redteam run scenarios/smoke.toml" in proc.stdout
    proc = _redteam("run", "--help")
    assert "--json" in proc.stdout and "baseline" in proc.stdout


def test_help_does_not_import_torch():
    code = "import sys; from redteam.cli import build_parser; build_parser(); print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.stdout.strip() == "False", proc.stderr


@pytest.mark.parametrize(
    "content,msg",
    [
        ("[federation]\nclients = -3\n", "[federation].clients = -3: must be an integer ≥ 1"),
        ("[attack]\nname = 'sing_flip'\n", "did you mean 'sign_flip'"),
        ("[federation\n", "invalid TOML"),
    ],
)
def test_bad_scenario_is_one_line_error(tmp_path, content, msg):
    f = tmp_path / "bad.toml"
    f.write_text(content)
    proc = _redteam("run", str(f), check=False)
    assert proc.returncode == 2
    assert msg in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_missing_file(capsys):
    assert main(["run", "does/not/exist.toml"]) == 2
    assert "no such scenario file" in capsys.readouterr().err


def test_lists(capsys):
    assert main(["workloads", "list", "--names"]) == 0
    names = capsys.readouterr().out.split()
    assert {"digits", "synthetic"} <= set(names)
    assert main(["attacks", "list"]) == 0
    out = capsys.readouterr().out
    assert "sign_flip" in out and "variant" in out
    assert main(["defenses", "list"]) == 0
    assert "norm_bound" in capsys.readouterr().out


def test_subcommand_version_option_is_not_the_global_version(tmp_path, capsys):
    # `provenance manifest --version` is the dataset's version, not "print redteam's version"
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.csv").write_text("1,2\n")
    out = tmp_path / "stmt.json"
    rc = main(["provenance", "manifest", str(data), "--client", "c0", "--dataset", "toy",
               "--version", "3", "--license", "MIT", "--out", str(out)])
    assert rc == 0 and out.exists()
    assert "redteam 0." not in capsys.readouterr().out
