"""Hostile text and paths: names from scenario files and plugins are printed as text,
results are written before anything is printed, errors stay on one line, and output
files never follow a planted symlink (issue 9 §4)."""

from __future__ import annotations

import dataclasses
import json
import os
import textwrap
from pathlib import Path
from typing import ClassVar

import pytest

from redteam.cli import main

TINY = textwrap.dedent(
    """\
    [scenario]
    name = {name}
    seed = 3
    [workload]
    name = "synthetic"
    samples = 300
    [federation]
    clients = 4
    rounds = 1
    malicious_fraction = 0.25
    [attack]
    name = "sign_flip"
    [defense]
    name = "mean"
    """
)

MATRIX = TINY.replace("[attack]\nname = \"sign_flip\"\n[defense]\nname = \"mean\"\n",
                      '[matrix]\nattacks = ["sign_flip"]\ndefenses = ["mean"]\nseeds = 1\n')

# markup that rich cannot render ("[/bold]" closes nothing), an ANSI escape (ESC [2J
# clears the screen) and a newline (would split a one-line message)
HOSTILE = '"[/bold] x \\u001b[2J\\nsecond line [/]"'


def _scenario(tmp_path: Path, text: str, name: str = "s.toml") -> Path:
    f = tmp_path / name
    f.write_text(text)
    return f


