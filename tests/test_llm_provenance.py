"""The provenance gate on the text workload: manifests list the corpus files (issue 10).

Worked examples: a hand-built three-file ``text_dir``; each client's manifest lists
exactly the files its training windows were cut from, with digests computed here by
``hashlib`` over the files on disk; an auditor verifies it against the directory with
``DatasetManifest.verify_directory`` (what ``redteam provenance verify --data DIR``
does); the gate's attestation catches windows that are not their document's bytes.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from provenance import dsse
from provenance.errors import VerificationFailed
from provenance.manifest import DatasetManifest
from redteam.federation.loop import Federation
from redteam.federation.provenance import UNATTRIBUTED, corpus_shards
from redteam.scenario import parse_scenario
from redteam.types import ClientData
from redteam.workloads.corpus import CorpusIndex, Document, windows

# notes.txt is held out (the smallest name hash of the three, heldout_fraction 0.1 → 1 of 3);
# docs/guide.md and code.py are the training documents, one group each ("docs", "code.py")
GUIDE = b"# Guide\n\nThe quick brown fox jumps over the lazy dog. " * 6  # (8 + 1 + 45) · 6 = 324 bytes
CODE = b"def add(a, b):\n    return a + b\n" * 5  # (15 + 17) · 5 = 160 bytes
NOTES = b"held-out notes: nobody trains on these bytes.\n" * 3


def _corpus(root: Path) -> Path:
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "guide.md").write_bytes(GUIDE)
    (root / "code.py").write_bytes(CODE)
    (root / "notes.txt").write_bytes(NOTES)
    return root


def _scenario(text_dir: Path, attack: dict[str, Any] | None = None, partition: str = "by_group",
              **workload: Any) -> Any:
    return parse_scenario({
        "scenario": {"name": "llm-provenance", "seed": 3},
        "workload": {"name": "text", "text_dir": str(text_dir), "context": 16, "width": 8, "layers": 1,
                     "heads": 2, "heldout_fraction": 0.1, "eval_windows": 8, **workload},
        "federation": {"clients": 2, "rounds": 1, "partition": partition, "local_steps": 1, "batch_size": 2,
                       "lr": 0.01, "malicious_fraction": 0.5, "root_samples": 0},
        "transport": {"codec": "none"},
        "attack": attack or {"name": "none"},
        "defense": {"pipeline": [{"name": "provenance_gate"}, {"name": "mean"}]},
    })


def _manifests(fed: Federation) -> dict[int, DatasetManifest]:
    """The curators' manifests the gate checked."""
    return fed.admission.manifests


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def test_corpus_index_by_hand() -> None:
    # context 2: "abcde" gives (5 − 1) // 2 = 2 windows "abc" (offset 0), "cde" (offset 2);
    # "xyz" gives 1 window (offset 0); "q" gives none
    docs = [Document("a", "a", b"abcde"), Document("b", "b", b"xyz"), Document("c", "c", b"q")]
    w, owner = windows(docs, 2)
    idx = CorpusIndex.of(docs, owner, 2)
    assert [bytes(r) for r in w] == [b"abc", b"cde", b"xyz"]
    assert idx.doc.tolist() == [0, 0, 1] and idx.offset.tolist() == [0, 2, 0]


def _tiny() -> tuple[CorpusIndex, torch.Tensor]:
    # "abcde" truncated from "abcdefgh" (whole file bytes kept), and "xyz"
    docs = [Document("a.txt", "a", b"abcde", "/x/a.txt", b"abcdefgh"), Document("d/b.txt", "d", b"xyz")]
    w, owner = windows(docs, 2)
    return CorpusIndex.of(docs, owner, 2), torch.from_numpy(w.astype(np.int64))


