"""Dataset manifests in the OpenSSF model-signing v1.0 layout, with dataset fields.

The statement is exactly what ``model_signing`` (sigstore/model-transparency, v1.0
predicate ``https://model_signing/signature/v1.0``) signs for a directory with its
``files`` serialization, so its key-based verifier accepts our bundles:

* ``predicate.serialization`` = ``{"method": "files", "hash_type": "sha256",
  "allow_symlinks": false, "ignore_paths": [...]}``;
* ``predicate.resources`` = one ``{"name", "algorithm", "digest"}`` per regular file,
  ``name`` the POSIX path relative to the root, sorted the way model-signing sorts
  (``pathlib.PurePosixPath`` order, i.e. component by component: ``a/b`` < ``a-c``);
* one subject, named after the directory, whose ``sha256`` is SHA-256 over the
  concatenated raw resource digests in that order.

Verifiers of the v1.0 predicate ignore other predicate fields, so the dataset facts go
in ``predicate.dataset``: client, dataset name and version, files (size, sha256, media
type), license (SPDX expression and where it was asserted), source, creator,
created-at, generated-by. The parser checks that both views agree.
"""

from __future__ import annotations

import hashlib
import mimetypes
import os
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any, Iterable, Mapping

from . import _codec
from .errors import ProvenanceError, VerificationFailed, one_line
from .intoto import Statement

__all__ = [
    "PREDICATE_TYPE",
    "DEFAULT_IGNORE",
    "DatasetManifest",
    "FileEntry",
    "resource_sort_key",
]

PREDICATE_TYPE = "https://model_signing/signature/v1.0"
#: model-signing's default ignored paths (git metadata), in its order.
DEFAULT_IGNORE: tuple[str, ...] = (".git", ".github", ".gitignore", ".gitattributes")
GENERATED_BY = "redteam-provenance/0.1.0"
_SPDX = re.compile(r"[A-Za-z0-9.+\-:() ]+")


def resource_sort_key(name: str) -> tuple[str, ...]:
    """model-signing's resource order: ``PurePosixPath`` comparison, component-wise."""
    return tuple(name.split("/"))


def _check_name(name: object, what: str) -> str:
    if not isinstance(name, str) or not name:
        raise ProvenanceError(f"{what}: expected a non-empty relative path")
    parts = name.split("/")
    if name.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\x00" in name:
        raise ProvenanceError(f"{what} = {one_line(name, 80)!r}: expected a normalized relative POSIX path "
                              f"(no leading '/', no '.', '..' or empty components)")
    return name


@dataclass(frozen=True, slots=True)
class FileEntry:
    """One file (or in-memory shard) of a dataset."""

    name: str
    size: int
    sha256: str
    media_type: str = "application/octet-stream"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "size": self.size, "sha256": self.sha256, "mediaType": self.media_type}


def _media_type(name: str, overrides: Mapping[str, str] | None) -> str:
    if overrides and name in overrides:
        return overrides[name]
    return mimetypes.guess_type(name, strict=False)[0] or "application/octet-stream"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass(frozen=True, slots=True)