def test_run_prints_a_hostile_name_as_text_and_writes_the_json(tmp_path, capsys):
    f = _scenario(tmp_path, TINY.format(name=HOSTILE))
    out = tmp_path / "r.json"
    assert main(["run", str(f), "--quiet", "--device", "cpu", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    # the name is shown literally, its control characters as visible escapes
    assert "[/bold] x \\x1b[2J\\nsecond line [/]" in printed
    assert "\x1b" not in printed
    doc = json.loads(out.read_text())
    assert doc["scenario"]["name"] == "[/bold] x \x1b[2J\nsecond line [/]"  # the data itself is unchanged


def test_run_writes_the_json_before_printing(tmp_path, monkeypatch):
    # whatever happens while printing, the computed results are already on disk
    import redteam.cli as cli

    def boom(console, doc):
        raise RuntimeError("terminal trouble")

    monkeypatch.setattr(cli, "_print_table", boom)
    f = _scenario(tmp_path, TINY.format(name='"t"'))
    out = tmp_path / "r.json"
    with pytest.raises(RuntimeError, match="terminal trouble"):
        main(["run", str(f), "--quiet", "--device", "cpu", "--json", str(out)])
    assert json.loads(out.read_text())["format"] == "redteam.run/v1"


def test_matrix_out_with_markup_and_hostile_labels(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    f = _scenario(tmp_path, MATRIX.format(name=HOSTILE))
    assert main(["matrix", str(f), "--out", "r[/x]", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "r[/x]" in printed and "\x1b" not in printed
    assert (tmp_path / "r[/x]" / "results.sqlite").is_file()
    assert (tmp_path / "r[/x]" / "report.html").is_file()
    assert main(["report", "r[/x]"]) == 0
    table = capsys.readouterr().out
    assert "[/bold] x \\x1b[2J\\nsecond line [/]" in table and "\x1b" not in table


@dataclasses.dataclass(frozen=True, slots=True)
class _Odd:
    """[/] a summary that is not markup"""

    summary: ClassVar[str] = "[/] closes nothing \x1b[31m red?"
    reference: ClassVar[str] = "[bold]not bold[/bold]"
    level: float = 1.0


def test_plugin_summary_is_text(capsys, monkeypatch):
    from redteam.registry import ATTACKS

    monkeypatch.setenv("COLUMNS", "400")  # one table row per line

    ATTACKS.register("odd_[/]", _Odd)
    try:
        assert main(["attacks", "list"]) == 0
        out = capsys.readouterr().out
    finally:
        ATTACKS.unregister("odd_[/]")
    assert "odd_[/]" in out and "[/] closes nothing \\x1b[31m red?" in out
    assert "[bold]not bold[/bold]" in out


def test_error_with_a_newline_in_the_path_stays_one_line(tmp_path, capsys):
    assert main(["run", str(tmp_path / "no\nsuch\x1b[2J.toml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("redteam: error: ") and "\x1b" not in err
    assert "no\\nsuch\\x1b[2J.toml" in err


def test_json_output_does_not_follow_a_planted_symlink(tmp_path):
    # the old code wrote OUT.tmp, a predictable name: a symlink planted there sent the
    # results into (and over) any file the user could write
    from redteam.runner.single import write_json

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "r.json"
    os.symlink(victim, tmp_path / "r.json.tmp")
    write_json({"a": 1}, out)
    assert victim.read_text() == "precious"
    assert json.loads(out.read_text()) == {"a": 1}
    assert not out.is_symlink()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".r.json")] == []


def test_html_report_does_not_follow_a_planted_symlink(tmp_path):
    from redteam.report.html import write_html

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "report.html"
    os.symlink(victim, tmp_path / f".report.html.{os.getpid()}.tmp")  # the old, guessable name

    class _Stub:
        out_dir = tmp_path

    import redteam.report.html as html

    orig = html.render_html
    html.render_html = lambda report, metrics=None: "<html></html>\n"
    try:
        write_html(_Stub(), out)
    finally:
        html.render_html = orig
    assert victim.read_text() == "precious"
    assert out.read_text() == "<html></html>\n"


def test_atomic_write_replaces_a_symlink_target_instead_of_writing_through_it(tmp_path):
    from redteam.runner.outputs import atomic_write_text

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    link = tmp_path / "out.txt"
    os.symlink(victim, link)
    atomic_write_text(link, "new")
    assert victim.read_text() == "precious"
    assert not link.is_symlink() and link.read_text() == "new"
    # the file gets the umask's mode, not mkstemp's private 0600
    mask = os.umask(0)
    os.umask(mask)
    assert (link.stat().st_mode & 0o777) == (0o666 & ~mask)


@pytest.mark.parametrize("body,says", [
    ('[transport]\ncodec = "topk"\ncodec_params = { name = "x" }\n', "has no parameter 'name'"),
    ('[defense]\nname = "dnc"\nc = 1e308\n', "DnC.c = 1e+308"),
    ('[matrix]\nseeds = [1, 1]\n', "replicate indices must be distinct"),
])
def test_issue22_inputs_are_one_line_errors(tmp_path, capsys, body, says):
    """issue 22 §5: each of these was a traceback (TypeError, OverflowError, sqlite IntegrityError)."""
    from redteam.cli import main

    p = tmp_path / "s.toml"
    p.write_text('[federation]\nclients = 6\nrounds = 1\nmalicious_fraction = 0.34\n[attack]\nname = "sign_flip"\n'
                 + body)
    assert main(["matrix", str(p), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0] and "Traceback" not in err[0]


def test_a_5000_digit_integer_in_a_limits_file_is_one_line(tmp_path, capsys):
    from redteam.cli import main

    p = tmp_path / "lim.toml"
    p.write_text("[model]\nparams = " + "9" * 5000 + "\n")
    assert main(["limits", str(p)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "digits" in err[0]


def test_text_dir_with_a_non_utf8_file_name_is_one_line(tmp_path, capsys):
    """issue 22 §5: a document whose name's bytes are not UTF-8 crashed the manifests (UnicodeEncodeError)."""
    import os

    from redteam.cli import main

    d = tmp_path / "docs"
    (d / "pkg").mkdir(parents=True)
    with open(os.path.join(os.fsencode(d / "pkg"), b"bad\xff.txt"), "wb") as f:
        f.write(b"some text for the model to read. " * 40)
    (d / "pkg" / "good.txt").write_text("another document with text. " * 40)
    p = tmp_path / "t.toml"
    p.write_text(f'[workload]\nname = "text"\ntext_dir = "{d}"\ncontext = 8\nwidth = 8\nheads = 2\nlayers = 1\n'
                 '[federation]\nclients = 2\nrounds = 1\npartition = "iid"\n')
    assert main(["run", str(p)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not UTF-8" in err[0]


def test_text_dir_outside_the_scenario_and_working_directory_is_refused(tmp_path, capsys, monkeypatch):
    """issue 22 §4: text_dir was not confined as include is: a scenario from a pull request could
    make its training text (and its manifests) out of any readable directory."""
    from redteam.cli import main

    secret = tmp_path / "home" / ".ssh"
    secret.mkdir(parents=True)
    (secret / "id_ed25519").write_text("not really a key, but it would have been read. " * 20)
    work = tmp_path / "work"
    (work / "scen").mkdir(parents=True)
    p = work / "scen" / "t.toml"
    p.write_text(f'[workload]\nname = "text"\ntext_dir = "{secret}"\ncontext = 8\nwidth = 8\nheads = 2\nlayers = 1\n'
                 '[federation]\nclients = 2\nrounds = 1\npartition = "iid"\n')
    monkeypatch.chdir(work)
    assert main(["run", str(p), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "text_dir" in err[0] and "REDTEAM_ALLOW_TEXT_DIR_OUTSIDE" in err[0]
    # inside the working directory it is read (here it then fails later for another reason or runs)
    monkeypatch.setenv("REDTEAM_ALLOW_TEXT_DIR_OUTSIDE", "1")
    from redteam.scenario import load_scenario

    assert load_scenario(p).workload.params["text_dir"] == str(secret)


@pytest.mark.parametrize("env,msg", [({"REDTEAM_MAX_TEXT_FILES": "3"}, "more than 3 files"),
                                     ({"REDTEAM_MAX_TEXT_BYTES": "2000"}, "more than 2,000 bytes")])
def test_text_dir_too_many_files_or_bytes_is_one_line_before_reading(tmp_path, capsys, monkeypatch, env, msg):
    """issue 22 §4/§5: text_dir read every file whole, however many and however large; the
    tree is now capped (files and total bytes, each with a REDTEAM_MAX_* override) while it is
    listed, before anything is read."""
    from redteam.cli import main

    d = tmp_path / "docs"
    for i in range(5):
        (d / f"g{i}").mkdir(parents=True)
        (d / f"g{i}" / "doc.txt").write_text("a document with some words in it. " * 20)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    p = tmp_path / "t.toml"
    p.write_text(f'[workload]\nname = "text"\ntext_dir = "{d}"\ncontext = 8\nwidth = 8\nheads = 2\nlayers = 1\n'
                 '[federation]\nclients = 2\nrounds = 1\npartition = "iid"\n')
    assert main(["run", str(p)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and msg in err[0] and "REDTEAM_MAX_TEXT_" in err[0]


@pytest.mark.parametrize("network", [
    "bandwidth_mbps = 5e-324\n",
    "bandwidth_mbps = 1e-300\nbandwidth_sigma = 1000.0\ndeadline_s = 10.0\nstragglers = \"partial\"\n",
    "bandwidth_mbps = 5e-324\nrelay_fraction = 0.5\nloss = 0.3\ndeadline_s = 10.0\n",
])
def test_a_tiny_bandwidth_prints_no_numpy_warning(tmp_path, capsys, network):
    """issue 22 §7: numpy's 'overflow/divide by zero encountered' RuntimeWarnings leaked for
    tiny (legal) bandwidths; such an upload now takes forever, silently."""
    import warnings

    f = _scenario(tmp_path, TINY.format(name='"bw"') + "[transport.network]\n" + network)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert main(["run", str(f), "--quiet", "--device", "cpu"]) == 0
    assert "Warning" not in capsys.readouterr().err


# ------------------------------------------------------------------ a full disk (issue 22 §5)

FULL_MATRIX = TINY.replace("[attack]\nname = \"sign_flip\"\n[defense]\nname = \"mean\"\n",
                           '[matrix]\nattacks = ["sign_flip", "ipm"]\ndefenses = ["mean", "median"]\nseeds = 2\n')


def _store_fills_after(monkeypatch, n_runs: int) -> None:
    """SQLite's own "database or disk is full" (SQLITE_FULL) from the run after the first
    ``n_runs``: the store may not grow past the pages it has then."""
    from redteam.runner.store import ResultsStore

    put_run = ResultsStore.put_run
    stored = [0]

    def filling(self, **kw):
        if stored[0] == n_runs:
            pages = self._db.execute("PRAGMA page_count").fetchone()[0]
            self._db.execute(f"PRAGMA max_page_count = {pages}")
        stored[0] += 1
        return put_run(self, **kw)

    monkeypatch.setattr(ResultsStore, "put_run", filling)


def test_a_full_disk_mid_matrix_is_one_line_and_loses_nothing(tmp_path, capsys, monkeypatch):
    """Before: a sqlite3.OperationalError traceback (exit 1) that said nothing of the store."""
    import re

    from redteam.runner.matrix_run import run_matrix
    from redteam.runner.store import ResultsStore

    f = _scenario(tmp_path, FULL_MATRIX.format(name='"full"'))
    out = tmp_path / "o"
    with monkeypatch.context() as m:
        _store_fills_after(m, 3)
        assert main(["matrix", str(f), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    said = re.fullmatch(r"redteam: error: disk full while writing (.+): the results store (.+) is intact with "
                        r"(\d+) finished run\(s\); free space and re-run with --resume", err[0])
    assert said, err[0]
    assert said.group(1) == said.group(2) == str(out / "results.sqlite")
    with ResultsStore(out) as st:
        assert len(st.finished_keys()) == int(said.group(3)) >= 3
    assert main(["matrix", str(f), "--out", str(out), "--quiet", "--resume"]) == 0
    run_matrix(f, tmp_path / "ref")
    with ResultsStore(tmp_path / "ref") as a, ResultsStore(out) as b:
        assert a.canonical_dump() == b.canonical_dump()  # nothing stored was lost, nothing differs


def test_a_full_disk_writing_the_run_json_prints_the_results_and_one_line(tmp_path, capsys, monkeypatch):
    """Before: one line, but the run's results were gone (the table came after the JSON)."""
    import errno

    import redteam.runner.outputs as outputs

    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    f = _scenario(tmp_path, TINY.format(name='"t"'))
    out = tmp_path / "r.json"
    monkeypatch.setattr(outputs.os, "fsync", no_space)
    assert main(["run", str(f), "--quiet", "--device", "cpu", "--json", str(out)]) == 2
    printed, err = capsys.readouterr()
    assert "sign_flip" in printed  # the results, on the screen at least
    err_lines = err.strip().splitlines()
    assert err_lines == [f"redteam: error: disk full while writing {out}: the run's results are not saved (the "
                         "table above shows them); free space and run again"]
    assert not out.exists() and [p.name for p in tmp_path.iterdir() if p.name.startswith(".r.json")] == []


def _unshare_tmpfs_ok(tmp_path) -> bool:
    import shutil
    import subprocess

    if not shutil.which("unshare"):
        return False
    d = tmp_path / "probe"
    d.mkdir()
    r = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {d}"], capture_output=True)
    return r.returncode == 0


@pytest.fixture(scope="module")
def full_reference(tmp_path_factory):
    """The store an uninterrupted run of the full-disk matrix leaves (the same for every size)."""
    from redteam.runner.matrix_run import run_matrix

    tmp = tmp_path_factory.mktemp("full-reference")
    f = _scenario(tmp, FULL_MATRIX.format(name='"full"'))
    run_matrix(f, tmp / "ref")
    return tmp / "ref"


@pytest.mark.parametrize("size", ["60k", "120k", "300k"])
def test_a_really_full_disk_end_to_end(tmp_path, size, full_reference):
    """A real full file system (a small tmpfs in a private mount namespace): the matrix
    stops with one line, the store is never left malformed, and after space is freed
    --resume completes it to what an uninterrupted run stores. (Before: a traceback; and a
    store whose first write-ahead log could not be folded in was linked in place malformed,
    refused by every later run.)"""
    import shlex
    import subprocess
    import sys

    from redteam.runner.store import ResultsStore

    if not _unshare_tmpfs_ok(tmp_path):
        pytest.skip("cannot mount a tmpfs in a private mount namespace here (unshare -rm)")
    f = _scenario(tmp_path, FULL_MATRIX.format(name='"full"'))
    disk = tmp_path / "disk"
    disk.mkdir()
    q = shlex.quote
    matrix = f"{q(sys.executable)} -m redteam.cli matrix {q(str(f))} --out {q(str(disk / 'o'))} --quiet"
    script = (f"mount -t tmpfs -o size={size} tmpfs {q(str(disk))} || exit 99; "
              f"{matrix} > /dev/null 2> {q(str(tmp_path / 'err'))}; echo $? > {q(str(tmp_path / 'rc'))}; "
              f"mount -o remount,size=50m {q(str(disk))} && {matrix} --resume > /dev/null && "
              f"cp {q(str(disk / 'o' / 'results.sqlite'))} {q(str(tmp_path / 'after.sqlite'))}")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "rc").read_text().strip() == "2"
    err = (tmp_path / "err").read_text().strip().splitlines()
    assert len(err) == 1 and err[0].startswith("redteam: error: disk full while "), err
    assert "free space and re" in err[0]
    with ResultsStore(full_reference) as a, ResultsStore(tmp_path / "after.sqlite") as b:
        assert a.canonical_dump() == b.canonical_dump()
