"""`provenance ...` and `ledger ...` commands: outputs, exit codes, one-line errors."""

from __future__ import annotations

import base64
import json
import os
import sqlite3
import stat

import pytest

from provenance.cli import main
from provenance.keys import VerifyingKey
from provenance.ledger import verify_inclusion_document


def run(capsys, *argv):
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:  # argparse usage errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def work(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ds = tmp_path / "ds"
    ds.mkdir()
    (ds / "train.csv").write_bytes(b"x,y\n1,2\n")
    (ds / "README.md").write_bytes(b"# digits\n")
    assert run(capsys, "provenance", "keygen", "--out", "client")[0] == 0
    assert run(capsys, "provenance", "keygen", "--out", "log", "--type", "ed25519")[0] == 0
    assert run(capsys, "provenance", "manifest", "ds", "--client", "c1", "--dataset", "digits", "--version", "1",
               "--license", "MIT", "--created-at", "2025-01-01T00:00:00Z", "--out", "st.json")[0] == 0
    assert run(capsys, "ledger", "init", "log.db", "--key", "log.pem", "--origin", "cli.test/log",
               "--trusted-root", "trusted_root.json")[0] == 0
    return tmp_path


def one_line_error(code, err, expected=2):
    """Exit 2 = bad input, 1 = a check failed (the convention of every redteam command)."""
    assert code == expected, err
    assert err.startswith("redteam: error: ") and err.count("\n") == 1, err
    return err


def test_keygen(work, capsys):
    assert stat.S_IMODE(os.stat(work / "client.pem").st_mode) == 0o600
    code, out, _ = run(capsys, "provenance", "keygen", "--out", "k2", "--json", "--passphrase-env", "PW")
    one_line_error(*run(capsys, "provenance", "keygen", "--out", "k2", "--passphrase-env", "PW")[::2])
    os.environ["PW"] = "s3cret"
    try:
        code, out, _ = run(capsys, "provenance", "keygen", "--out", "k2", "--json", "--passphrase-env", "PW")
        assert code == 0
        info = json.loads(out)
        assert info["keyid"] == VerifyingKey.load(work / "k2.pub").keyid
        assert b"ENCRYPTED" in (work / "k2.pem").read_bytes()
        err = one_line_error(*run(capsys, "provenance", "keygen", "--out", "k2")[::2])
        assert "already exists" in err
    finally:
        del os.environ["PW"]


def test_manifest_to_stdout(work, capsys):
    code, out, _ = run(capsys, "provenance", "manifest", "ds", "--client", "c1", "--dataset", "digits",
                       "--version", "1", "--license", "MIT")
    st = json.loads(out)
    assert code == 0 and [r["name"] for r in st["predicate"]["resources"]] == ["README.md", "train.csv"]
    code, out, _ = run(capsys, "provenance", "manifest", "--shard", "a.bin=ds/train.csv", "--client", "c1",
                       "--dataset", "digits", "--version", "1", "--license", "MIT", "--out", "s.json", "--json")
    assert code == 0 and json.loads(out)["files"] == 1


def test_sign_log_and_verify_with_data(work, capsys):
    code, out, _ = run(capsys, "provenance", "sign", "st.json", "--key", "client.pem", "--ledger", "log.db",
                       "--log-key", "log.pem", "--out", "b.json")
    assert code == 0 and "log entry 0" in out
    code, out, _ = run(capsys, "provenance", "verify", "b.json", "--pub", "client.pub", "--trusted-root",
                       "trusted_root.json", "--data", "ds", "--require-tlog", "--json")
    info = json.loads(out)
    assert code == 0 and info["ok"] and info["logIndex"] == 0 and info["data"] == "match"
    code, out, _ = run(capsys, "provenance", "verify", "b.json", "--pub", "client.pub", "--ledger", "log.db")
    assert code == 0 and out.startswith("OK: https://model_signing/signature/v1.0")
    (work / "ds" / "train.csv").write_bytes(b"x,y\n1,3\n")  # poisoned shard under an honest manifest
    err = one_line_error(*run(capsys, "provenance", "verify", "b.json", "--pub", "client.pub", "--trusted-root",
                              "trusted_root.json", "--data", "ds")[::2], expected=1)  # a check failed
    assert "train.csv" in err and "sha256 differs" in err