class DatasetManifest:
    """A client's dataset manifest (build with :meth:`from_directory` / :meth:`from_shards`).

    ``name`` is the subject name (model-signing uses the directory's name);
    ``license`` an SPDX license expression and ``license_source`` where it was asserted
    (a URL or path); ``created_at`` an RFC 3339 UTC time.
    """

    name: str
    client: str
    dataset: str
    version: str
    files: tuple[FileEntry, ...]
    license: str
    license_source: str
    source: str
    creator: str
    created_at: str
    generated_by: str = GENERATED_BY
    ignore_paths: tuple[str, ...] = DEFAULT_IGNORE
    allow_symlinks: bool = False

    # ------------------------------------------------------------------ derived
    def root_digest(self) -> str:
        """SHA-256 over the concatenated resource digests, in resource order."""
        h = hashlib.sha256()
        for f in self.files:
            h.update(bytes.fromhex(f.sha256))
        return h.hexdigest()

    def statement(self) -> Statement:
        serialization: dict[str, Any] = {"method": "files", "hash_type": "sha256",
                                         "allow_symlinks": self.allow_symlinks}
        if self.ignore_paths:
            serialization["ignore_paths"] = list(self.ignore_paths)
        predicate = {
            "serialization": serialization,
            "resources": [{"name": f.name, "algorithm": "sha256", "digest": f.sha256} for f in self.files],
            "dataset": {
                "client": self.client,
                "name": self.dataset,
                "version": self.version,
                "files": [f.to_dict() for f in self.files],
                "license": {"spdxId": self.license, "assertedIn": self.license_source},
                "source": self.source,
                "creator": self.creator,
                "createdAt": self.created_at,
                "generatedBy": self.generated_by,
            },
        }
        return Statement.build([(self.name, self.root_digest())], PREDICATE_TYPE, predicate)

    def to_json(self) -> bytes:
        return self.statement().to_json()

    # ------------------------------------------------------------------ builders
    @classmethod
    def _make(cls, name: str, entries: Iterable[FileEntry], **meta: Any) -> "DatasetManifest":
        files = tuple(sorted(entries, key=lambda f: resource_sort_key(f.name)))
        seen = set()
        for f in files:
            _check_name(f.name, "file name")
            if f.name in seen:
                raise ProvenanceError(f"file name {f.name!r}: appears twice")
            seen.add(f.name)
        if not files:
            raise ProvenanceError(f"dataset {meta.get('dataset')!r}: has no files")
        lic = meta.get("license")
        if not isinstance(lic, str) or not _SPDX.fullmatch(lic):
            raise ProvenanceError(f"license = {lic!r}: expected an SPDX license expression (e.g. 'CC-BY-4.0')")
        for k in ("client", "dataset", "version", "license_source", "source", "creator", "created_at", "generated_by"):
            v = meta.get(k)
            if not isinstance(v, str):
                raise ProvenanceError(f"{k} = {v!r}: expected a string")
        if not name:
            raise ProvenanceError("name: the subject name must not be empty")
        return cls(name=name, files=files, **meta)

    @classmethod
    def from_directory(
        cls, root: str | os.PathLike[str], *, client: str, dataset: str, version: str, license: str,
        license_source: str = "", source: str = "", creator: str = "", created_at: str | None = None,
        generated_by: str = GENERATED_BY, ignore_paths: Iterable[str] = DEFAULT_IGNORE,
        allow_symlinks: bool = False, media_types: Mapping[str, str] | None = None,
        name: str | None = None,
    ) -> "DatasetManifest":
        """Hash every regular file under ``root`` (model-signing's ``files`` serialization).

        ``ignore_paths`` (relative to ``root``) are skipped with everything under them;
        put the signature file there if it lives inside the directory. Symlinks are an
        error unless ``allow_symlinks`` (then their targets are hashed).
        """
        base = Path(root)
        if not base.is_dir():
            raise ProvenanceError(f"{root}: not a directory")
        ignore = tuple(ignore_paths)
        ignored = [PurePosixPath(p) for p in ignore]
        entries = []
        for dirpath, dirnames, filenames in os.walk(base, followlinks=allow_symlinks):
            dirnames.sort()
            for fn in sorted(filenames) + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
                full = Path(dirpath) / fn
                rel = full.relative_to(base).as_posix()
                if any(PurePosixPath(rel).is_relative_to(p) for p in ignored):
                    continue
                if full.is_symlink() and not allow_symlinks:
                    raise ProvenanceError(f"{full}: is a symlink (pass allow_symlinks=True to hash its target)")
                if full.is_dir():
                    continue  # a followed directory symlink: os.walk descends into it
                if not full.is_file():
                    raise ProvenanceError(f"{full}: not a regular file")
                with open(full, "rb") as fh:
                    digest = hashlib.file_digest(fh, "sha256").hexdigest()
                entries.append(FileEntry(rel, full.stat().st_size, digest, _media_type(rel, media_types)))
        return cls._make(name or base.resolve().name, entries, client=client, dataset=dataset, version=version,
                         license=license, license_source=license_source, source=source, creator=creator,
                         created_at=created_at or _now(), generated_by=generated_by,
                         ignore_paths=ignore, allow_symlinks=allow_symlinks)

    @classmethod
    def from_shards(
        cls, shards: Mapping[str, bytes], *, client: str, dataset: str, version: str, license: str,
        license_source: str = "", source: str = "", creator: str = "", created_at: str | None = None,
        generated_by: str = GENERATED_BY, media_types: Mapping[str, str] | None = None,
        name: str | None = None,
    ) -> "DatasetManifest":
        """A manifest for in-memory shards ``{name: bytes}`` (names are relative paths)."""
        entries = []
        for n, data in shards.items():
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise ProvenanceError(f"shard {n!r}: expected bytes, got {type(data).__name__}")
            entries.append(FileEntry(n, len(data), hashlib.sha256(data).hexdigest(), _media_type(n, media_types)))
        return cls._make(name or dataset, entries, client=client, dataset=dataset, version=version,
                         license=license, license_source=license_source, source=source, creator=creator,
                         created_at=created_at or _now(), generated_by=generated_by, ignore_paths=(),
                         allow_symlinks=False)

    # ------------------------------------------------------------------ parser
    @classmethod
    def from_statement(cls, st: Statement | bytes | str, *, algorithm: str = "sha256") -> "DatasetManifest":
        """Parse and cross-check a statement (untrusted until its envelope verified)."""
        if not isinstance(st, Statement):
            st = Statement.from_json(st, "dataset manifest")
        w = "dataset manifest"
        if st.predicate_type != PREDICATE_TYPE:
            raise ProvenanceError(f"{w}: predicateType {one_line(st.predicate_type, 80)!r}, expected {PREDICATE_TYPE!r}")
        if len(st.subjects) != 1:
            raise ProvenanceError(f"{w}: {len(st.subjects)} subjects, expected exactly 1")
        pred = _codec.obj(st.predicate, f"{w}.predicate", ("serialization", "resources", "dataset"))
        ser = _codec.obj(pred["serialization"], f"{w}.serialization", ("method", "hash_type", "allow_symlinks"),
                         ("ignore_paths",))
        if ser["method"] != "files" or ser["hash_type"] != algorithm or not isinstance(ser["allow_symlinks"], bool):
            raise ProvenanceError(f"{w}.serialization = {one_line(ser, 120)}: expected method 'files', "
                                  f"hash_type {algorithm!r}")
        ignore = ser.get("ignore_paths", [])
        if not isinstance(ignore, list) or not all(isinstance(p, str) for p in ignore):
            raise ProvenanceError(f"{w}.serialization.ignore_paths: expected a list of strings")
        res = pred["resources"]
        if not isinstance(res, list) or not res:
            raise ProvenanceError(f"{w}.resources: expected a non-empty list")
        names, digests = [], []
        for i, r in enumerate(res):
            r = _codec.obj(r, f"{w}.resources[{i}]", ("name", "algorithm", "digest"))
            if r["algorithm"] != algorithm:
                raise ProvenanceError(f"{w}.resources[{i}].algorithm = {one_line(r['algorithm'], 40)!r}: expected "
                                      f"{algorithm!r} (digest-algorithm downgrade?)")
            names.append(_check_name(r["name"], f"{w}.resources[{i}].name"))
            digests.append(_codec.hex32(r["digest"], f"{w}.resources[{i}].digest"))
        keys = [resource_sort_key(n) for n in names]
        if any(a >= b for a, b in zip(keys, keys[1:])):
            raise ProvenanceError(f"{w}.resources: names must be unique and sorted")
        root = hashlib.sha256(b"".join(digests)).hexdigest()
        subj = st.subjects[0]
        if subj.digest.get("sha256") != root:
            raise VerificationFailed(f"{w}: subject digest {subj.digest.get('sha256')} is not the digest of its "
                                     f"resources ({root})")
        ds = _codec.obj(pred["dataset"], f"{w}.dataset", ("client", "name", "version", "files", "license", "source",
                                                          "creator", "createdAt", "generatedBy"))
        lic = _codec.obj(ds["license"], f"{w}.dataset.license", ("spdxId", "assertedIn"))
        files_raw = ds["files"]
        if not isinstance(files_raw, list) or len(files_raw) != len(names):
            raise ProvenanceError(f"{w}.dataset.files: expected one entry per resource ({len(names)})")
        files = []
        for i, (f, n, dg) in enumerate(zip(files_raw, names, digests)):
            wf = f"{w}.dataset.files[{i}]"
            f = _codec.obj(f, wf, ("name", "size", "sha256", "mediaType"))
            if f["name"] != n or _codec.hex32(f["sha256"], f"{wf}.sha256") != dg:
                raise VerificationFailed(f"{wf}: does not match resources[{i}] ({n})")
            files.append(FileEntry(n, _codec.integer(f["size"], f"{wf}.size"), dg.hex(),
                                   _codec.string(f["mediaType"], f"{wf}.mediaType")))
        meta = {k: _codec.string(ds[j], f"{w}.dataset.{j}", empty=True) for k, j in
                (("client", "client"), ("dataset", "name"), ("version", "version"), ("source", "source"),
                 ("creator", "creator"), ("created_at", "createdAt"), ("generated_by", "generatedBy"))}
        return cls._make(subj.name, files, license=_codec.string(lic["spdxId"], f"{w}.dataset.license.spdxId"),
                         license_source=_codec.string(lic["assertedIn"], f"{w}.dataset.license.assertedIn", empty=True),
                         ignore_paths=tuple(ignore), allow_symlinks=ser["allow_symlinks"], **meta)

    # ------------------------------------------------------------------ checks
    def check_shards(self, shards: Mapping[str, bytes]) -> list[str]:
        """Problems (empty if none) between this manifest and the shards actually used."""
        problems = []
        want = {f.name: f for f in self.files}
        for n in sorted(set(shards) - set(want)):
            problems.append(f"extra shard {n!r} is not in the manifest")
        for n, f in want.items():
            if n not in shards:
                problems.append(f"shard {n!r} is missing")
                continue
            data = shards[n]
            if len(data) != f.size:
                problems.append(f"shard {n!r}: size {len(data)} != manifest size {f.size}")
            elif hashlib.sha256(data).hexdigest() != f.sha256:
                problems.append(f"shard {n!r}: sha256 differs from the manifest")
        return problems

    def check_directory(self, root: str | os.PathLike[str]) -> list[str]:
        """Problems (empty if none) between this manifest and the files under ``root``."""
        try:
            actual = DatasetManifest.from_directory(
                root, client=self.client, dataset=self.dataset, version=self.version, license=self.license,
                created_at=self.created_at, ignore_paths=self.ignore_paths, allow_symlinks=self.allow_symlinks)
        except ProvenanceError as exc:
            if "has no files" not in str(exc):
                return [str(exc)]
            actual = replace(self, files=())
        have = {f.name: f for f in actual.files}
        want = {f.name: f for f in self.files}
        problems = [f"extra file {n!r} is not in the manifest" for n in sorted(set(have) - set(want))]
        for n, f in want.items():
            g = have.get(n)
            if g is None:
                problems.append(f"file {n!r} is missing")
            elif g.size != f.size:
                problems.append(f"file {n!r}: size {g.size} != manifest size {f.size}")
            elif g.sha256 != f.sha256:
                problems.append(f"file {n!r}: sha256 differs from the manifest")
        return problems

    def verify_directory(self, root: str | os.PathLike[str]) -> None:
        problems = self.check_directory(root)
        if problems:
            more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
            raise VerificationFailed(f"{root}: {problems[0]}{more}")

    def verify_shards(self, shards: Mapping[str, bytes]) -> None:
        problems = self.check_shards(shards)
        if problems:
            more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
            raise VerificationFailed(f"dataset {self.dataset!r}: {problems[0]}{more}")
