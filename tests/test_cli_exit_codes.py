"""One exit-status convention for every command (issue 11 §3): 0 ok, 1 a check failed,
2 bad input, errors one line with the ``redteam: error:`` prefix; ``--created-at`` is
validated before it is signed into a statement."""

from __future__ import annotations

import json

import pytest

from redteam.cli import main


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def ds(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "a.csv").write_bytes(b"x\n1\n")
    return tmp_path


MANIFEST = ["provenance", "manifest", "ds", "--client", "c1", "--dataset", "d", "--version", "1", "--license", "MIT"]


@pytest.mark.parametrize("stamp", ["yesterday", "2025-02-30T00:00:00Z", "2025-01-01T00:00:00", "2025-01-01 00:00Z",
                                   "2025-01-01T00:00:00Z\n"])
def test_created_at_must_be_rfc3339(ds, capsys, stamp):
    code, out, err = _run(capsys, *MANIFEST, "--created-at", stamp, "--out", "st.json")
    assert code == 2 and out == ""
    assert err.startswith("redteam: error: --created-at ") and "RFC 3339" in err and err.count("\n") == 1
    assert not (ds / "st.json").exists()


@pytest.mark.parametrize("stamp", ["2025-01-01T00:00:00Z", "2025-06-30T23:59:59.123+02:00"])
def test_created_at_rfc3339_is_written_as_given(ds, capsys, stamp):
    code, _, err = _run(capsys, *MANIFEST, "--created-at", stamp, "--out", "st.json")
    assert code == 0, err
    assert stamp in (ds / "st.json").read_text()


def test_provenance_bad_input_exits_2_and_a_failed_check_exits_1(ds, capsys):
    assert _run(capsys, "provenance", "keygen", "--out", "k")[0] == 0
    assert _run(capsys, *MANIFEST, "--created-at", "2025-01-01T00:00:00Z", "--out", "st.json")[0] == 0
    assert _run(capsys, "provenance", "sign", "st.json", "--key", "k.pem", "--out", "b.json")[0] == 0
    # bad input: a missing file, JSON that is not a bundle
    code, _, err = _run(capsys, "provenance", "verify", "missing.json", "--pub", "k.pub")
    assert code == 2 and err.startswith("redteam: error: ") and err.count("\n") == 1
    (ds / "junk.json").write_text("[1, 2")
    code, _, err = _run(capsys, "provenance", "verify", "junk.json", "--pub", "k.pub")
    assert code == 2 and err.startswith("redteam: error: ")
    # a check that fails: the data no longer matches the signed manifest
    assert _run(capsys, "provenance", "verify", "b.json", "--pub", "k.pub", "--data", "ds")[0] == 0
    (ds / "ds" / "a.csv").write_bytes(b"x\n2\n")
    code, _, err = _run(capsys, "provenance", "verify", "b.json", "--pub", "k.pub", "--data", "ds")
    assert code == 1 and err.startswith("redteam: error: ") and "differs" in err
    # a signature by another key is a failed check too
    assert _run(capsys, "provenance", "keygen", "--out", "other")[0] == 0
    code, _, err = _run(capsys, "provenance", "verify", "b.json", "--pub", "other.pub")
    assert code == 1 and err.startswith("redteam: error: ")
    # usage errors: one line, exit 2
    with pytest.raises(SystemExit) as ei:
        main(["ledger", "prove", "log.db", "zero"])
    err = capsys.readouterr().err
    assert ei.value.code == 2 and err.startswith("redteam: error: ") and err.count("\n") == 1


def test_keyid_printed_by_keygen_is_the_one_verify_reports(ds, capsys):
    code, out, _ = _run(capsys, "provenance", "keygen", "--out", "k", "--json")
    keyid = json.loads(out)["keyid"]
    _run(capsys, *MANIFEST, "--created-at", "2025-01-01T00:00:00Z", "--out", "st.json")
    _run(capsys, "provenance", "sign", "st.json", "--key", "k.pem", "--out", "b.json")
    code, out, _ = _run(capsys, "provenance", "verify", "b.json", "--pub", "k.pub")
    assert code == 0 and f"signed by {keyid}" in out


def test_error_messages_show_the_full_keyid_keygen_printed(ds, capsys):
    keyids = {}
    for name in ("k", "other"):
        code, out, _ = _run(capsys, "provenance", "keygen", "--out", name, "--json")
        keyids[name] = json.loads(out)["keyid"]
    _run(capsys, *MANIFEST, "--created-at", "2025-01-01T00:00:00Z", "--out", "st.json")
    _run(capsys, "provenance", "sign", "st.json", "--key", "k.pem", "--out", "b.json")
    code, _, err = _run(capsys, "provenance", "verify", "b.json", "--pub", "other.pub")
    assert code == 1 and keyids["other"] in err  # the key the user passed, as keygen named it
    doc = json.loads((ds / "b.json").read_text())
    doc["verificationMaterial"]["publicKey"].pop("hint", None)
    (ds / "nohint.json").write_text(json.dumps(doc))
    code, _, err = _run(capsys, "provenance", "verify", "nohint.json", "--pub", "other.pub")
    assert code == 1 and (keyids["k"] in err or keyids["other"] in err), err


def test_provenance_outputs_do_not_write_through_a_symlink(ds, capsys):
    import os

    victim = ds / "victim.txt"
    victim.write_text("precious")
    os.symlink(victim, ds / "st.json")
    code, _, err = _run(capsys, *MANIFEST, "--created-at", "2025-01-01T00:00:00Z", "--out", "st.json")
    assert code == 0, err
    assert victim.read_text() == "precious"
    assert not (ds / "st.json").is_symlink() and "2025-01-01T00:00:00Z" in (ds / "st.json").read_text()
