"""Dataset manifests in the model-signing v1.0 layout: builders, parser, checks, interop."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from provenance import dsse
from provenance.bundle import make_bundle
from provenance.errors import ProvenanceError, VerificationFailed
from provenance.intoto import Statement
from provenance.keys import SigningKey
from provenance.manifest import DEFAULT_IGNORE, PREDICATE_TYPE, DatasetManifest

META = dict(client="client-7", dataset="digits", version="1.2", license="CC-BY-4.0",
            license_source="https://example.org/LICENSE", source="https://example.org/digits",
            creator="lab", created_at="2025-03-01T12:00:00Z")

try:
    import model_signing  # noqa: F401

    HAVE_MODEL_SIGNING = True
except Exception:  # pragma: no cover - depends on the environment
    HAVE_MODEL_SIGNING = False
needs_model_signing = pytest.mark.skipif(not HAVE_MODEL_SIGNING,
                                         reason="model_signing (test-only dependency) is not importable")


@pytest.fixture
def dataset(tmp_path):
    root = tmp_path / "ds"
    (root / "a").mkdir(parents=True)
    (root / "a" / "b").write_bytes(b"hi\n")
    (root / "a-c").write_bytes(b"yo\n")
    (root / ".git").mkdir()
    (root / ".git" / "config").write_bytes(b"ignored")
    return root


def test_layout_and_digests_by_hand(dataset):
    m = DatasetManifest.from_directory(dataset, **META)
    # model-signing sorts resources as PurePosixPath does, component-wise: "a/b" < "a-c"
    # (plain string order would put "a-c" first, since "-" < "/").
    assert [f.name for f in m.files] == ["a/b", "a-c"]
    d1, d2 = hashlib.sha256(b"hi\n").digest(), hashlib.sha256(b"yo\n").digest()
    assert m.root_digest() == hashlib.sha256(d1 + d2).hexdigest()
    st = json.loads(m.to_json())
    assert st["_type"] == "https://in-toto.io/Statement/v1"
    assert st["predicateType"] == PREDICATE_TYPE == "https://model_signing/signature/v1.0"
    assert st["subject"] == [{"name": "ds", "digest": {"sha256": hashlib.sha256(d1 + d2).hexdigest()}}]
    assert st["predicate"]["serialization"] == {"method": "files", "hash_type": "sha256", "allow_symlinks": False,
                                                "ignore_paths": list(DEFAULT_IGNORE)}
    assert st["predicate"]["resources"] == [{"name": "a/b", "algorithm": "sha256", "digest": d1.hex()},
                                            {"name": "a-c", "algorithm": "sha256", "digest": d2.hex()}]
    ds = st["predicate"]["dataset"]
    assert ds["files"][0] == {"name": "a/b", "size": 3, "sha256": d1.hex(), "mediaType": "application/octet-stream"}
    assert ds["license"] == {"spdxId": "CC-BY-4.0", "assertedIn": "https://example.org/LICENSE"}
    assert (ds["client"], ds["name"], ds["version"], ds["createdAt"]) == ("client-7", "digits", "1.2",
                                                                        "2025-03-01T12:00:00Z")


def test_parse_round_trip(dataset):
    m = DatasetManifest.from_directory(dataset, **META)
    assert DatasetManifest.from_statement(m.to_json()) == m


def test_shards_and_checks():
    shards = {"train/0.csv": b"1,2\n", "train/1.csv": b"3,4\n"}
    m = DatasetManifest.from_shards(shards, **META)
    assert m.files[0].media_type == "text/csv" and m.name == "digits"
    assert m.check_shards(shards) == []
    poisoned = dict(shards, **{"train/1.csv": b"3,9\n"})
    assert m.check_shards(poisoned) == ["shard 'train/1.csv': sha256 differs from the manifest"]
    extra = dict(shards, **{"train/2.csv": b""})
    assert m.check_shards(extra) == ["extra shard 'train/2.csv' is not in the manifest"]
    with pytest.raises(VerificationFailed, match="shard 'train/0.csv' is missing"):
        m.verify_shards({"train/1.csv": shards["train/1.csv"]})


def test_directory_checks(dataset):
    m = DatasetManifest.from_directory(dataset, **META)
    assert m.check_directory(dataset) == []
    (dataset / "a-c").write_bytes(b"yO\n")
    (dataset / "new").write_bytes(b"")
    assert m.check_directory(dataset) == ["extra file 'new' is not in the manifest",
                                          "file 'a-c': sha256 differs from the manifest"]
    with pytest.raises(VerificationFailed, match=r"\(\+1 more\)"):
        m.verify_directory(dataset)


def test_symlinks_are_refused_unless_allowed(dataset):
    os.symlink(dataset / "a-c", dataset / "link")
    with pytest.raises(ProvenanceError, match="is a symlink"):
        DatasetManifest.from_directory(dataset, **META)
    m = DatasetManifest.from_directory(dataset, allow_symlinks=True, **META)
    assert [f.name for f in m.files] == ["a/b", "a-c", "link"]


@pytest.mark.parametrize("edit,exc,msg", [
    (lambda p: p["resources"].reverse(), ProvenanceError, "unique and sorted"),
    (lambda p: p["resources"][0].update(algorithm="md5"), ProvenanceError, "downgrade"),
    (lambda p: p["resources"][0].update(name="../etc/passwd"), ProvenanceError, "normalized relative"),
    (lambda p: p["dataset"]["files"][0].update(sha256="00" * 32), VerificationFailed, "does not match resources"),
    (lambda p: p["resources"][0].update(digest="00" * 32), VerificationFailed, "subject digest"),
    (lambda p: p["dataset"].pop("client"), ProvenanceError, "missing field 'client'"),
    (lambda p: p["serialization"].update(hash_type="blake2"), ProvenanceError, "hash_type"),
])
def test_inconsistent_manifests_are_rejected(dataset, edit, exc, msg):
    st = json.loads(DatasetManifest.from_directory(dataset, **META).to_json())
    edit(st["predicate"])
    with pytest.raises(exc, match=msg):
        DatasetManifest.from_statement(json.dumps(st))


def test_subject_without_sha256_is_a_downgrade():
    st = {"_type": "https://in-toto.io/Statement/v1", "subject": [{"name": "x", "digest": {"md5": "0" * 32}}],
          "predicateType": PREDICATE_TYPE, "predicate": {}}
    with pytest.raises(ProvenanceError, match="sha256 is required"):
        Statement.from_json(json.dumps(st))


def test_bad_metadata_is_named():
    with pytest.raises(ProvenanceError, match="license = 'MIT; rm -rf'"):
        DatasetManifest.from_shards({"a": b""}, **dict(META, license="MIT; rm -rf"))
    with pytest.raises(ProvenanceError, match="has no files"):
        DatasetManifest.from_shards({}, **META)
    with pytest.raises(ProvenanceError, match="shard 'a': expected bytes"):
        DatasetManifest.from_shards({"a": "text"}, **META)  # type: ignore[dict-item]


@needs_model_signing
def test_statement_equals_what_model_signing_itself_signs(dataset, tmp_path):
    """Same serialization, resources and subject digest as model_signing's own payload."""
    import base64

    import model_signing

    key = SigningKey.generate()
    key.save(tmp_path / "k.pem")
    model_signing.signing.Config().use_elliptic_key_signer(private_key=tmp_path / "k.pem").sign(
        dataset, tmp_path / "theirs.sig")
    theirs = json.loads(base64.b64decode(json.loads((tmp_path / "theirs.sig").read_text())["dsseEnvelope"]["payload"]))
    ours = json.loads(DatasetManifest.from_directory(dataset, **META).to_json())
    assert ours["subject"] == theirs["subject"]
    assert ours["predicate"]["resources"] == theirs["predicate"]["resources"]
    ours_ser, theirs_ser = dict(ours["predicate"]["serialization"]), dict(theirs["predicate"]["serialization"])
    # model_signing lists ignore_paths in set order, so compare them as sets
    assert set(ours_ser.pop("ignore_paths")) == set(theirs_ser.pop("ignore_paths"))
    assert ours_ser == theirs_ser