def test_corpus_shards_by_hand() -> None:
    idx, w = _tiny()
    rows = np.array([2, 0])  # the client holds "xyz" and "abc"
    clean = ClientData(w[rows, :-1], w[rows, 1:])
    # every claimed document, as its file holds it (a.txt whole: 8 bytes, not the 5 used)
    assert corpus_shards(clean, idx, rows) == {"a.txt": b"abcdefgh", "d/b.txt": b"xyz"}
    # sample 1's last target "c" (99) → "!" (33): no longer its document's bytes
    y = clean.y.clone()
    y[1, 1] = 33
    got = corpus_shards(ClientData(clean.x, y), idx, rows)
    # the unattributed shard: x row "ab" then y row "b!", each byte an int64 little-endian
    want = b"".join(v.to_bytes(8, "little") for v in (97, 98, 98, 33))
    assert got == {"a.txt": b"abcdefgh", "d/b.txt": b"xyz", UNATTRIBUTED: want}
    # a sample the partition never gave the client (beyond its claims) is unattributed too
    extra = ClientData(torch.cat([clean.x, w[1:2, :-1]]), torch.cat([clean.y, w[1:2, 1:]]))
    assert corpus_shards(extra, idx, rows)[UNATTRIBUTED] == b"".join(
        v.to_bytes(8, "little") for v in (99, 100, 100, 101))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.binary(min_size=0, max_size=40), min_size=1, max_size=4), st.integers(2, 5),
       st.integers(0, 2**32 - 1), st.booleans())
def test_any_changed_training_byte_is_unattributed(texts: list[bytes], context: int, seed: int,
                                                   in_x: bool) -> None:
    docs = [Document(f"f{i}", f"f{i}", t) for i, t in enumerate(texts)]
    w, owner = windows(docs, context)
    if len(w) == 0:
        return
    idx = CorpusIndex.of(docs, owner, context)
    rng = np.random.default_rng(seed)
    rows = rng.choice(len(w), size=int(rng.integers(1, len(w) + 1)), replace=False)
    wt = torch.from_numpy(w.astype(np.int64))
    x, y = wt[rows, :-1].clone(), wt[rows, 1:].clone()
    clean = corpus_shards(ClientData(x, y), idx, rows)
    assert clean == {f"f{d}": texts[d] for d in set(owner[rows].tolist())}
    r, j = int(rng.integers(len(rows))), int(rng.integers(context))
    t = x if in_x else y
    t[r, j] = (t[r, j] + 1) % 256
    assert UNATTRIBUTED in corpus_shards(ClientData(x, y), idx, rows)


def test_each_clients_manifest_lists_exactly_its_files(tmp_path: Path) -> None:
    root = _corpus(tmp_path / "corpus")
    fed = Federation(_scenario(root))
    ms = _manifests(fed)
    # by_group, 2 groups, 2 clients: one file each; which one is read off the client's first window
    by_file = {}
    for c, m in ms.items():
        first = bytes(fed.data.client(c).x[0].to(torch.uint8).tolist())
        name = "docs/guide.md" if GUIDE.startswith(first) else "code.py"
        assert (CODE if name == "code.py" else GUIDE).startswith(first)
        by_file[name] = c
        data = GUIDE if name == "docs/guide.md" else CODE
        assert [(f.name, f.size, f.sha256) for f in m.files] == [(name, len(data), _sha(data))]
        # everything else under the directory is outside this manifest: the other training
        # file (or its directory) and the held-out notes
        assert m.ignore_paths == (("code.py", "notes.txt") if name == "docs/guide.md" else ("docs", "notes.txt"))
        assert m.client == f"client-{c}" and m.license == "NOASSERTION"
        # the auditor's check of the files on disk (redteam provenance verify --data DIR)
        m.verify_directory(root)
        assert DatasetManifest.from_statement(m.to_json()).check_directory(root) == []
    assert sorted(by_file) == ["code.py", "docs/guide.md"]
    # the gate admitted both honest clients, and it checked the same manifests it was shown
    assert fed.admission.excluded == {}
    # a changed listed file fails its client's check and no other's
    (root / "code.py").write_bytes(CODE.replace(b"a + b", b"a - b"))
    with pytest.raises(VerificationFailed, match="file 'code.py': sha256 differs from the manifest"):
        ms[by_file["code.py"]].verify_directory(root)
    ms[by_file["docs/guide.md"]].verify_directory(root)
    # a new file under the directory is in no manifest
    (root / "docs" / "new.md").write_bytes(b"new")
    with pytest.raises(VerificationFailed, match="extra file 'docs/new.md' is not in the manifest"):
        ms[by_file["docs/guide.md"]].verify_directory(root)