def test_ledger_commands(work, capsys):
    assert run(capsys, "provenance", "sign", "st.json", "--key", "client.pem", "--format", "dsse",
               "--out", "e.json")[0] == 0
    code, out, _ = run(capsys, "ledger", "append", "log.db", "e.json", "--pub", "client.pub", "--key", "log.pem",
                       "--json", "--out", "b.json")
    assert code == 0 and json.loads(out)["logIndex"] == 0
    err = one_line_error(*run(capsys, "ledger", "append", "log.db", "e.json", "--pub", "client.pub",
                              "--key", "log.pem")[::2])
    assert "already in the log at index 0" in err
    for i in range(1, 4):
        run(capsys, "provenance", "sign", "st.json", "--key", "client.pem", "--format", "dsse", "--out", f"e{i}.json")
        assert run(capsys, "ledger", "append", "log.db", f"e{i}.json", "--pub", "client.pub", "--key", "log.pem")[0] == 0
    code, out, _ = run(capsys, "ledger", "prove", "log.db", "2", "--json")
    doc = json.loads(out)
    assert code == 0 and (doc["logIndex"], doc["treeSize"]) == (2, 4)
    log_pub = VerifyingKey.load(work / "log.pub")
    body = base64.b64decode(json.loads((work / "b.json").read_text())["verificationMaterial"]["tlogEntries"][0]
                            ["canonicalizedBody"])
    verify_inclusion_document(json.loads(run(capsys, "ledger", "prove", "log.db", "0", "--json")[1]), body,
                              log_pub, "cli.test/log")
    code, out, _ = run(capsys, "ledger", "prove", "log.db", "2")
    assert code == 0 and out.startswith("inclusion proof of entry 2") and "hash[1]" in out
    code, out, _ = run(capsys, "ledger", "consistency", "log.db", "1", "4", "--json")
    assert code == 0 and json.loads(out)["oldSize"] == 1
    code, out, _ = run(capsys, "ledger", "checkpoint", "log.db")
    assert code == 0 and out.startswith("cli.test/log\n4\n") and "\n\n\u2014 cli.test/log " in out
    code, out, _ = run(capsys, "ledger", "verify", "log.db", "--log-pub", "log.pub")
    assert code == 0 and out.startswith("ledger OK: 4 entries")
    code, out, _ = run(capsys, "ledger", "export", "log.db", "--out", "exp", "--json")
    assert code == 0 and (work / "exp" / "entries.jsonl").read_text().count("\n") == 4
    with sqlite3.connect(work / "log.db") as raw:
        raw.execute("DELETE FROM entries WHERE idx = 1")
    code, out, err = run(capsys, "ledger", "verify", "log.db")
    assert code == 1 and err.startswith("ledger FAILED") and "entries 1..1 are missing" in err
    code, out, _ = run(capsys, "ledger", "verify", "log.db", "--json")
    assert code == 1 and json.loads(out)["ok"] is False


def test_malformed_inputs_are_one_line_errors(work, capsys):
    run(capsys, "provenance", "sign", "st.json", "--key", "client.pem", "--format", "dsse", "--out", "e.json")
    env = json.loads((work / "e.json").read_text())
    (work / "trunc.json").write_text((work / "e.json").read_text()[:57])
    (work / "b64.json").write_text(json.dumps(dict(env, payload="%%%")))
    (work / "type.json").write_text(json.dumps(dict(env, payloadType="application/json")))
    cases = [
        (("provenance", "verify", "trunc.json", "--pub", "client.pub"), "truncated JSON"),
        (("provenance", "verify", "b64.json", "--pub", "client.pub"), "bad base64"),
        (("provenance", "verify", "type.json", "--pub", "client.pub"), "wrong payloadType"),
        (("provenance", "verify", "e.json", "--pub", "log.pub"), "is an Ed25519 key, expected a P-256 key"),
        (("provenance", "sign", "st.json", "--key", "log.pem"), "is an Ed25519 key"),
        (("provenance", "sign", "e.json", "--key", "client.pem"), "missing field '_type'"),
        (("ledger", "prove", "log.db", "0", "--tree-size", "7"), "tree size 7: the log has 0 entries"),
        (("ledger", "append", "log.db", "trunc.json", "--pub", "client.pub", "--key", "log.pem"), "truncated JSON"),
        (("ledger", "init", "log.db", "--key", "client.pem", "--origin", "x"), "expected an Ed25519 key"),
        (("ledger", "verify", "st.json"), "file is not a database"),
        (("provenance", "verify", "missing.json", "--pub", "client.pub"), "no such bundle or envelope file"),
        (("provenance", "manifest", "--client", "c", "--dataset", "d", "--version", "1", "--license", "MIT"),
         "give a dataset directory"),
    ]
    for argv, msg in cases:
        err = one_line_error(*run(capsys, *argv)[::2])
        assert msg in err, (argv, err)
    code, _, err = run(capsys, "ledger", "prove", "log.db", "zero")
    assert code == 2 and err.count("\n") == 1 and "invalid int value" in err