@needs_model_signing
def test_model_signing_key_verification_accepts_our_bundle(dataset, tmp_path):
    import model_signing

    key = SigningKey.generate()
    key.public.save(tmp_path / "k.pub")
    m = DatasetManifest.from_directory(dataset, **META)
    bundle = make_bundle(dsse.sign(m.to_json(), key), key.public)
    (tmp_path / "ds.sig").write_text(json.dumps(bundle))
    verifier = model_signing.verifying.Config().use_elliptic_key_verifier(public_key=tmp_path / "k.pub")
    verifier.verify(dataset, tmp_path / "ds.sig")
    # a one-byte change in a file is caught by model_signing too
    (dataset / "a" / "b").write_bytes(b"hI\n")
    with pytest.raises(ValueError, match="Hash mismatch for 'a/b'"):
        model_signing.verifying.Config().use_elliptic_key_verifier(public_key=tmp_path / "k.pub").verify(
            dataset, tmp_path / "ds.sig")
    # and a bundle signed by another key is refused
    other = SigningKey.generate()
    (tmp_path / "other.sig").write_text(json.dumps(make_bundle(dsse.sign(m.to_json(), other), other.public)))
    with pytest.raises(ValueError, match="Key mismatch"):
        verifier.verify(dataset, tmp_path / "other.sig")