def test_iid_clients_list_every_file_their_windows_come_from(tmp_path: Path) -> None:
    # iid over windows: guide.md gives (324 − 1) // 16 = 20 windows, code.py (160 − 1) // 16 = 9;
    # each client's manifest lists exactly the files one of its windows is a slice of (at a
    # multiple of 16: the stride), found here by searching the file contents
    root = _corpus(tmp_path / "corpus")
    fed = Federation(_scenario(root, partition="iid"))
    files = {"docs/guide.md": GUIDE, "code.py": CODE}
    total = 0
    for c, m in _manifests(fed).items():
        x = fed.data.client(c).x
        total += len(x)
        want = set()
        for row in x.tolist():
            w = bytes(row)
            want |= {n for n, b in files.items() if any(b[o:o + 16] == w for o in range(0, len(b) - 16, 16))}
        assert [f.name for f in m.files] == sorted(want, key=lambda n: tuple(n.split("/")))
        assert {f.name: f.sha256 for f in m.files} == {n: _sha(files[n]) for n in want}
        m.verify_directory(root)
    assert total == 20 + 9


def test_a_truncated_file_is_listed_as_it_is_on_disk(tmp_path: Path) -> None:
    # max_doc_bytes 100: the windows come from the first 100 bytes of each file, and the
    # manifests still list the files on disk (324 and 160 bytes): the used bytes are a
    # prefix of what they list
    root = _corpus(tmp_path / "corpus")
    fed = Federation(_scenario(root, max_doc_bytes=100))
    ms = _manifests(fed)
    files = {f.name: (f.size, f.sha256) for m in ms.values() for f in m.files}
    assert files == {"docs/guide.md": (324, _sha(GUIDE)), "code.py": (160, _sha(CODE))}
    for m in ms.values():
        m.verify_directory(root)
    assert fed.admission.excluded == {}


def test_symlinks_and_unused_files_are_outside_the_manifest(tmp_path: Path) -> None:
    root = _corpus(tmp_path / "corpus")
    os.symlink(root / "code.py", root / "docs" / "link.py")  # the corpus skips symlinks
    fed = Federation(_scenario(root))
    for m in _manifests(fed).values():
        if m.files[0].name == "docs/guide.md":
            assert m.ignore_paths == ("code.py", "docs/link.py", "notes.txt")
        m.verify_directory(root)


@pytest.mark.parametrize("attack, reason", [
    ("manifest_mismatch", ("provenance gate: attestation: the shards trained on do not match the manifest: "
                           f"extra shard '{UNATTRIBUTED}' is not in the manifest")),
    ("stolen_key", None),  # the poisoned windows, signed with the stolen key: the gate cannot tell
])
def test_the_gate_attests_text_clients(tmp_path: Path, attack: str, reason: str | None) -> None:
    # the attacker flips every next-byte target (y ↦ 255 − y) after its curator signed the
    # manifest of its clean documents; its windows are then not its documents' bytes
    root = _corpus(tmp_path / "corpus")
    fed = Federation(_scenario(root, {"name": attack, "num_classes": 256}))
    assert len(fed.malicious) == 1
    (bad,) = fed.malicious
    if reason is None:
        assert fed.admission.excluded == {}
    else:
        assert fed.admission.excluded == {bad: reason}
    rec = fed.run().records[0]
    assert rec.accepted[1 - bad] and bool(rec.accepted[bad]) == (reason is None)