def test_sigstore_keyless_fails_cleanly_without_identity(work, capsys, monkeypatch):
    import sigstore.oidc

    monkeypatch.delenv("SIGSTORE_ID_TOKEN", raising=False)
    monkeypatch.setattr(sigstore.oidc, "detect_credential", lambda *a, **k: None)  # never look around
    err = one_line_error(*run(capsys, "provenance", "sign", "st.json", "--sigstore")[::2])
    assert "no OIDC identity token" in err
    err = one_line_error(*run(capsys, "provenance", "sign", "st.json", "--sigstore", "--identity-token",
                              "not-a-jwt")[::2])
    assert "keyless signing failed" in err
    run(capsys, "provenance", "sign", "st.json", "--key", "client.pem", "--out", "b.json")
    err = one_line_error(*run(capsys, "provenance", "verify", "b.json", "--identity", "me@example.org",
                              "--issuer", "https://issuer.example")[::2])
    assert "not a Sigstore keyless bundle" in err and "certificate" in err


def test_verify_with_a_trusted_root_refuses_a_bundle_whose_log_entry_was_removed(work, capsys):
    assert run(capsys, "provenance", "sign", "st.json", "--key", "client.pem", "--ledger", "log.db",
               "--log-key", "log.pem", "--out", "b.json")[0] == 0
    b = json.loads((work / "b.json").read_text())
    env = b["dsseEnvelope"]
    b["verificationMaterial"]["tlogEntries"] = []
    (work / "stripped.json").write_text(json.dumps(b))
    (work / "bare.json").write_text(json.dumps(env))
    for f in ("stripped.json", "bare.json"):
        for trust in (("--trusted-root", "trusted_root.json"), ("--ledger", "log.db")):
            err = one_line_error(*run(capsys, "provenance", "verify", f, "--pub", "client.pub", *trust)[::2],
                                 expected=1)  # verification failed
            assert "no transparency-log entry" in err and "relaxes" in err, err
            code, out, _ = run(capsys, "provenance", "verify", f, "--pub", "client.pub", *trust,
                               "--allow-missing-tlog")
            assert code == 0 and out.startswith("OK: "), out
    # without any trusted log there is nothing to require
    assert run(capsys, "provenance", "verify", "stripped.json", "--pub", "client.pub")[0] == 0
    err = one_line_error(*run(capsys, "provenance", "verify", "b.json", "--pub", "client.pub", "--trusted-root",
                              "trusted_root.json", "--require-tlog", "--allow-missing-tlog")[::2])
    assert "contradict" in err


def test_ledger_verify_fails_when_an_integrated_time_is_edited(work, capsys):
    assert run(capsys, "provenance", "sign", "st.json", "--key", "client.pem", "--ledger", "log.db",
               "--log-key", "log.pem", "--out", "b.json")[0] == 0
    assert run(capsys, "ledger", "verify", "log.db", "--log-pub", "log.pub")[0] == 0
    with sqlite3.connect(work / "log.db", isolation_level=None) as raw:
        raw.execute("UPDATE entries SET integrated_time = integrated_time - 3600 WHERE idx = 0")
    code, out, err = run(capsys, "ledger", "verify", "log.db", "--log-pub", "log.pub")
    assert code == 1 and "entry 0: its signed entry timestamp does not verify" in err, (out, err)
