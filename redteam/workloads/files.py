"""Readers for the standard on-disk formats of the datasets federated-learning papers use.

Each reader takes a directory the user names (nothing is downloaded here; ``redteam data fetch``
downloads the files that have a canonical address), reads only the files of its format, checks
every file whose name has a published SHA-256 (:mod:`redteam.workloads.digests`) against it, and
returns a small frozen dataclass of tensors:

* :func:`read_cifar`: CIFAR-10 / CIFAR-100, the *binary* distribution (Krizhevsky, "Learning
  Multiple Layers of Features from Tiny Images", 2009, and the format notes on
  https://www.cs.toronto.edu/~kriz/cifar.html): records of 1 label byte (CIFAR-100: a coarse
  and a fine label byte) and 3,072 pixel bytes (1,024 red, then green, then blue, each 32×32
  row-major). The Python distribution is *pickle* files, which can run code when loaded: it is
  refused, with a pointer to the binary one;
* :func:`read_idx`: MNIST (LeCun et al. 1998), Fashion-MNIST (Xiao, Rasul & Vollgraf 2017) and
  EMNIST (Cohen, Afshar, Tapson & van Schaik 2017) in the IDX format of LeCun's MNIST page: a
  4-byte magic number (two zero bytes, a data-type byte, 0x08 = unsigned byte, and the number of
  dimensions), the dimensions as big-endian 32-bit integers, then the data;
* :func:`read_leaf_femnist` and :func:`read_leaf_shakespeare`: the JSON that LEAF's scripts
  write (Caldas et al., "LEAF: A Benchmark for Federated Settings", 2018;
  https://github.com/TalwalkarLab/leaf), with the writer / speaking role of every sample, the
  natural partition;
* :func:`read_text_dir`: a folder of UTF-8 ``.txt`` files for language modelling (raw text,
  which :mod:`redteam.workloads.corpus` cuts into windows: :meth:`TextFiles.documents`);
* :func:`read_hf_saved`: a Hugging Face ``datasets`` folder written by ``save_to_disk`` (Arrow
  IPC streams; needs ``pyarrow``, imported only here).

No reader unpickles anything. Every read is bounded: a file whose size disagrees with its
header, a truncated file, a header declaring more than :data:`MAX_FILE_BYTES`, an archive
member larger than that, are refused with a one-line :class:`~redteam.errors.InvalidParameter`
naming the file and what is wrong. Beyond each file's cap, one read of a dataset may take at most
``REDTEAM_MAX_DATA_BYTES`` of memory (2 GiB by default:
:attr:`~redteam.scenario_limits.Limits.max_data_bytes`; the EMNIST byclass split takes about
0.7 GB, CIFAR 0.4 GB): what each step will allocate is estimated *before* it allocates — archive
members and decompressed streams from the sizes their headers declare, counted as they stream,
IDX data from its declared dimensions, JSON from the brackets, separators and strings of its
text, Arrow batches from their decompressed buffer lengths, images from their declared size —
and a read past the budget is refused in one line that names that variable. Every file is read
and counted once.

``digest`` (every result has one) is the SHA-256 over the data read: for each file, in a fixed
order, its name within the dataset, its length and its bytes, *after* decompression — so the
same data read from its archive or from the extracted files, gzipped or not, has the same
digest. ``files`` maps each file read from disk (path relative to the directory given) to its
own SHA-256, the one compared with the published digests. ``source`` is a human line naming
the format, the files and the digest, ready for :class:`~redteam.workloads.base.Dataset`'s
``source``.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import math
import re
import struct
import tarfile
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, BinaryIO, Callable, Iterable, Iterator, Literal

import numpy as np

from ..errors import InvalidParameter
from . import digests as _digests

if TYPE_CHECKING:
    import torch

    from .corpus import Document

__all__ = [
    "ImageFiles",
    "SequenceFiles",
    "TextFiles",
    "HFSaved",
    "read_cifar",
    "read_idx",
    "read_leaf_femnist",
    "read_leaf_shakespeare",
    "read_text_dir",
    "read_hf_saved",
    "sha256_file",
    "LEAF_LETTERS",
    "MAX_FILE_BYTES",
]

#: The most bytes any one file (or archive member, or decompressed stream) may hold or declare.
#: The largest standard file, EMNIST byclass's training images, is 547 MB decompressed.
MAX_FILE_BYTES = 1 << 30

#: LEAF's Shakespeare vocabulary, 80 symbols: ``ALL_LETTERS`` in LEAF's
#: ``models/utils/language_utils.py`` (TalwalkarLab/leaf); a symbol's id is its index here.
LEAF_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"

_MNIST_CLASSES = tuple("0123456789")
# Xiao, Rasul & Vollgraf, "Fashion-MNIST" (2017), Table 2 / the repository's README.
_FASHION_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                    "Ankle boot")
# LEAF's data/femnist/preprocess/data_to_json.py, relabel_class: digits, then upper, then lower case.
_FEMNIST_CLASSES = tuple("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")


# ----------------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class ImageFiles:
    """Images and labels read from a dataset's files.

    ``train_x`` / ``test_x``: ``(N, C, H, W)`` uint8 pixels as stored (0..255); ``train_y`` /
    ``test_y``: ``(N,)`` int64 labels in ``[0, num_classes)``; ``groups`` (optional): ``(N,)``
    int64, per training sample the index in ``group_names`` of its group (LEAF: the writer), for
    a natural partition; ``test_groups`` the same for the test samples; ``class_names``: the
    label names where the files or the format fix them; ``name``: the dataset (``"cifar10"``,
    ``"emnist_balanced"``, …). ``digest``, ``files``, ``source``: see the module docstring.
    """

    train_x: "torch.Tensor"
    train_y: "torch.Tensor"
    test_x: "torch.Tensor"
    test_y: "torch.Tensor"
    num_classes: int
    groups: "torch.Tensor | None" = None
    group_names: tuple[str, ...] = ()
    digest: str = ""
    files: dict[str, str] = field(default_factory=dict)
    source: str = ""
    class_names: tuple[str, ...] = ()
    test_groups: "torch.Tensor | None" = None
    name: str = ""


@dataclass(frozen=True, slots=True)
class SequenceFiles:
    """Token sequences and next-token targets (LEAF Shakespeare).

    ``train_x`` / ``test_x``: ``(N, T)`` int64 token ids over ``vocab`` (a symbol's id is its
    index in ``vocab``); ``train_y`` / ``test_y``: ``(N,)`` int64, the id of the symbol that
    follows; ``num_classes == len(vocab)``; ``groups`` / ``test_groups``: ``(N,)`` int64 index in
    ``group_names`` (the speaking role); ``unknown_symbols``: how many characters outside
    ``vocab`` were mapped to the space (see :func:`read_leaf_shakespeare`).
    """

    train_x: "torch.Tensor"
    train_y: "torch.Tensor"
    test_x: "torch.Tensor"
    test_y: "torch.Tensor"
    vocab: str
    num_classes: int
    groups: "torch.Tensor"
    group_names: tuple[str, ...]
    test_groups: "torch.Tensor"
    digest: str = ""
    files: dict[str, str] = field(default_factory=dict)
    source: str = ""
    unknown_symbols: int = 0


@dataclass(frozen=True, slots=True)
class TextFiles:
    """The ``.txt`` documents of a folder, for language modelling.

    ``texts[i]`` is the text of the document ``names[i]`` (its path below ``root``, ``/``
    separated), ``digests[i]`` the SHA-256 of its file, ``groups[i]`` its first path component
    (a file at the top level is its own group), as :func:`redteam.workloads.corpus.directory_documents`
    groups. ``digest`` equals :func:`redteam.workloads.corpus.digest` of :meth:`documents`.
    """

    texts: tuple[str, ...]
    names: tuple[str, ...]
    digests: tuple[str, ...]
    groups: tuple[str, ...]
    root: str
    digest: str = ""
    files: dict[str, str] = field(default_factory=dict)
    source: str = ""

    def documents(self) -> "list[Document]":
        """The documents as :class:`redteam.workloads.corpus.Document` (UTF-8 bytes), for
        :func:`~redteam.workloads.corpus.select`, ``split_heldout`` and ``windows``."""
        from .corpus import Document

        base = Path(self.root)
        return [Document(n, g, t.encode("utf-8"), str(base / n)) for n, g, t in zip(self.names, self.groups, self.texts)]


@dataclass(frozen=True, slots=True)
class HFSaved:
    """A Hugging Face ``save_to_disk`` folder, read without the ``datasets`` package.

    ``splits[split][column]``: numbers and booleans as a numpy array (lists of equal length as
    one array with more dimensions), strings as a tuple of ``str``, anything else (an ``Image``
    feature's ``{"bytes", "path"}`` structs, ragged lists) as a tuple of Python values;
    ``num_rows[split]``; ``features[split]``: the ``features`` of its ``dataset_info.json``
    (``{}`` if absent); ``class_names[column]``: the names of a ``ClassLabel`` column.
    A plain ``Dataset`` folder is one split, named by its ``state.json`` (``"train"`` if unnamed).
    """

    splits: dict[str, dict[str, Any]]
    num_rows: dict[str, int]
    features: dict[str, dict[str, Any]]
    class_names: dict[str, tuple[str, ...]]
    digest: str = ""
    files: dict[str, str] = field(default_factory=dict)
    source: str = ""

    def image_files(self, image: str | None = None, label: str | None = None, *, train: str = "train",
                    test: str = "test", channels: int | None = None) -> ImageFiles:
        """The ``train`` and ``test`` splits as :class:`ImageFiles`.

        ``image``: the column of images (default: the one ``Image`` feature, else a column named
        ``image`` or ``img``): encoded images (PNG, JPEG; decoded with Pillow, which matplotlib
        installs) or arrays ``(N, H, W)``, ``(N, H, W, C)`` with C in 1, 3, 4 (the trailing size
        decides, never the height; an array whose trailing size is no channel count is read as
        ``(N, C, H, W)``). ``channels``: the known channel count, which settles an array both
        layouts fit (``(N, 3, 4, 4)``). ``label``: the labels (default: the one ``ClassLabel``
        feature, else ``label`` / ``labels``)."""
        for split in (train, test):
            if split not in self.splits:
                raise InvalidParameter(f"hf_saved: no split {split!r}; the folder has {sorted(self.splits)}")
        cols = self.splits[train]
        feats = self.features.get(train, {})
        image = image or _pick_column(cols, feats, "Image", ("image", "img"), "image")
        label = label or _pick_column(cols, feats, "ClassLabel", ("label", "labels"), "label")
        parts = []
        budget = _Budget("hf_saved")
        for split in (train, test):
            c = self.splits[split]
            for col in (image, label):
                if col not in c:
                    raise InvalidParameter(f"hf_saved: split {split!r} has no column {col!r}; it has {sorted(c)}")
            parts.append((_images_of(c[image], f"{split}.{image}", channels, budget),
                          _labels_of(c[label], f"{split}.{label}")))
        (trx, try_), (tex, tey) = parts
        if trx.shape[1:] != tex.shape[1:]:
            raise InvalidParameter(f"hf_saved: {train} images are {trx.shape[1:]}, {test} images {tex.shape[1:]}")
        names = self.class_names.get(label, ())
        k = len(names) or int(max(try_.max(initial=-1), tey.max(initial=-1)) + 1)
        if min(try_.min(initial=0), tey.min(initial=0)) < 0 or max(try_.max(initial=-1), tey.max(initial=-1)) >= k:
            raise InvalidParameter(f"hf_saved: labels of {label!r} must be in [0, {k}) ({len(names)} class names)")
        t = _torch()
        return ImageFiles(t.from_numpy(trx), t.from_numpy(try_), t.from_numpy(tex), t.from_numpy(tey), k,
                          digest=self.digest, files=dict(self.files), source=self.source, class_names=names,
                          name="hf_saved")


# ----------------------------------------------------------------------------- helpers


def _torch() -> Any:
    import torch

    return torch


def sha256_file(path: str | Path) -> str:
    """The SHA-256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def gz_content_sha256(path: str | Path, limit: int | None = None) -> tuple[str, int] | None:
    """(SHA-256, length) of a gzip file's decompressed bytes, read in 1 MiB blocks; ``None`` when
    it is not a complete gzip stream or decompresses past ``limit`` bytes (default: the most a
    file may hold here)."""
    cap = MAX_FILE_BYTES if limit is None else limit
    h, n = hashlib.sha256(), 0
    try:
        with gzip.open(Path(path), "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                n += len(block)
                if n > cap:
                    return None
                h.update(block)
    except (OSError, EOFError, zlib.error):
        return None
    return h.hexdigest(), n


def matches_published(path: str | Path, pub: "_digests.Published", digest: str, size: int) -> tuple[bool, str]:
    """Whether the file ``path`` (of SHA-256 ``digest`` and ``size`` bytes) is ``pub``: the same
    bytes, or, for a ``.gz`` whose content digest is pinned, a recompressed copy of the same
    content. The second item says which (``""``: the published file itself)."""
    if digest == pub.sha256 and size == pub.size:
        return True, ""
    if pub.content_sha256 and str(path).endswith(".gz"):
        got = gz_content_sha256(path, pub.content_size + 1)
        if got == (pub.content_sha256, pub.content_size):
            return True, "a recompressed copy: its decompressed content is the published content"
    return False, ""


class _Digest:
    """SHA-256 over (name, length, bytes) of each file in the order given (module docstring)."""

    def __init__(self) -> None:
        self.h = hashlib.sha256()

    def add(self, name: str, data: bytes | memoryview) -> None:
        n = name.encode()
        self.h.update(len(n).to_bytes(8, "big") + n + len(data).to_bytes(8, "big"))
        self.h.update(data)

    def hexdigest(self) -> str:
        return self.h.hexdigest()


def _fetch_hint(dataset: str) -> str:
    info = _digests.dataset_info(dataset)
    if info is not None and info.files:
        return f"; delete it and download it again (redteam data fetch {info.name} --dir DIR)"
    return ""


def _check_file(path: Path, rel: str, dataset: str, files: dict[str, str]) -> str:
    """Hash ``path``, record it in ``files`` as ``rel``, and compare it with the published digest
    of its name for ``dataset``, if there is one: a different size or digest is an error."""
    if not path.is_file():
        raise InvalidParameter(f"{dataset}: {path}: not a file")
    size = path.stat().st_size
    pub = _digests.published_for(dataset).get(path.name)
    digest = sha256_file(path)
    files[rel] = digest
    if pub is not None and not matches_published(path, pub, digest, size)[0]:
        also = (f", and its decompressed content is not the pinned {pub.content_sha256} ({pub.content_size:,} bytes)"
                if pub.content_sha256 else "")
        raise InvalidParameter(
            f"{dataset}: {path}: SHA-256 {digest} ({size:,} bytes) is not the published {pub.sha256} "
            f"({pub.size:,} bytes; {pub.source}){also}: a damaged or different file{_fetch_hint(dataset)}")
    return digest


class _Budget:
    """The memory one read of a dataset may still take (module docstring): every allocation the
    input decides is estimated and charged *before* it is made, and a charge past the cap
    (``REDTEAM_MAX_DATA_BYTES``) is refused in one line naming the file and the variable."""

    def __init__(self, what: str) -> None:
        from ..scenario_limits import Limits

        try:
            self.cap = Limits.from_env().max_data_bytes
        except Exception as exc:  # a malformed REDTEAM_* variable
            raise InvalidParameter(str(exc)) from None
        self.what = what
        self.used = 0

    def charge(self, n: int, where: object, doing: str) -> None:
        """Count ``n`` bytes that reading ``where`` (``doing`` says how) is about to allocate."""
        n = max(int(n), 0)
        if self.used + n > self.cap:
            raise InvalidParameter(
                f"{self.what}: {where}: {doing} would take about {n:,} bytes of memory ({self.used + n:,} in all), "
                f"more than the {self.cap:,} one read of a dataset may take (REDTEAM_MAX_DATA_BYTES raises the cap)")
        self.used += n

    def release(self, n: int) -> None:
        """Give back ``n`` bytes charged for something that has been dropped."""
        self.used = max(self.used - max(int(n), 0), 0)


_QUOTE = ord('"')


def _json_cost(raw: bytes) -> int:
    """About what ``json.loads(raw)`` allocates, from the text alone: an object and a list slot
    per value (a separator or a bracket opens one: 40 bytes, a float's), a list or dict per
    bracket, a ``str`` per pair of quotes and its characters (a non-ASCII byte as 4). One pass of
    numpy over the bytes; it errs high (``[],`` counts 136 bytes, Python takes 64-72)."""
    b = np.frombuffer(raw, dtype=np.uint8)
    counts = np.zeros(256, dtype=np.int64)
    inside = parity = 0
    for i in range(0, len(b), 1 << 22):  # in blocks: bincount and cumsum widen every byte to 8 bytes
        block = b[i:i + (1 << 22)]
        counts += np.bincount(block, minlength=256)
        opened = np.cumsum(block == _QUOTE, dtype=np.int32) + parity
        inside += int(np.count_nonzero(opened & 1))
        parity = int(opened[-1]) & 1 if len(opened) else parity
    containers = int(counts[ord("[")] + counts[ord("{")])
    values = int(counts[ord(",")] + counts[ord(":")]) + containers + 1
    quotes = int(counts[_QUOTE])
    return 96 * containers + 40 * values + 40 * quotes + inside + 3 * int(counts[128:].sum())


def _parse_json(raw: bytes, path: Path, what: str, budget: "_Budget") -> Any:
    """``json.loads(raw)`` once its estimated cost is charged to ``budget`` (and released after:
    the caller charges what it keeps)."""
    cost = _json_cost(raw)
    budget.charge(cost, path, "parsing its JSON")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise InvalidParameter(f"{what}: {path}: not JSON ({exc})") from None
    finally:
        budget.release(cost)


def _read_limited(f: BinaryIO, n: int, what: str, head: bytes = b"") -> bytearray:
    """``head`` followed by exactly ``n`` bytes from ``f``, and nothing after them (truncated /
    trailing data are errors), in one writable buffer of ``len(head) + n`` bytes."""
    if n > MAX_FILE_BYTES:
        raise InvalidParameter(f"{what}: declares {n:,} bytes of data, more than the {MAX_FILE_BYTES:,} a file "
                               "may hold here (a corrupt header?)")
    out = bytearray(len(head) + n)
    out[:len(head)] = head
    view = memoryview(out)[len(head):]
    got = 0
    while got < n:
        k = f.readinto(view[got:])  # type: ignore[attr-defined]
        if not k:
            raise InvalidParameter(f"{what}: truncated: {got:,} bytes of data where the header declares {n:,}")
        got += k
    view.release()
    if f.read(1):
        raise InvalidParameter(f"{what}: has bytes after the {n:,} bytes of data its header declares")
    return out


def _rel(path: Path, base: Path) -> str:
    try:
        return path.relative_to(base).as_posix()
    except ValueError:
        return path.name


def _dir(directory: str | Path, what: str) -> Path:
    if not isinstance(directory, (str, Path)) or not str(directory):
        raise InvalidParameter(f"{what}: directory = {directory!r}: give a folder path")
    p = Path(directory).expanduser()
    if not p.exists():
        raise InvalidParameter(f"{what}: {p}: no such file or directory")
    return p


def _tensors(*arrays: np.ndarray) -> list[Any]:
    t = _torch()
    return [t.from_numpy(np.ascontiguousarray(a)) for a in arrays]


# ----------------------------------------------------------------------------- CIFAR


@dataclass(frozen=True)
class _CifarLayout:
    folder: str
    archive: str
    train: tuple[str, ...]
    test: tuple[str, ...]
    label_bytes: int
    classes: int
    names_file: str
    python_folder: str
    python_archive: str


_CIFAR = {
    "cifar10": _CifarLayout("cifar-10-batches-bin", "cifar-10-binary.tar.gz",
                            tuple(f"data_batch_{i}.bin" for i in range(1, 6)), ("test_batch.bin",), 1, 10,
                            "batches.meta.txt", "cifar-10-batches-py", "cifar-10-python.tar.gz"),
    "cifar100": _CifarLayout("cifar-100-binary", "cifar-100-binary.tar.gz", ("train.bin",), ("test.bin",), 2, 100,
                             "fine_label_names.txt", "cifar-100-python", "cifar-100-python.tar.gz"),
}
_CIFAR_PIXELS = 3 * 32 * 32


def _pickle_refusal(name: str, where: Path) -> InvalidParameter:
    lay = _CIFAR[name]
    pub = _digests.published_for(name).get(lay.archive)
    return InvalidParameter(
        f"{name}: {where} is CIFAR's Python distribution (pickle files, which can run code when loaded): "
        f"redteam never unpickles; use the binary distribution {lay.archive}{f' ({pub.url})' if pub else ''}, e.g. "
        f"`redteam data fetch {name} --dir DIR`")


def _cifar_source(name: str, p: Path) -> tuple[str, Path]:
    """("folder" | "archive", path) for ``p``: the folder itself, its parent, or the archive."""
    lay = _CIFAR[name]
    if p.is_file():
        if p.name == lay.python_archive or p.name.endswith("-python.tar.gz"):
            raise _pickle_refusal(name, p)
        if p.name.endswith((".tar.gz", ".tgz")):
            return "archive", p
        raise InvalidParameter(f"{name}: {p}: not a folder nor a .tar.gz archive; expected {lay.archive} or a folder "
                               f"holding {lay.folder}/")
    for cand in (p, p / lay.folder):
        if (cand / lay.train[0]).is_file() or (cand / lay.test[0]).is_file():
            return "folder", cand
    if (p / lay.archive).is_file():
        return "archive", p / lay.archive
    if (p / lay.python_folder).exists() or (p / lay.python_archive).exists() or \
            (name == "cifar10" and (p / "data_batch_1").is_file()) or \
            (name == "cifar100" and (p / "train").is_file() and (p / "meta").is_file()):
        raise _pickle_refusal(name, p)
    raise InvalidParameter(
        f"{name}: {p}: found neither {lay.folder}/ (with {', '.join(lay.train + lay.test)}) nor {lay.archive}; give "
        f"the folder, its parent, or the archive (`redteam data list` shows the layouts)")


def _tar_members(archive: Path, wanted: Iterable[str], what: str, budget: _Budget) -> dict[str, bytearray]:
    """The bytes of the regular-file members whose base name is in ``wanted``, read from the
    archive without extracting anything; each member's declared size is checked before it is read
    or skipped (no member may exceed :data:`MAX_FILE_BYTES`) and charged to ``budget`` before it is
    read (the sizes add up as the members stream), and a name found twice is an error."""
    wanted = set(wanted)
    out: dict[str, bytearray] = {}
    try:
        with tarfile.open(archive, mode="r:*") as tf:
            while True:
                m = tf.next()
                if m is None:
                    break
                if m.size > MAX_FILE_BYTES:
                    raise InvalidParameter(f"{what}: {archive}: member {m.name!r} declares {m.size:,} bytes, more than "
                                           f"the {MAX_FILE_BYTES:,} a file may hold here")
                base = PurePosixPath(m.name).name
                if base not in wanted or not m.isfile():
                    continue
                if base in out:
                    raise InvalidParameter(f"{what}: {archive}: holds {base} twice ({m.name!r}); refusing an "
                                           "ambiguous archive")
                f = tf.extractfile(m)
                if f is None:  # pragma: no cover - isfile() members always have a file object
                    continue
                budget.charge(m.size, f"{archive}:{m.name}", "decompressing the member")
                out[base] = _read_limited(f, m.size, f"{what}: {archive}:{m.name}")  # type: ignore[arg-type]
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise InvalidParameter(f"{what}: {archive}: not a readable .tar.gz archive (truncated or damaged: {exc})") from None
    return out


def read_cifar(directory: str | Path, name: Literal["cifar10", "cifar100"] = "cifar10") -> ImageFiles:
    """CIFAR-10 or CIFAR-100 from the binary distribution (module docstring).

    ``directory``: the extracted folder (``cifar-10-batches-bin`` / ``cifar-100-binary``), the
    folder holding it, a folder holding the archive (``cifar-10-binary.tar.gz`` /
    ``cifar-100-binary.tar.gz``; read in place, nothing is extracted), or the archive itself. The
    archive is checked against its published SHA-256; the extracted files have none published.

    CIFAR-10 reads ``data_batch_1.bin`` … ``data_batch_5.bin`` (training, in that order) and
    ``test_batch.bin``; CIFAR-100 ``train.bin`` and ``test.bin`` and uses the *fine* label (100
    classes; the coarse byte is checked to be < 20 and dropped). Pixels are returned as
    ``(N, 3, 32, 32)`` uint8, channels R, G, B — the byte order of the record. ``class_names``
    come from ``batches.meta.txt`` / ``fine_label_names.txt`` when present.
    """
    if name not in _CIFAR:
        raise InvalidParameter(f"read_cifar: name = {name!r}: must be 'cifar10' or 'cifar100'")
    lay = _CIFAR[name]
    p = _dir(directory, name)
    kind, where = _cifar_source(name, p)
    files: dict[str, str] = {}
    wanted = lay.train + lay.test
    base = p if p.is_dir() else p.parent
    budget = _Budget(name)
    if kind == "archive":
        _check_file(where, _rel(where, base), name, files)
        members = _tar_members(where, wanted + (lay.names_file,), name, budget)
        missing = [w for w in wanted if w not in members]
        if missing:
            raise InvalidParameter(f"{name}: {where}: the archive lacks {', '.join(missing)} (expected {lay.folder}/ "
                                   f"with {', '.join(wanted)})")
        data = {w: members[w] for w in wanted}
        names_text = members.get(lay.names_file)
    else:
        missing = [w for w in wanted if not (where / w).is_file()]
        if missing:
            raise InvalidParameter(f"{name}: {where}: missing {', '.join(missing)} (expected {', '.join(wanted)})")
        data = {}
        sizes = {w: (where / w).stat().st_size for w in wanted}
        for w, size in sizes.items():
            if size > MAX_FILE_BYTES:
                raise InvalidParameter(f"{name}: {where / w}: {size:,} bytes, more than {MAX_FILE_BYTES:,}")
        budget.charge(sum(sizes.values()), where, f"reading {', '.join(wanted)}")  # each file once
        for w in wanted:
            f = where / w
            _check_file(f, _rel(f, base), name, files)
            data[w] = f.read_bytes()
        nf = where / lay.names_file
        names_text = None
        if nf.is_file() and nf.stat().st_size <= 1 << 16:
            _check_file(nf, _rel(nf, base), name, files)
            names_text = nf.read_bytes()

    rec = lay.label_bytes + _CIFAR_PIXELS
    records = sum(len(data[w]) for w in wanted) // rec
    budget.charge(records * (_CIFAR_PIXELS + 8), where, f"joining {records:,} records into arrays")
    digest = _Digest()
    parts: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for w in wanted:
        raw = data[w]
        digest.add(f"{lay.folder}/{w}", raw)
        if not raw or len(raw) % rec:
            raise InvalidParameter(
                f"{name}: {w}: {len(raw):,} bytes is not a whole number of {rec}-byte records ({lay.label_bytes} label "
                f"byte(s) + 3,072 pixels){' (truncated?)' if raw else ''}")
        table = np.frombuffer(raw, dtype=np.uint8).reshape(-1, rec)
        if lay.label_bytes == 2 and int(table[:, 0].max()) >= 20:
            raise InvalidParameter(f"{name}: {w}: coarse label {int(table[:, 0].max())} out of range [0, 20)")
        y = table[:, lay.label_bytes - 1].astype(np.int64)
        if int(y.max()) >= lay.classes:
            bad = int(np.argmax(y >= lay.classes))
            raise InvalidParameter(f"{name}: {w}: record {bad} has label {int(y[bad])}, out of range [0, {lay.classes}) "
                                   f"(not a {name} file?)")
        parts[w] = (table[:, lay.label_bytes:].reshape(-1, 3, 32, 32), y)
    trx = np.concatenate([parts[w][0] for w in lay.train])
    try_ = np.concatenate([parts[w][1] for w in lay.train])
    tex = np.concatenate([parts[w][0] for w in lay.test])
    tey = np.concatenate([parts[w][1] for w in lay.test])
    class_names: tuple[str, ...] = ()
    if names_text is not None:
        got = tuple(s.strip() for s in names_text.decode("utf-8", "replace").splitlines() if s.strip())
        if len(got) != lay.classes:
            raise InvalidParameter(f"{name}: {lay.names_file}: {len(got)} class names, expected {lay.classes}")
        class_names = got
    d = digest.hexdigest()
    title = "CIFAR-10" if name == "cifar10" else "CIFAR-100"
    what = where.name if kind == "archive" else f"{where.name}/"
    src = f"{title} binary ({what}; {len(try_):,} train + {len(tey):,} test) sha256:{d}"
    tx = _tensors(trx, try_, tex, tey)
    return ImageFiles(*tx, num_classes=lay.classes, digest=d, files=files, source=src, class_names=class_names,
                      name=name)


# ----------------------------------------------------------------------------- IDX


_IDX_FOLDERS = {
    "mnist": ("MNIST/raw", "mnist", "raw"),
    "fashion_mnist": ("FashionMNIST/raw", "fashion_mnist", "fashion-mnist", "raw"),
    "emnist": ("gzip", "EMNIST/raw", "emnist", "raw"),
}
_EMNIST_ZIP = "gzip.zip"


def _idx_stems(name: str) -> dict[str, str]:
    if name.startswith("emnist_"):
        s = name[len("emnist_"):]
        return {"train_images": f"emnist-{s}-train-images-idx3-ubyte", "train_labels": f"emnist-{s}-train-labels-idx1-ubyte",
                "test_images": f"emnist-{s}-test-images-idx3-ubyte", "test_labels": f"emnist-{s}-test-labels-idx1-ubyte"}
    return {"train_images": "train-images-idx3-ubyte", "train_labels": "train-labels-idx1-ubyte",
            "test_images": "t10k-images-idx3-ubyte", "test_labels": "t10k-labels-idx1-ubyte"}


def _parse_idx(f: BinaryIO, what: str, ndim: int, file_size: int | None = None,
               check: Callable[[tuple[int, ...]], None] | None = None) -> tuple[tuple[int, ...], bytearray]:
    """(dims, raw bytes of header + data) of one IDX stream of unsigned bytes with ``ndim``
    dimensions. ``check(dims)`` runs once the header is read, before any data is: it may refuse
    the dimensions, and charges what they will allocate."""
    head = f.read(4)
    if len(head) < 4:
        raise InvalidParameter(f"{what}: truncated: {len(head)} bytes, shorter than the 4-byte IDX magic number")
    if head[:2] == b"\x1f\x8b":
        raise InvalidParameter(f"{what}: is gzip-compressed; its name must end in .gz")
    if head[0] or head[1]:
        raise InvalidParameter(f"{what}: magic number {head.hex()} is not IDX (expected 0000 then a type byte and a "
                               "dimension count)")
    if head[2] != 0x08:
        raise InvalidParameter(f"{what}: IDX data type 0x{head[2]:02x}; expected 0x08 (unsigned byte)")
    if head[3] != ndim:
        kind = "images (idx3)" if ndim == 3 else "labels (idx1)"
        raise InvalidParameter(f"{what}: IDX magic {head.hex()} declares {head[3]} dimension(s); {kind} have {ndim} "
                               f"(magic {0x0800 + ndim:08x})")
    dimb = f.read(4 * ndim)
    if len(dimb) < 4 * ndim:
        raise InvalidParameter(f"{what}: truncated inside its header ({4 + len(dimb)} of {4 + 4 * ndim} bytes)")
    dims = struct.unpack(f">{ndim}I", dimb)
    n = math.prod(dims)
    header = 4 + 4 * ndim
    if n > MAX_FILE_BYTES:
        raise InvalidParameter(f"{what}: header declares dimensions {'×'.join(map(str, dims))} = {n:,} bytes, more than "
                               f"the {MAX_FILE_BYTES:,} a file may hold here (a corrupt header?)")
    if file_size is not None and file_size != header + n:
        raise InvalidParameter(f"{what}: {file_size:,} bytes, but its header ({'×'.join(map(str, dims))}) declares "
                               f"{header + n:,}{' (truncated)' if file_size < header + n else ''}")
    if check is not None:
        check(dims)
    return dims, _read_limited(f, n, what, head + dimb)


def _read_idx_one(src: Path | bytes | bytearray, label: str, ndim: int, gz: bool,
                  check: Callable[[tuple[int, ...]], None] | None = None) -> tuple[tuple[int, ...], bytearray]:
    in_memory = isinstance(src, (bytes, bytearray))
    size = None if gz or in_memory else src.stat().st_size  # type: ignore[union-attr]
    try:
        with (io.BytesIO(src) if in_memory else src.open("rb")) as raw:  # type: ignore[arg-type,union-attr]
            if not gz:
                return _parse_idx(raw, label, ndim, size, check)
            with gzip.GzipFile(fileobj=raw, mode="rb") as f:
                return _parse_idx(f, label, ndim, None, check)  # type: ignore[arg-type]
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise InvalidParameter(f"{label}: not a complete gzip stream (truncated or damaged: {exc})") from None
    except OSError as exc:
        raise InvalidParameter(f"{label}: cannot read it ({exc})") from None


class _HeaderRead(Exception):
    """Raised by :func:`check_idx_header`'s check to stop before the data is read."""


def check_idx_header(path: Path) -> tuple[int, ...]:
    """The dimensions in the header of the IDX file ``path`` (``…-idx3-ubyte`` images or
    ``…-idx1-ubyte`` labels, ``.gz`` or not), reading only the header: unsigned bytes, the
    name's dimension count, and for an uncompressed file a size that matches. Anything else is an
    :class:`InvalidParameter` naming the file and what is wrong."""
    ndim = 3 if "idx3" in path.name else 1
    seen: list[tuple[int, ...]] = []

    def stop(dims: tuple[int, ...]) -> None:
        seen.append(dims)
        raise _HeaderRead

    try:
        _read_idx_one(path, path.name, ndim, path.name.endswith(".gz"), stop)
    except _HeaderRead:
        pass
    return seen[0]


def _find_idx(name: str, p: Path) -> tuple[str, Path, dict[str, tuple[Path | str, bool]]]:
    """("folder", folder, {role: (file, gz)}) or ("zip", zip, {role: (member, gz)})."""
    family = "emnist" if name.startswith("emnist_") else name
    stems = _idx_stems(name)
    zip_path: Path | None = None
    if p.is_file():
        if p.suffix != ".zip":
            raise InvalidParameter(f"{name}: {p}: give the folder holding the IDX files (or EMNIST's {_EMNIST_ZIP})")
        zip_path = p
    else:
        places = [p] + [p / sub for sub in _IDX_FOLDERS[family]]
        for place in places:
            found: dict[str, tuple[Path | str, bool]] = {}
            for role, stem in stems.items():
                for fname, gz in ((stem + ".gz", True), (stem, False)):
                    if (place / fname).is_file():
                        found[role] = (place / fname, gz)
                        break
            if found:
                missing = [stems[r] + "[.gz]" for r in stems if r not in found]
                if missing:
                    raise InvalidParameter(f"{name}: {place}: missing {', '.join(missing)} (found "
                                           f"{', '.join(Path(str(v[0])).name for v in found.values())})")
                return "folder", place, found
        if family == "emnist" and (p / _EMNIST_ZIP).is_file():
            zip_path = p / _EMNIST_ZIP
    if zip_path is None:
        where = " or ".join([str(p)] + [f"{p / s}" for s in _IDX_FOLDERS[family]])
        hint = f", or EMNIST's {_EMNIST_ZIP}" if family == "emnist" else ""
        raise InvalidParameter(f"{name}: no IDX files in {where}: expected "
                               f"{', '.join(s + '[.gz]' for s in stems.values())}{hint}")
    if family != "emnist":
        raise InvalidParameter(f"{name}: {zip_path}: only EMNIST's {_EMNIST_ZIP} is read as a zip; give the folder "
                               "of IDX files")
    try:
        with zipfile.ZipFile(zip_path) as zf:
            by_base: dict[str, list[zipfile.ZipInfo]] = {}
            for info in zf.infolist():
                if not info.is_dir():
                    by_base.setdefault(PurePosixPath(info.filename).name, []).append(info)
    except (zipfile.BadZipFile, OSError) as exc:
        raise InvalidParameter(f"{name}: {zip_path}: not a readable zip ({exc})") from None
    out: dict[str, tuple[Path | str, bool]] = {}
    for role, stem in stems.items():
        hits = by_base.get(stem + ".gz", []) or by_base.get(stem, [])
        if not hits:
            raise InvalidParameter(f"{name}: {zip_path}: has no member {stem}.gz (is the split name right? EMNIST's "
                                   f"are {', '.join(_digests.EMNIST_SPLITS)})")
        if len(hits) > 1:
            raise InvalidParameter(f"{name}: {zip_path}: holds {PurePosixPath(hits[0].filename).name} twice; refusing "
                                   "an ambiguous archive")
        if hits[0].file_size > MAX_FILE_BYTES:
            raise InvalidParameter(f"{name}: {zip_path}:{hits[0].filename} declares {hits[0].file_size:,} bytes, more "
                                   f"than {MAX_FILE_BYTES:,}")
        out[role] = (hits[0].filename, hits[0].filename.endswith(".gz"))
    return "zip", zip_path, out


def read_idx(directory: str | Path, name: str = "mnist") -> ImageFiles:
    """MNIST, Fashion-MNIST or an EMNIST split from IDX files (module docstring).

    ``name``: ``"mnist"``, ``"fashion_mnist"`` or ``"emnist_<split>"`` (``byclass``, ``bymerge``,
    ``balanced``, ``letters``, ``digits``, ``mnist``). ``directory``: the folder of the four files
    (``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``,
    ``t10k-labels-idx1-ubyte``; EMNIST: ``emnist-<split>-{train,test}-{images-idx3,labels-idx1}-ubyte``),
    each gzipped (``.gz``, preferred when both are there) or not, or a folder above it in
    torchvision's layout (``MNIST/raw``, ``FashionMNIST/raw``, ``EMNIST/raw``) or EMNIST's
    ``gzip/``; for EMNIST also NIST's ``gzip.zip`` itself, or a folder holding it (read in place).

    Checked: the magic numbers (0x00000803 for images, 0x00000801 for labels), 28×28 images, the
    same count of images and labels, a file size (or decompressed length) equal to what the header
    declares, labels in range, and the published SHA-256 of every ``.gz`` file and of ``gzip.zip``.

    EMNIST stores every image transposed (its conversion from NIST SD 19 wrote column-major
    images; torchvision's EMNIST reader transposes them too): the images are transposed back here,
    so that an EMNIST digit looks like an MNIST digit. ``emnist_letters`` labels are 1..26 as
    stored (``num_classes`` 27, class 0 unused). ``class_names`` are the digits, Fashion-MNIST's
    ten names, or EMNIST's ``emnist-<split>-mapping.txt`` (when present beside the files).
    """
    family = "emnist" if isinstance(name, str) and name.startswith("emnist_") else name
    if family not in ("mnist", "fashion_mnist", "emnist") or (
            family == "emnist" and name[len("emnist_"):] not in _digests.EMNIST_SPLITS):
        raise InvalidParameter(f"read_idx: name = {name!r}: must be 'mnist', 'fashion_mnist' or 'emnist_<split>' with "
                               f"split one of {', '.join(_digests.EMNIST_SPLITS)}")
    num_classes = _digests.EMNIST_SPLITS[name[len("emnist_"):]] if family == "emnist" else 10
    p = _dir(directory, name)
    kind, where, found = _find_idx(name, p)
    base = p if p.is_dir() else p.parent
    files: dict[str, str] = {}
    digest = _Digest()
    arrays: dict[str, np.ndarray] = {}
    dims_of: dict[str, tuple[int, ...]] = {}
    class_names: tuple[str, ...] = ()
    budget = _Budget(name)
    zf = None
    try:
        if kind == "zip":
            _check_file(where, _rel(where, base), name, files)
            zf = zipfile.ZipFile(where)
        for role in ("train_images", "train_labels", "test_images", "test_labels"):
            src, gz = found[role]
            ndim = 3 if role.endswith("images") else 1
            split = role.split("_")[0]

            def check(dims: tuple[int, ...], role: str = role, split: str = split, src: Any = src) -> None:
                # refuse wrong dimensions from the header, and charge what they allocate, before reading
                if role.endswith("images"):
                    if dims[1:] != (28, 28):
                        raise InvalidParameter(f"{name}: {split} images are {dims[1]}×{dims[2]}; {name} images are "
                                               "28×28")
                    budget.charge(math.prod(dims), src, f"reading {dims[0]:,} images")
                else:
                    n_images = dims_of[f"{split}_images"][0]
                    if dims[0] != n_images:
                        raise InvalidParameter(f"{name}: {split}: {n_images:,} images but {dims[0]:,} labels")
                    budget.charge(9 * dims[0], src, f"reading {dims[0]:,} labels")  # the bytes and int64

            if zf is not None:
                label = f"{name}: {where}:{src}"
                size = zf.getinfo(str(src)).file_size
                budget.charge(size, f"{where}:{src}", "reading the member")
                try:
                    with zf.open(str(src)) as m:
                        blob = _read_limited(m, size, label)  # type: ignore[arg-type]
                except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:
                    raise InvalidParameter(f"{label}: cannot read the member (damaged zip: {exc})") from None
                dims, raw = _read_idx_one(blob, label, ndim, gz, check)
                del blob
                budget.release(size)
            else:
                path = Path(src)
                _check_file(path, _rel(path, base), name, files)
                dims, raw = _read_idx_one(path, f"{name}: {path}", ndim, gz, check)
            digest.add(_idx_stems(name)[role], raw)
            dims_of[role] = dims
            arrays[role] = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
        if family == "emnist":
            class_names = _emnist_mapping(name, kind, where, zf, num_classes, files, base)
    finally:
        if zf is not None:
            zf.close()
    out = []
    for split in ("train", "test"):
        di = dims_of[f"{split}_images"]
        x = arrays[f"{split}_images"].reshape(di[0], 1, 28, 28)  # a writable view of the buffer read
        if family == "emnist":
            for i in range(0, len(x), 4096):  # transposed in place, a block at a time: no second copy
                x[i:i + 4096] = x[i:i + 4096].transpose(0, 1, 3, 2).copy()
        y = arrays[f"{split}_labels"].astype(np.int64)
        if y.size and int(y.max()) >= num_classes:
            bad = int(np.argmax(y >= num_classes))
            raise InvalidParameter(f"{name}: {split} label {bad} is {int(y[bad])}, out of range [0, {num_classes})")
        out += [x, y]
    if family == "mnist":
        class_names = _MNIST_CLASSES
    elif family == "fashion_mnist":
        class_names = _FASHION_CLASSES
    d = digest.hexdigest()
    title = {"mnist": "MNIST", "fashion_mnist": "Fashion-MNIST"}.get(family, f"EMNIST {name[len('emnist_'):]}")
    what = where.name if kind == "zip" else "IDX files"
    src_line = f"{title} ({what}; {len(out[1]):,} train + {len(out[3]):,} test) sha256:{d}"
    return ImageFiles(*_tensors(*out), num_classes=num_classes, digest=d, files=files, source=src_line,
                      class_names=class_names, name=name)


def _emnist_mapping(name: str, kind: str, where: Path, zf: zipfile.ZipFile | None, k: int,
                    files: dict[str, str], base: Path) -> tuple[str, ...]:
    """EMNIST's ``emnist-<split>-mapping.txt`` (lines ``label ascii-code [ascii-code]``) as class
    names; ``()`` when absent. ``letters``' class 0 (unused) is named ``"N/A"``."""
    fname = f"emnist-{name[len('emnist_'):]}-mapping.txt"
    text: bytes | None = None
    if zf is not None:
        hits = [i for i in zf.infolist() if PurePosixPath(i.filename).name == fname]
        if len(hits) == 1 and hits[0].file_size <= 1 << 16:
            text = zf.read(hits[0])
    elif (where / fname).is_file() and (where / fname).stat().st_size <= 1 << 16:
        _check_file(where / fname, _rel(where / fname, base), name, files)
        text = (where / fname).read_bytes()
    if text is None:
        return ()
    names = ["N/A"] * k
    for line in text.decode("ascii", "replace").splitlines():
        parts = line.split()
        if not parts:
            continue
        try:
            lab, code = int(parts[0]), int(parts[1])
        except (ValueError, IndexError):
            raise InvalidParameter(f"{name}: {fname}: line {line[:80]!r} is not 'label ascii-code'") from None
        if not 0 <= lab < k:  # -1 would name the last class (a negative index), k an IndexError
            raise InvalidParameter(f"{name}: {fname}: label {lab} is outside the split's classes [0, {k})")
        if not 0 <= code < 0x110000:
            raise InvalidParameter(f"{name}: {fname}: label {lab}: code {code} is not a character")
        names[lab] = chr(code)
    return tuple(names)


# ----------------------------------------------------------------------------- LEAF


def _leaf_dirs(what: str, p: Path) -> tuple[Path, list[Path], list[Path]]:
    for cand in (p, p / "data"):
        tr, te = cand / "train", cand / "test"
        if tr.is_dir() and te.is_dir():
            trf = sorted(f for f in tr.glob("*.json") if f.is_file())
            tef = sorted(f for f in te.glob("*.json") if f.is_file())
            if not trf or not tef:
                raise InvalidParameter(f"{what}: {cand}: train/ has {len(trf)} and test/ {len(tef)} .json file(s); "
                                       "LEAF writes at least one in each (run LEAF's preprocess.sh with a train/test "
                                       "split, e.g. -t sample)")
            return cand, trf, tef
    raise InvalidParameter(f"{what}: {p}: expected LEAF's train/ and test/ folders of .json files (LEAF's "
                           f"data/<dataset>/data after preprocess.sh), here or in {p / 'data'}")


_MAX_JSON_BYTES = 4 << 30  # LEAF writes a few hundred MB per file


def _leaf_file(what: str, path: Path, rel: str, files: dict[str, str], digest: _Digest, budget: _Budget
               ) -> Iterator[tuple[str, list[Any], list[Any]]]:
    """(user, x, y) of each user of one LEAF JSON file, checked against 'num_samples'. The file's
    bytes and its parsed JSON are charged to ``budget`` before they are read and parsed, and
    given back when the next file is read."""
    size = path.stat().st_size
    if size > _MAX_JSON_BYTES:
        raise InvalidParameter(f"{what}: {path}: {size:,} bytes, more than {_MAX_JSON_BYTES:,}")
    budget.charge(size, path, "reading the file")
    raw = path.read_bytes()
    files[rel] = hashlib.sha256(raw).hexdigest()
    digest.add(rel, raw)
    cost = _json_cost(raw)
    budget.charge(cost, path, "parsing its JSON")
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise InvalidParameter(f"{what}: {path}: not JSON ({exc})") from None
    del raw
    budget.release(size)
    try:
        yield from _leaf_users(what, path, doc)
    finally:
        budget.release(cost)


def _leaf_users(what: str, path: Path, doc: Any) -> Iterator[tuple[str, list[Any], list[Any]]]:
    if not isinstance(doc, dict) or not all(k in doc for k in ("users", "num_samples", "user_data")):
        raise InvalidParameter(f"{what}: {path}: a LEAF file is an object with 'users', 'num_samples' and "
                               "'user_data'")
    users, counts, data = doc["users"], doc["num_samples"], doc["user_data"]
    if not (isinstance(users, list) and isinstance(counts, list) and isinstance(data, dict)):
        raise InvalidParameter(f"{what}: {path}: 'users' and 'num_samples' must be lists, 'user_data' an object")
    if len(users) != len(counts):
        raise InvalidParameter(f"{what}: {path}: {len(users)} users but {len(counts)} num_samples")
    for u, n in zip(users, counts):
        if not isinstance(u, str) or u not in data:
            raise InvalidParameter(f"{what}: {path}: user {u!r} has no entry in user_data")
        d = data.pop(u)
        if not isinstance(d, dict) or not isinstance(d.get("x"), list) or not isinstance(d.get("y"), list):
            raise InvalidParameter(f"{what}: {path}: user_data[{u!r}] must hold lists 'x' and 'y'")
        if not (len(d["x"]) == len(d["y"]) == n):
            raise InvalidParameter(f"{what}: {path}: user {u!r}: {len(d['x'])} x, {len(d['y'])} y, num_samples {n!r}")
        yield u, d["x"], d["y"]


def _leaf_read(what: str, directory: str | Path, convert: Callable[[str, str, list[Any], list[Any]], tuple[np.ndarray, np.ndarray]]
               ) -> tuple[dict[str, str], str, tuple[str, ...], list[tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    """Read LEAF's train/ and test/ files one at a time (each file's JSON is converted by
    ``convert(split, user, x, y) -> (x array, y array)`` and dropped before the next is loaded).
    Returns (files, digest, group names, [(x, y, group ids) for train, test])."""
    p = _dir(directory, what)
    if not p.is_dir():
        raise InvalidParameter(f"{what}: {p}: not a directory")
    base, trf, tef = _leaf_dirs(what, p)
    files: dict[str, str] = {}
    digest = _Digest()
    budget = _Budget(what)
    names: dict[str, int] = {}
    out = []
    for split, paths in (("train", trf), ("test", tef)):
        xs: list[np.ndarray] = []
        ys: list[np.ndarray] = []
        gs: list[np.ndarray] = []
        for f in paths:
            for u, x, y in _leaf_file(what, f, _rel(f, base), files, digest, budget):
                if not x:
                    continue
                a, b = convert(split, u, x, y)  # a user's arrays: smaller than the JSON charged for them
                budget.charge(a.nbytes + b.nbytes + 8 * len(b), f, f"keeping user {u!r}'s samples")
                xs.append(a)
                ys.append(b)
                gs.append(np.full(len(b), names.setdefault(u, len(names)), dtype=np.int64))
        if split == "train" and not xs:
            raise InvalidParameter(f"{what}: {base}: no training samples in train/")
        budget.charge(sum(a.nbytes for a in xs + ys + gs), base / split, "joining the samples into arrays")
        out.append((np.concatenate(xs) if xs else np.zeros((0,), np.int64),
                    np.concatenate(ys) if ys else np.zeros(0, np.int64),
                    np.concatenate(gs) if gs else np.zeros(0, np.int64)))
    return files, digest.hexdigest(), tuple(names), out


def read_leaf_femnist(directory: str | Path) -> ImageFiles:
    """LEAF's FEMNIST: ``train/*.json`` and ``test/*.json`` (module docstring), in
    ``directory`` or ``directory/data``.

    Each sample's ``x`` is 784 values in [0, 1] (LEAF divides the 28×28 grey image by 255; the
    NIST forms are dark ink on a white background, so the background is 1.0 — the opposite of
    MNIST, not inverted here); they are returned as ``(N, 1, 28, 28)`` uint8 (``round(255·x)``).
    ``y`` is 0..61 (digits, upper case, lower case: LEAF's ``relabel_class``). ``groups`` gives
    each training sample's writer as an index into ``group_names`` (writers in order of first
    appearance, train then test, files sorted by name), ``test_groups`` the same for the test
    samples. Files are read one at a time, so memory holds one file's JSON at once.
    """
    what = "leaf_femnist"

    def convert(split: str, u: str, x: list[Any], y: list[Any]) -> tuple[np.ndarray, np.ndarray]:
        try:
            a = np.asarray(x, dtype=np.float64)
            b = np.asarray(y, dtype=np.float64)
        except OverflowError:  # an integer of thousands of digits
            raise InvalidParameter(f"{what}: {split} user {u!r}: pixel values must be in [0, 1] and labels in [0, 61]; "
                                   "a number is too large for a float") from None
        except (ValueError, TypeError):
            raise InvalidParameter(f"{what}: {split} user {u!r}: x must be lists of 784 numbers, y numbers") from None
        if a.ndim != 2 or a.shape[1] != 784:
            raise InvalidParameter(f"{what}: {split} user {u!r}: x has shape {a.shape}; expected ({len(x)}, 784)")
        if not np.all(np.isfinite(a)) or a.min() < 0 or a.max() > 1:
            raise InvalidParameter(f"{what}: {split} user {u!r}: pixel values must be in [0, 1]")
        if b.ndim != 1 or not np.all(b == np.round(b)) or b.min() < 0 or b.max() > 61:
            raise InvalidParameter(f"{what}: {split} user {u!r}: labels must be integers in [0, 61]")
        return np.rint(a * 255).astype(np.uint8).reshape(-1, 1, 28, 28), b.astype(np.int64)

    files, d, names, ((trx, try_, trg), (tex, tey, teg)) = _leaf_read(what, directory, convert)
    if not len(tey):
        tex = np.zeros((0, 1, 28, 28), np.uint8)
    src = f"LEAF FEMNIST ({len(files)} JSON files; {len(try_):,} train + {len(tey):,} test, {len(names)} writers) sha256:{d}"
    t = _tensors(trx, try_, tex, tey, trg, teg)
    return ImageFiles(t[0], t[1], t[2], t[3], num_classes=62, groups=t[4], group_names=names, digest=d,
                      files=files, source=src, class_names=_FEMNIST_CLASSES, test_groups=t[5], name=what)


def read_leaf_shakespeare(directory: str | Path, *, unknown: Literal["space", "error"] = "space") -> SequenceFiles:
    """LEAF's Shakespeare: ``train/*.json`` and ``test/*.json``, in ``directory`` or ``directory/data``.

    Each sample's ``x`` is a string of 80 characters and ``y`` the character that follows
    (LEAF's ``shake_utils.py``: a sliding window over each role's lines, left-padded with
    spaces). Characters become ids over LEAF's fixed 80-symbol vocabulary :data:`LEAF_LETTERS`
    (``ALL_LETTERS`` of LEAF's ``language_utils.py``): ``train_x`` ``(N, 80)`` int64,
    ``train_y`` ``(N,)`` int64. LEAF's preprocessing does not restrict the text to that
    vocabulary; a character outside it is, with ``unknown = "space"`` (default), mapped to the
    space — LEAF's own "unknown character symbol" in ``shake_utils.py`` — and counted in
    ``unknown_symbols``; ``unknown = "error"`` refuses it. ``groups``: each training sample's
    speaking role (LEAF's user, e.g. ``THE_TRAGEDY_OF_KING_LEAR_KING``) as an index into
    ``group_names``.
    """
    what = "leaf_shakespeare"
    if unknown not in ("space", "error"):
        raise InvalidParameter(f"{what}: unknown = {unknown!r}: must be 'space' or 'error'")
    table = np.full(0x110000, -1, dtype=np.int16)
    for i, c in enumerate(LEAF_LETTERS):
        table[ord(c)] = i
    space = LEAF_LETTERS.index(" ")
    state = {"seq_len": 0, "unknown": 0}

    def ids(split: str, u: str, text: str) -> np.ndarray:
        cps = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        v = table[cps].astype(np.int64)
        miss = v < 0
        if miss.any():
            if unknown == "error":
                chars = sorted({chr(c) for c in cps[miss][:1000]})
                raise InvalidParameter(f"{what}: {split} user {u!r}: {int(miss.sum())} character(s) outside LEAF's "
                                       f"80-symbol vocabulary, e.g. {''.join(chars[:10])!r}; unknown = 'space' maps "
                                       "them to the space as LEAF's preprocessing does")
            state["unknown"] += int(miss.sum())
            v[miss] = space
        return v

    def convert(split: str, u: str, x: list[Any], y: list[Any]) -> tuple[np.ndarray, np.ndarray]:
        if not all(isinstance(s, str) for s in x) or not all(isinstance(s, str) and len(s) == 1 for s in y):
            raise InvalidParameter(f"{what}: {split} user {u!r}: x must be strings and y single characters")
        lens = np.fromiter(map(len, x), dtype=np.int64, count=len(x))
        if not state["seq_len"]:
            state["seq_len"] = int(lens[0])
        n = state["seq_len"]
        if n < 1 or not np.all(lens == n):
            bad = int(np.argmax(lens != n)) if n >= 1 else 0
            raise InvalidParameter(f"{what}: {split} user {u!r}: sample {bad} has {int(lens[bad])} characters; every x "
                                   f"must have the same length ({n}; LEAF writes 80)")
        return ids(split, u, "".join(x)).reshape(len(x), n), ids(split, u, "".join(y))

    files, d, names, ((trx, try_, trg), (tex, tey, teg)) = _leaf_read(what, directory, convert)
    if not len(tey):
        tex = np.zeros((0, state["seq_len"]), np.int64)
    n_unknown = state["unknown"]
    extra = f", {n_unknown:,} unknown symbols → ' '" if n_unknown else ""
    src = (f"LEAF Shakespeare ({len(files)} JSON files; {len(try_):,} train + {len(tey):,} test, {len(names)} roles"
           f"{extra}) sha256:{d}")
    t = _tensors(trx, try_, tex, tey, trg, teg)
    return SequenceFiles(t[0], t[1], t[2], t[3], vocab=LEAF_LETTERS, num_classes=len(LEAF_LETTERS), groups=t[4],
                         group_names=names, test_groups=t[5], digest=d, files=files, source=src,
                         unknown_symbols=n_unknown)


# ----------------------------------------------------------------------------- text


def read_text_dir(directory: str | Path) -> TextFiles:
    """Every ``*.txt`` file under ``directory`` (recursively, symlinks not followed, sorted by
    path; no more files and bytes than a ``text_dir`` may hold:
    :func:`redteam.workloads.corpus.list_files`), decoded as UTF-8 (a leading byte-order mark is
    dropped); an undecodable file is an error naming it and the byte offset. Returns the raw texts, their names and digests
    (:class:`TextFiles`); :mod:`redteam.workloads.corpus` tokenizes them (bytes) and cuts windows."""
    what = "text"
    p = _dir(directory, what)
    if not p.is_dir():
        raise InvalidParameter(f"{what}: {p}: not a directory")
    from .corpus import list_files

    paths = sorted(list_files(p, f"{what}: {p}", ".txt"), key=lambda f: f.relative_to(p).as_posix())
    if not paths:
        raise InvalidParameter(f"{what}: {p}: no .txt files (every *.txt below it is one document)")
    texts, names, sums, groups = [], [], [], []
    files: dict[str, str] = {}
    budget = _Budget(what)
    for f in paths:
        rel = f.relative_to(p)
        size = f.stat().st_size
        if size > MAX_FILE_BYTES:
            raise InvalidParameter(f"{what}: {f}: {size:,} bytes, more than {MAX_FILE_BYTES:,}")
        budget.charge(3 * size, f, "reading and decoding it")  # its bytes, its text, its document
        raw = f.read_bytes()
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise InvalidParameter(f"{what}: {f}: not UTF-8 (byte {exc.start}: {exc.reason})") from None
        names.append(rel.as_posix())
        texts.append(text)
        sums.append(hashlib.sha256(raw).hexdigest())
        files[rel.as_posix()] = sums[-1]
        groups.append(rel.parts[0] if len(rel.parts) > 1 else rel.as_posix())
    tf = TextFiles(tuple(texts), tuple(names), tuple(sums), tuple(groups), str(p.resolve()))
    from .corpus import digest as corpus_digest

    d = corpus_digest(tf.documents())
    total = sum(len(t) for t in texts)
    src = f"text folder {p.name}/ ({len(texts)} .txt documents, {total:,} characters) sha256:{d}"
    return TextFiles(tf.texts, tf.names, tf.digests, tf.groups, tf.root, d, files, src)


# ----------------------------------------------------------------------------- Hugging Face save_to_disk


def _pyarrow() -> Any:
    try:
        import pyarrow as pa
        import pyarrow.ipc  # noqa: F401
    except ImportError:
        raise InvalidParameter("hf_saved: reading a save_to_disk folder needs pyarrow: pip install pyarrow") from None
    version = tuple(int(v) for v in re.findall(r"\d+", pa.__version__)[:3])
    if version < (14, 0, 1):  # CVE-2023-47248: older pyarrow may unpickle extension-type metadata
        raise InvalidParameter(f"hf_saved: pyarrow {pa.__version__} can unpickle data while reading (CVE-2023-47248): "
                               "pip install 'pyarrow>=14.0.1'")
    return pa


#: the largest metadata file (dataset_info.json, state.json, dataset_dict.json) read: datasets
#: writes a few KB (a long description and download checksums: a few hundred KB)
_METADATA_BYTES = 4 << 20


def _load_json(path: Path, what: str, files: dict[str, str], rel: str, digest: _Digest, budget: _Budget) -> Any:
    size = path.stat().st_size
    if size > _METADATA_BYTES:
        raise InvalidParameter(f"{what}: {path}: {size:,} bytes: too large for a metadata file (at most "
                               f"{_METADATA_BYTES:,})")
    raw = path.read_bytes()
    files[rel] = hashlib.sha256(raw).hexdigest()
    digest.add(rel, raw)
    return _parse_json(raw, path, what, budget)


_ARROW_NAME = re.compile(r"^[A-Za-z0-9._-]+\.arrow$")


def _fb(buf: Any, pos: int, fmt: str) -> Any:
    """One little-endian value of ``buf`` at ``pos``; a position outside it is a ValueError."""
    if pos < 0 or pos + struct.calcsize(fmt) > len(buf):
        raise ValueError("an offset outside the message")
    return struct.unpack_from("<" + fmt, buf, pos)[0]


class _FlatTable:
    """One table of a FlatBuffers buffer (the encoding of Arrow's IPC message metadata), read
    with every offset checked: just what :func:`_decompressed_size` needs."""

    def __init__(self, buf: Any, pos: int) -> None:
        self.buf, self.pos = buf, pos
        self.vtable = pos - _fb(buf, pos, "i")
        self.vsize = _fb(buf, self.vtable, "H")

    def _slot(self, i: int) -> int:
        at = 4 + 2 * i
        return _fb(self.buf, self.vtable + at, "H") if at + 2 <= self.vsize else 0

    def scalar(self, i: int, fmt: str) -> Any:
        slot = self._slot(i)
        return _fb(self.buf, self.pos + slot, fmt) if slot else 0

    def table(self, i: int) -> "_FlatTable | None":
        slot = self._slot(i)
        return _FlatTable(self.buf, self.pos + slot + _fb(self.buf, self.pos + slot, "I")) if slot else None

    def vector(self, i: int) -> tuple[int, int]:
        """(position of the first element, element count) of a vector field."""
        slot = self._slot(i)
        if not slot:
            return 0, 0
        at = self.pos + slot + _fb(self.buf, self.pos + slot, "I")
        return at + 4, _fb(self.buf, at, "I")


def _decompressed_size(metadata: Any, body: Any) -> int:
    """The bytes that decoding one record-batch message allocates, from its metadata (Arrow's
    Message.fbs: Message.header is a RecordBatch, whose ``buffers`` are (offset, length) pairs
    in the body and ``compression`` is set when they are compressed), before decoding it: 0 for
    an uncompressed body (its arrays are views of it), else the uncompressed lengths that the
    format writes as an int64 at the start of each compressed buffer (-1: stored as is)."""
    msg = _FlatTable(metadata, _fb(metadata, 0, "I"))
    batch = msg.table(2)
    if batch is None or batch.table(3) is None:
        return 0
    start, count = batch.vector(2)
    total = 0
    for k in range(count):
        offset, length = _fb(metadata, start + 16 * k, "q"), _fb(metadata, start + 16 * k + 8, "q")
        if length == 0:
            continue
        if offset < 0 or length < 8 or offset + length > len(body):
            raise ValueError(f"buffer {k} ({offset}, {length}) lies outside the {len(body)}-byte body")
        total += max(_fb(body, offset, "q"), 0)
    return total


def _read_arrow(pa: Any, raw: bytes, path: Path, what: str, budget: _Budget) -> Any:
    """The table of one Arrow IPC stream (or file: the stream after its 8-byte magic), read a
    message at a time: a record batch's decompressed size is charged to ``budget`` before it is
    decoded, and every batch is validated fully (offsets inside their buffers, UTF-8 strings)
    before anything reads its values. Dictionary batches are refused (save_to_disk writes none)."""
    buf = pa.py_buffer(raw)
    if raw[:6] == b"ARROW1":
        buf = buf.slice(8)
    schema, batches = None, []
    try:
        reader = pa.ipc.MessageReader.open_stream(pa.BufferReader(buf))
        while True:
            try:
                msg = reader.read_next_message()
            except StopIteration:
                break
            if msg.type == "schema" and schema is None:
                schema = pa.ipc.read_schema(msg)
            elif msg.type == "record batch" and schema is not None:
                body = memoryview(msg.body) if msg.body is not None else memoryview(b"")
                budget.charge(_decompressed_size(memoryview(msg.metadata), body), path,
                              f"decompressing record batch {len(batches)}")
                batch = pa.ipc.read_record_batch(msg, schema)
                batch.validate(full=True)
                batches.append(batch)
            else:
                raise ValueError(f"unexpected {msg.type} message (a schema, then record batches)")
        if schema is None:
            raise ValueError("no schema")
        return pa.Table.from_batches(batches, schema)
    except (pa.ArrowException, OSError, ValueError, struct.error) as exc:
        raise InvalidParameter(f"{what}: {path}: not a valid Arrow IPC stream or file ({exc})") from None


def _python_cost(pa: Any, arr: Any) -> int:
    """About what :func:`_column` allocates for ``arr`` (one chunk): numbers as a numpy array;
    strings and bytes as Python objects (a header, a slot, the bytes); lists and structs as
    Python lists and dicts of their values (and, for lists, a numpy array of them)."""
    t, n = arr.type, len(arr)
    data = sum(b.size for b in arr.buffers() if b is not None)
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        return 8 * n
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or \
            pa.types.is_large_binary(t):
        return 72 * n + data
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        child = arr.flatten()
        return 72 * n + 16 * len(child) + _python_cost(pa, child)
    if pa.types.is_struct(t):
        return 240 * n + sum(_python_cost(pa, c) for c in arr.flatten())
    return 64 * n + 4 * data


def _column(pa: Any, col: Any, what: str) -> Any:
    """A column as numpy (numbers, equal-length lists of numbers) or a tuple of Python values."""
    t = col.type
    if col.null_count:
        raise InvalidParameter(f"{what}: {col.null_count} missing value(s)")
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        return col.to_numpy(zero_copy_only=False)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return tuple(col.to_pylist())
    values = col.to_pylist()
    if (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)) and values:
        try:
            arr = np.asarray(values)
        except ValueError:
            return tuple(values)
        if arr.dtype != object and arr.shape[0] == len(values):
            return arr
    return tuple(values)


def read_hf_saved(directory: str | Path) -> HFSaved:
    """A Hugging Face ``datasets`` folder written by ``save_to_disk``, without the ``datasets``
    package (needs ``pyarrow`` ≥ 14.0.1; ``pip install pyarrow``).

    A ``Dataset`` folder holds ``dataset_info.json`` (the features), ``state.json`` (the data
    files, in order, and the split's name) and ``data-XXXXX-of-NNNNN.arrow`` (Arrow IPC streams);
    a ``DatasetDict`` folder holds ``dataset_dict.json`` (``{"splits": [...]}``) and one such
    folder per split. Only plain file names from ``state.json`` are read (no paths), every
    column must be complete (no nulls), and extension types are read as their storage (nothing is
    unpickled). See :class:`HFSaved` for what comes back and :meth:`HFSaved.image_files` to get
    images and labels as tensors.
    """
    what = "hf_saved"
    p = _dir(directory, what)
    if not p.is_dir():
        raise InvalidParameter(f"{what}: {p}: not a directory")
    pa = _pyarrow()
    files: dict[str, str] = {}
    digest = _Digest()
    budget = _Budget(what)
    if (p / "dataset_dict.json").is_file():
        dd = _load_json(p / "dataset_dict.json", what, files, "dataset_dict.json", digest, budget)
        split_names = dd.get("splits") if isinstance(dd, dict) else None
        if not isinstance(split_names, list) or not split_names or not all(
                isinstance(s, str) and re.fullmatch(r"[A-Za-z0-9._-]+", s) and s not in (".", "..") for s in split_names):
            raise InvalidParameter(f"{what}: {p / 'dataset_dict.json'}: 'splits' must be a list of split folder names")
        if len(set(split_names)) != len(split_names):
            raise InvalidParameter(f"{what}: {p / 'dataset_dict.json'}: a split is listed twice")
        folders = [(s, p / s, s + "/") for s in split_names]
    elif (p / "state.json").is_file() or any(p.glob("data-*.arrow")):
        folders = [("", p, "")]
    else:
        raise InvalidParameter(f"{what}: {p}: expected a save_to_disk folder: dataset_dict.json (a DatasetDict) or "
                               "state.json and data-*.arrow (a Dataset)")
    splits: dict[str, dict[str, Any]] = {}
    num_rows: dict[str, int] = {}
    features: dict[str, dict[str, Any]] = {}
    class_names: dict[str, tuple[str, ...]] = {}
    for split, folder, prefix in folders:
        if not folder.is_dir():
            raise InvalidParameter(f"{what}: {folder}: the split folder dataset_dict.json names is missing")
        info: Any = {}
        if (folder / "dataset_info.json").is_file():
            info = _load_json(folder / "dataset_info.json", what, files, prefix + "dataset_info.json", digest, budget)
        state: Any = {}
        if (folder / "state.json").is_file():
            state = _load_json(folder / "state.json", what, files, prefix + "state.json", digest, budget)
        if state:
            entries = state.get("_data_files") if isinstance(state, dict) else None
            if not isinstance(entries, list) or not entries:
                raise InvalidParameter(f"{what}: {folder / 'state.json'}: '_data_files' must list the .arrow files")
            names = [e.get("filename") if isinstance(e, dict) else None for e in entries]
            seen: set[str] = set()
            for n in names:
                if not isinstance(n, str) or not _ARROW_NAME.match(n):
                    raise InvalidParameter(f"{what}: {folder / 'state.json'}: data file {n!r} is not a plain .arrow "
                                           "file name")
                if n in seen:  # each file is read (and counted) once
                    raise InvalidParameter(f"{what}: {folder / 'state.json'}: lists the data file {n} twice")
                seen.add(n)
            split = split or state.get("_split") or "train"
        else:
            names = sorted(f.name for f in folder.glob("data-*.arrow"))
            split = split or "train"
        if not isinstance(split, str):
            raise InvalidParameter(f"{what}: {folder}: split name {split!r} is not a string")
        tables = []
        for n in names:
            f = folder / n
            if not f.is_file() or f.is_symlink():
                raise InvalidParameter(f"{what}: {f}: listed in state.json but not a file here")
            size = f.stat().st_size
            if size > MAX_FILE_BYTES:
                raise InvalidParameter(f"{what}: {f}: {size:,} bytes, more than {MAX_FILE_BYTES:,}")
            files[prefix + n] = sha256_file(f)
            budget.charge(size, f, "reading the file")
            raw = f.read_bytes()
            digest.add(prefix + n, raw)
            tables.append(_read_arrow(pa, raw, f, what, budget))
        if not tables:
            raise InvalidParameter(f"{what}: {folder}: no data-*.arrow files")
        try:
            table = pa.concat_tables(tables)
        except (pa.ArrowException, ValueError) as exc:
            raise InvalidParameter(f"{what}: {folder}: the .arrow files have different schemas ({exc})") from None
        cols = {}
        for c in table.column_names:
            chunks = table.column(c)
            cost = sum(_python_cost(pa, a) for a in chunks.chunks) + (chunks.nbytes if chunks.num_chunks > 1 else 0)
            budget.charge(cost, f"{folder}: column {c!r}", "converting the column to Python values")
            cols[c] = _column(pa, chunks.combine_chunks(), f"{what}: {split}.{c}")
        splits[split] = cols
        num_rows[split] = table.num_rows
        feats = info.get("features") if isinstance(info, dict) else None
        features[split] = feats if isinstance(feats, dict) else {}
        for c, spec in features[split].items():
            if isinstance(spec, dict) and spec.get("_type") == "ClassLabel" and isinstance(spec.get("names"), list):
                class_names.setdefault(c, tuple(str(n) for n in spec["names"]))
    d = digest.hexdigest()
    rows = ", ".join(f"{s} {n:,}" for s, n in num_rows.items())
    src = f"Hugging Face save_to_disk {p.name}/ ({rows} rows) sha256:{d}"
    return HFSaved(splits, num_rows, features, class_names, d, files, src)


def _pick_column(cols: dict[str, Any], feats: dict[str, Any], ftype: str, names: tuple[str, ...], role: str) -> str:
    typed = [c for c, s in feats.items() if isinstance(s, dict) and s.get("_type") == ftype and c in cols]
    if len(typed) == 1:
        return typed[0]
    for n in names:
        if n in cols:
            return n
    raise InvalidParameter(f"hf_saved: which column holds the {role}s? give {role}=NAME (columns: {sorted(cols)})")


#: the most pixels one encoded image may declare (a PNG's header can declare gigapixels)
_IMAGE_PIXELS = 4096 * 4096


def _images_of(col: Any, what: str, channels: int | None = None, budget: _Budget | None = None) -> np.ndarray:
    """Images ``(N, C, H, W)`` uint8 from a column of arrays or encoded images.

    The layout of an array is decided by the channel count, never by the height: ``(N, H, W)``
    is one channel whatever H is; ``(N, A, B, C)`` is channels-last (the layout a Hugging Face
    ``Image`` feature decodes to) when its trailing size C is 1, 3 or 4 — or equals ``channels``
    when given — and channels-first ``(N, C, H, W)`` only when the trailing size is no channel
    count (or ``channels`` names the second axis, e.g. ``channels=3`` for ``(N, 3, 4, 4)``).
    Encoded images are charged to ``budget`` from the size their headers declare, before each is
    decoded (twice: decoded, then stacked)."""
    budget = budget if budget is not None else _Budget("hf_saved")
    if isinstance(col, np.ndarray):
        a = col
        if a.ndim == 3:
            a = a[:, None]
        elif a.ndim == 4:
            if channels is not None:
                if a.shape[-1] == channels:
                    a = a.transpose(0, 3, 1, 2)
                elif a.shape[1] != channels:
                    raise InvalidParameter(f"hf_saved: {what}: arrays of shape {col.shape[1:]} have no axis of "
                                           f"{channels} channels (channels-last or channels-first)")
            elif a.shape[-1] in (1, 3, 4):
                a = a.transpose(0, 3, 1, 2)
        if a.ndim != 4:
            raise InvalidParameter(f"hf_saved: {what}: arrays of shape {col.shape[1:]} are not images")
        budget.charge(2 * a.size, what, "converting the images")
        if a.dtype != np.uint8:
            if not np.all(np.isfinite(a)) or a.min() < 0 or a.max() > 255 or not np.all(a == np.round(a)):
                raise InvalidParameter(f"hf_saved: {what}: pixel values must be integers in [0, 255]")
            a = a.astype(np.uint8)
        return np.ascontiguousarray(a)
    blobs = []
    for i, v in enumerate(col):
        b = v.get("bytes") if isinstance(v, dict) else v if isinstance(v, bytes) else None
        if not isinstance(b, bytes):
            raise InvalidParameter(f"hf_saved: {what}: row {i} holds no encoded image bytes (an image stored as a path "
                                   "outside the folder is not read)")
        blobs.append(b)
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - matplotlib depends on Pillow
        raise InvalidParameter("hf_saved: decoding encoded images needs Pillow: pip install pillow") from None
    out = []
    for i, b in enumerate(blobs):
        try:
            with Image.open(io.BytesIO(b)) as im:
                if im.width * im.height > _IMAGE_PIXELS:
                    raise InvalidParameter(f"hf_saved: {what}: row {i}: a {im.width}×{im.height} image is too large "
                                           f"(more than {_IMAGE_PIXELS:,} pixels)")
                budget.charge(2 * 4 * im.width * im.height, f"{what}: row {i}", "decoding the image")
                im = im.convert("L") if im.mode in ("1", "L", "I", "I;16", "F") else im.convert("RGB")
                a = np.asarray(im, dtype=np.uint8)
        except InvalidParameter:
            raise
        except Exception as exc:  # Pillow raises many types for a bad image
            raise InvalidParameter(f"hf_saved: {what}: row {i}: not a decodable image ({exc})") from None
        out.append(a[None] if a.ndim == 2 else a.transpose(2, 0, 1))
    if not out:
        raise InvalidParameter(f"hf_saved: {what}: no images")
    shapes = {o.shape for o in out}
    if len(shapes) > 1:
        raise InvalidParameter(f"hf_saved: {what}: images of different shapes {sorted(shapes)[:3]}; resize them first")
    return np.stack(out)


def _labels_of(col: Any, what: str) -> np.ndarray:
    a = np.asarray(col)
    if a.ndim != 1 or a.dtype.kind not in "iub":
        raise InvalidParameter(f"hf_saved: {what}: labels must be one integer per row")
    return a.astype(np.int64)