def test_classifier_manifests_are_unchanged() -> None:
    # digits has no corpus: each manifest still lists its two tensor shards, x as float32 LE
    # and y as int64 LE, hashed here from the client's clean tensors
    sc = parse_scenario({
        "scenario": {"seed": 1}, "workload": {"name": "digits"},
        "federation": {"clients": 2, "rounds": 1, "partition": "iid", "local_steps": 1},
        "defense": {"pipeline": [{"name": "provenance_gate"}, {"name": "mean"}]},
    })
    fed = Federation(sc)
    for c, m in fed.admission.manifests.items():
        cd = fed.data.client(c)
        x = cd.x.float().numpy().astype("<f4").tobytes()
        y = cd.y.long().numpy().astype("<i8").tobytes()
        assert [(f.name, f.size, f.sha256) for f in m.files] == [("x.f32", len(x), _sha(x)), ("y.i64", len(y), _sha(y))]
        assert m.ignore_paths == ()


def test_signed_text_manifest_round_trips(tmp_path: Path) -> None:
    # the envelope the gate verified parses back to a manifest with the same files and ignore_paths
    root = _corpus(tmp_path / "corpus")
    fed = Federation(_scenario(root))
    m = _manifests(fed)[0]
    env = dsse.sign_json(m.to_json(), fed.enrollment.keys[0])
    back = DatasetManifest.from_statement(dsse.verify(dsse.Envelope.from_json(env), fed.enrollment.public[0]).payload)
    assert back.files == m.files and back.ignore_paths == m.ignore_paths


def test_cli_verifies_a_text_clients_signed_manifest_against_the_directory(tmp_path: Path, capsys: Any) -> None:
    # the auditor's command line: `redteam provenance verify ENVELOPE --pub KEY --data DIR`
    from provenance.cli import main

    root = _corpus(tmp_path / "corpus")
    fed = Federation(_scenario(root))
    for c, m in _manifests(fed).items():
        env, pub = tmp_path / f"client-{c}.dsse.json", tmp_path / f"client-{c}.pub"
        env.write_bytes(dsse.sign_json(m.to_json(), fed.enrollment.keys[c]))
        fed.enrollment.public[c].save(pub)
        assert main(["provenance", "verify", str(env), "--pub", str(pub), "--data", str(root)]) == 0
        out = capsys.readouterr().out
        assert "data matches the manifest (1 file(s), dataset 'text' '1')" in out
    # one changed byte in a listed file: that client's check fails (exit 1, one line)
    c = next(c for c, m in _manifests(fed).items() if m.files[0].name == "code.py")
    (root / "code.py").write_bytes(b"#" + CODE[1:])
    code = main(["provenance", "verify", str(tmp_path / f"client-{c}.dsse.json"), "--pub",
                 str(tmp_path / f"client-{c}.pub"), "--data", str(root)])
    err = capsys.readouterr().err
    assert code == 1 and "file 'code.py': sha256 differs from the manifest" in err and err.count("\n") == 1


def test_stdlib_manifest_lists_the_interpreters_files() -> None:
    # default corpus: every listed stdlib/<path> is the file <stdlib>/<path> on disk, every
    # pydoc_topics/<topic> the topic's text in UTF-8; hashed here independently
    import sysconfig

    from pydoc_data.topics import topics

    from redteam.federation.provenance import corpus_manifest
    from redteam.workloads.text import TextLM

    ds = TextLM(max_bytes=60_000, max_doc_bytes=4096).load(0)
    assert ds.corpus is not None and ds.corpus.root == ""
    rows = np.arange(0, len(ds.train_x), 3)
    m = corpus_manifest(0, corpus_shards(ClientData(ds.train_x[rows], ds.train_y[rows]), ds.corpus, rows),
                        "text", ds.corpus)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    assert m.license == "PSF-2.0" and str(stdlib) in m.source and len(m.files) >= 2
    for f in m.files:
        top, rest = f.name.split("/", 1)
        data = (stdlib / rest).read_bytes() if top == "stdlib" else topics[rest].encode("utf-8")
        assert (f.size, f.sha256) == (len(data), _sha(data)), f.name
    # exactly the documents of the sampled windows
    assert {f.name for f in m.files} == {ds.corpus.documents[d].name for d in set(ds.corpus.doc[rows].tolist())}
