"""``redteam data list | check DIR | fetch NAME --dir D``: the standard dataset files on disk.

``list`` says which datasets the readers of :mod:`redteam.workloads.files` read, in which format,
from which files, and where the published ones come from. ``check`` finds the datasets in a
folder, hashes every file and compares it with the published SHA-256
(:mod:`redteam.workloads.digests`). ``fetch`` downloads a dataset's published files from their
canonical addresses (the only command here that uses the network; no test runs it): into
``FILE.part``, resumed with an HTTP range request when a ``.part`` is already there, checked
against the published size and SHA-256, and only then renamed to ``FILE``. A ``.part`` that is
a link (symbolic or hard) or not a regular file is refused, never written through.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import stat
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .errors import InvalidParameter

__all__ = ["register", "detect", "fetch", "Found"]

_NAMES_HELP = ("cifar10, cifar100, mnist, fashion_mnist, emnist (or emnist_<split>: byclass, bymerge, balanced, "
               "letters, digits, mnist), leaf_femnist, leaf_shakespeare, hf_saved, text")


def register(sub: Any) -> None:
    p = sub.add_parser(
        "data",
        help="the standard dataset files: list the known ones, check a folder's SHA-256, fetch the published files",
        description=textwrap.dedent(
            """\
            Datasets live in a folder you name; redteam reads the standard on-disk formats in place
            (redteam.workloads.files) and checks every file whose published SHA-256 it knows, so a
            result names exactly the bytes it was measured on.

              redteam data list                      the datasets, their formats, files and addresses
              redteam data check DIR                 which datasets DIR holds; every file's SHA-256 vs
                                                     the published one (exit 0: no mismatch)
              redteam data fetch cifar10 --dir DIR   download the published files, verified

            Formats read: CIFAR-10/100 binary (not the pickle one), IDX (MNIST, Fashion-MNIST, EMNIST),
            LEAF JSON (FEMNIST, Shakespeare), Hugging Face save_to_disk folders (needs pyarrow), and
            folders of UTF-8 .txt files."""
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ds = p.add_subparsers(dest="data_action", metavar="ACTION")

    ls = ds.add_parser(
        "list", help="the datasets redteam reads: name, format, expected files, canonical addresses",
        description="Every dataset the readers know: its format, the files a reader expects in the folder you give, "
                    "and for those with published files their address, size and SHA-256 (and the source of the "
                    "digest).",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ls.add_argument("--names", action="store_true", help="names only, one per line")
    ls.set_defaults(handler=_cmd_list)

    ck = ds.add_parser(
        "check", help="find the datasets in DIR and verify every file against its published SHA-256",
        description=textwrap.dedent(
            """\
            Look through DIR (four levels deep, symlinks not followed) for the files of the known
            datasets, hash each one and print a table: file, size, SHA-256, status:

              ok        the published SHA-256 of this file (and its size) match
              mismatch  a published SHA-256 exists and differs: a damaged or different file
              unknown   no digest is published for this file (an extracted member, a decompressed
                        file, LEAF's JSON, your own data): it is accepted, its digest shown
              refused   a format redteam never reads (CIFAR's pickle distribution)
              invalid   no digest is published, and an IDX-named file's header is not IDX (or
                        its size disagrees with its header): not the file its name says

            MNIST and Fashion-MNIST use the same file names: their digests tell them apart (--name
            checks against one). --read also runs the dataset's reader, which checks the structure
            (headers, sizes, labels) and prints what it read.

            Exit status: 0 when no file mismatches and something was recognised; 1 on a mismatch, a
            refused format, an invalid file, a reader error (--read), or when DIR holds nothing
            recognisable."""
        ),
        epilog="examples:\n  redteam data check ~/data/cifar\n  redteam data check ~/data/mnist --name mnist --read",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ck.add_argument("dir", metavar="DIR", help="the folder to look through (or one archive file)")
    ck.add_argument("--name", metavar="NAME", help=f"only this dataset, checked against its digests: {_NAMES_HELP}")
    ck.add_argument("--read", action="store_true", help="also read each dataset found, with its reader")
    ck.set_defaults(handler=_cmd_check)

    ft = ds.add_parser(
        "fetch", help="download a dataset's published files into --dir, verified by size and SHA-256",
        description=textwrap.dedent(
            """\
            Download NAME's published files (`redteam data list` shows them) from their canonical
            addresses into DIR. Each file is written to FILE.part; a .part left by an interrupted
            run is resumed (HTTP range request) when the server allows it; the finished file must
            have the published size and SHA-256, and only then is it renamed to FILE. A file
            already in DIR is verified and kept; one that differs from the published file is left
            alone and reported (move it away to download again).

            Downloadable: cifar10, cifar100 (binary archives, ~170 MB each), mnist, fashion_mnist
            (four .gz files each, ~12 / ~30 MB), emnist (NIST's gzip.zip of all splits, 562 MB).
            LEAF's datasets are generated by LEAF's own scripts; hf_saved and text are your own."""
        ),
        epilog="example:\n  redteam data fetch cifar10 --dir ~/data/cifar && redteam data check ~/data/cifar --read",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ft.add_argument("name", metavar="NAME", help="the dataset: cifar10, cifar100, mnist, fashion_mnist, emnist")
    ft.add_argument("--dir", required=True, metavar="D", dest="dest", help="where the files go (created if needed)")
    ft.add_argument("--quiet", action="store_true", help="no progress bar")
    ft.set_defaults(handler=_cmd_fetch)

    def _help(args: argparse.Namespace) -> int:
        p.print_help()
        return 2

    p.set_defaults(handler=_help)


# ----------------------------------------------------------------------------- detection


_IDX_MNIST = re.compile(r"^(train|t10k)-(images-idx3|labels-idx1)-ubyte(\.gz)?$")
_IDX_FILE = re.compile(r"-(?:images-idx3|labels-idx1)-ubyte(?:\.gz)?$")
_IDX_EMNIST = re.compile(r"^emnist-([a-z]+)-(?:(?:train|test)-(?:images-idx3|labels-idx1)-ubyte(?:\.gz)?|mapping\.txt)$")
_MAX_DEPTH = 4
_MAX_ENTRIES = 100_000


@dataclass
class Found:
    """One dataset found by :func:`detect`: its name (or the names it may be), where it is (the
    folder or archive a reader takes), its files, and a note."""

    name: str
    where: Path
    files: list[Path] = field(default_factory=list)
    candidates: tuple[str, ...] = ()
    refused: str = ""


def _walk(root: Path) -> list[Path]:
    out: list[Path] = []
    stack = [(root, 0)]
    seen = 0
    while stack:
        d, depth = stack.pop()
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError:
            continue
        for e in entries:
            seen += 1
            if seen > _MAX_ENTRIES:
                raise InvalidParameter(f"data check: {root}: more than {_MAX_ENTRIES:,} entries; name the dataset's own "
                                       "folder")
            if e.is_symlink():
                continue
            if e.is_dir(follow_symlinks=False):
                if depth + 1 < _MAX_DEPTH:
                    stack.append((Path(e.path), depth + 1))
            elif e.is_file(follow_symlinks=False):
                out.append(Path(e.path))
    return sorted(out)


def _leaf_kind(folder: Path, sample: Path) -> str:
    """leaf_femnist or leaf_shakespeare, from the folder names or the first bytes of one file."""
    parts = {q.lower() for q in folder.parts}
    if "femnist" in parts:
        return "leaf_femnist"
    if "shakespeare" in parts:
        return "leaf_shakespeare"
    try:
        with sample.open("rb") as f:
            head = f.read(1 << 16).decode("utf-8", "replace")
    except OSError:
        return "leaf"
    m = re.search(r'"x"\s*:\s*\[\s*(\[|")', head)
    if m:
        return "leaf_femnist" if m.group(1) == "[" else "leaf_shakespeare"
    return "leaf"


def detect(directory: str | Path, *, text: bool = False) -> list[Found]:
    """The datasets whose files are under ``directory`` (see ``redteam data check --help``).

    ``.txt`` files not part of another dataset count as a text corpus when nothing else is
    found, or always with ``text=True``."""
    root = Path(directory).expanduser()
    if not root.exists():
        raise InvalidParameter(f"data check: {root}: no such file or directory")
    paths = [root] if root.is_file() else _walk(root)
    groups: dict[tuple[str, Path], Found] = {}

    def add(name: str, where: Path, f: Path, **kw: Any) -> None:
        g = groups.setdefault((name, where), Found(name, where, **kw))
        g.files.append(f)

    claimed: set[Path] = set()
    for f in paths:
        b, parent = f.name, f.parent
        hit = True
        if b in ("cifar-10-python.tar.gz", "cifar-100-python.tar.gz") or parent.name in ("cifar-10-batches-py",
                                                                                          "cifar-100-python"):
            name = "cifar10" if "-10-" in b + "/" + parent.name + "/" else "cifar100"
            add(name + " (python)", parent if f != root else f, f, refused="CIFAR's Python distribution is pickle "
                "files, never read: use the binary one (redteam data fetch " + name + " --dir DIR)")
        elif b == "cifar-10-binary.tar.gz":
            add("cifar10", f, f)
        elif b == "cifar-100-binary.tar.gz":
            add("cifar100", f, f)
        elif parent.name == "cifar-10-batches-bin":
            add("cifar10", parent, f)
        elif parent.name == "cifar-100-binary":
            add("cifar100", parent, f)
        elif b == "gzip.zip":
            add("emnist", f, f)
        elif (m := _IDX_EMNIST.match(b)) is not None:
            add(f"emnist_{m.group(1)}", parent, f)
        elif _IDX_MNIST.match(b):
            add("mnist|fashion_mnist", parent, f, candidates=("mnist", "fashion_mnist"))
        elif b in ("dataset_dict.json",):
            add("hf_saved", parent, f)
        elif b in ("state.json", "dataset_info.json") or (b.startswith("data-") and b.endswith(".arrow")):
            top = parent.parent if (parent.parent / "dataset_dict.json").is_file() else parent
            add("hf_saved", top, f)
        elif b.endswith(".json") and parent.name in ("train", "test"):
            add("leaf", parent.parent, f)
        else:
            hit = False
        if hit:
            claimed.add(f)
    found = list(groups.values())
    for g in found:
        if g.name == "leaf":
            g.name = _leaf_kind(g.where, g.files[0])
    if not found or text:
        txt = [f for f in paths if f.suffix == ".txt" and f not in claimed]
        if txt:
            found.append(Found("text", root if root.is_dir() else root.parent, txt))
    return sorted(found, key=lambda g: (str(g.where), g.name))


# ----------------------------------------------------------------------------- check


def _family(name: str) -> str:
    return "emnist" if name.startswith("emnist") else name


def _status(g: Found, f: Path, digest: str, size: int) -> tuple[str, str]:
    """(status, note) of one file of group ``g``; a group still naming several candidates (MNIST or
    Fashion-MNIST, matching neither) has its published file names as mismatches."""
    from .workloads import digests as D

    if g.refused:
        return "refused", ""
    names = g.candidates or (g.name,)
    pubs = [p for n in names if (p := D.published_for(n).get(f.name)) is not None]
    if not pubs:
        return "unknown", ""
    from .workloads.files import matches_published

    for p in pubs:
        ok, how = matches_published(f, p, digest, size)
        if ok:
            return "ok", how
    if g.candidates:
        return "mismatch", "matches neither " + " nor ".join(f"{n}'s" for n in g.candidates) + " published file"
    return "mismatch", f"expected {pubs[0].sha256} ({pubs[0].size:,} bytes)"


def _resolve_ambiguous(g: Found, sums: dict[Path, tuple[str, int]]) -> None:
    """Name an MNIST-or-Fashion-MNIST folder by which dataset's published digests its files match
    (left unresolved when none does)."""
    from .workloads import digests as D

    from .workloads.files import matches_published

    score = {c: sum(1 for f in g.files if (p := D.published_for(c).get(f.name)) is not None
                    and matches_published(f, p, *sums[f])[0])
             for c in g.candidates}
    best = max(g.candidates, key=lambda c: score[c])
    if score[best]:
        g.name, g.candidates = best, ()


def _cmd_check(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from .runner.outputs import terminal_safe
    from .workloads import digests as D
    from .workloads.files import sha256_file

    want = args.name
    if want is not None and D.dataset_info(want) is None and want != "emnist":
        raise InvalidParameter(f"data check: --name {want!r}: not a known dataset; known: {_NAMES_HELP}")
    root = Path(args.dir).expanduser()
    found = detect(root, text=want == "text")
    if want is not None:
        keep = []
        for g in found:
            if g.candidates and want in g.candidates:
                g.name, g.candidates = want, ()
                keep.append(g)
            elif g.name == want or (want == "emnist" and g.name.startswith("emnist")) or (
                    _family(want) == "emnist" and g.name == "emnist"):
                keep.append(g)
            elif g.name == want + " (python)":
                keep.append(g)
        found = keep
    if not found:
        info = D.dataset_info(want) if want else None
        expected = ("; ".join(info.expected) if info else
                    "cifar-10-binary.tar.gz or cifar-10-batches-bin/, cifar-100-binary.tar.gz or cifar-100-binary/, "
                    "IDX files (train-images-idx3-ubyte[.gz], …; emnist-<split>-…; gzip.zip), LEAF's train/ and test/ "
                    "*.json, a save_to_disk folder (dataset_dict.json or state.json + data-*.arrow), or *.txt files")
        print(f"redteam: error: data check: {terminal_safe(root)}: no {want + ' ' if want else ''}dataset files found; "
              f"expected {terminal_safe(expected)} (redteam data list shows each layout)", file=sys.stderr)
        return 1

    console = Console(width=None if sys.stdout.isatty() else 180, markup=False, highlight=False)
    bad = 0
    for g in found:
        sums = {f: (sha256_file(f), f.stat().st_size) for f in g.files}
        if g.candidates:
            _resolve_ambiguous(g, sums)
        info = D.dataset_info(g.name)
        title = f"{g.name}" + (f" ({info.format})" if info else "") + f" — {g.where}"
        t = Table(title=Text(terminal_safe(title)), title_justify="left")
        for h, just in (("file", "left"), ("size", "right"), ("sha256", "left"), ("status", "left")):
            t.add_column(Text(h), justify=just, overflow="fold")  # type: ignore[arg-type]
        counts: dict[str, int] = {}
        notes: list[str] = []
        base = g.where if g.where.is_dir() else g.where.parent
        for f in g.files:
            digest, size = sums[f]
            status, note = _status(g, f, digest, size)
            if status == "unknown" and _IDX_FILE.search(f.name):  # nothing to compare with: the header, at least
                from .workloads.files import check_idx_header

                try:
                    check_idx_header(f)
                except InvalidParameter as exc:
                    status, note = "invalid", str(exc).removeprefix(f"{f.name}: ")
            counts[status] = counts.get(status, 0) + 1
            try:
                rel = f.relative_to(base).as_posix()
            except ValueError:
                rel = f.name
            t.add_row(Text(terminal_safe(rel)), Text(f"{size:,}"), Text(digest), Text(status))
            if note:
                notes.append(f"{terminal_safe(rel)}: {note}")
        console.print(t)
        for n in notes:
            console.print(Text(f"  {n}"))
        if g.refused:
            console.print(Text(f"  refused: {g.refused}"))
        summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
        console.print(Text(f"  {g.name}: {len(g.files)} file(s): {summary}"))
        if counts.get("mismatch") or counts.get("refused") or counts.get("invalid"):
            bad += 1
            if g.candidates:
                console.print(Text(f"  not the published files of {' or '.join(g.candidates)} (damaged, or another "
                                   "dataset in the same format); --name NAME checks against one"))
            elif counts.get("mismatch") and info is not None and info.files:
                console.print(Text(f"  a mismatched file is damaged or another file of the same name: move it away "
                                   f"and run `redteam data fetch {info.name} --dir DIR`"))
        elif args.read:
            bad += _read_one(g, console, want)
    return 1 if bad else 0


def _read_one(g: Found, console: Any, want: str | None = None) -> int:
    from rich.text import Text

    from .errors import RedteamError
    from .runner.outputs import terminal_safe
    from .workloads import files as F

    readers: dict[str, Callable[[], Any]] = {
        "cifar10": lambda: F.read_cifar(g.where, "cifar10"),
        "cifar100": lambda: F.read_cifar(g.where, "cifar100"),
        "mnist": lambda: F.read_idx(g.where, "mnist"),
        "fashion_mnist": lambda: F.read_idx(g.where, "fashion_mnist"),
        "leaf_femnist": lambda: F.read_leaf_femnist(g.where),
        "leaf_shakespeare": lambda: F.read_leaf_shakespeare(g.where),
        "hf_saved": lambda: F.read_hf_saved(g.where),
        "text": lambda: F.read_text_dir(g.where),
    }
    read = readers.get(g.name)
    split = g.name if g.name.startswith("emnist_") else want if g.name == "emnist" and want and want != "emnist" else None
    if read is None and split is not None:
        read = lambda: F.read_idx(g.where, split)  # noqa: E731
    if read is None:
        hint = ("name the split to read the zip: --name emnist_balanced (or another split)" if g.name == "emnist" else
                "not read (which dataset it is is unknown)")
        console.print(Text(f"  read: {g.name}: {hint}"))
        return 0
    try:
        res = read()
    except RedteamError as exc:
        console.print(Text(f"  read: ERROR {terminal_safe(exc)}"))
        return 1
    shape = ""
    if hasattr(res, "train_x"):
        shape = f"train {tuple(res.train_x.shape)}, test {tuple(res.test_x.shape)}, {res.num_classes} classes"
    console.print(Text(f"  read: {terminal_safe(res.source)}" + (f"; {shape}" if shape else "")))
    return 0


# ----------------------------------------------------------------------------- list


def _cmd_list(args: argparse.Namespace) -> int:
    from .workloads import digests as D

    if args.names:
        for n in D.DATASETS:
            print(n)
        return 0
    for info in D.DATASETS.values():
        print(f"{info.name}  [{info.format}]  {info.title}")
        if info.homepage:
            print(f"    home:     {info.homepage}")
        for e in info.expected:
            print(f"    reads:    {e}")
        for p in info.files:
            print(f"    fetch:    {p.url}")
            print(f"              {p.size:,} bytes, sha256 {p.sha256}")
            print(f"              digest from {p.source}")
        if info.note:
            print(f"    note:     {info.note}")
    print("\nreaders: redteam.workloads.files (read_cifar, read_idx, read_leaf_femnist, read_leaf_shakespeare, "
          "read_hf_saved, read_text_dir)")
    return 0


# ----------------------------------------------------------------------------- fetch


def _cmd_fetch(args: argparse.Namespace) -> int:
    for path, status in fetch(args.name, args.dest, progress=not args.quiet):
        print(f"{status:10s} {path}")
    print(f"next: redteam data check {args.dest} --read")
    return 0


def fetch(name: str, dest: str | Path, *, progress: bool = True,
          urlopen: Callable[..., Any] | None = None) -> list[tuple[Path, str]]:
    """Download ``name``'s published files into ``dest`` (see ``redteam data fetch --help``).

    Returns ``(path, "verified" | "downloaded")`` per file. ``urlopen`` (default
    ``urllib.request.urlopen``) is the one place the network is reached."""
    from .workloads import digests as D

    info = D.dataset_info(name) if isinstance(name, str) else None
    if info is None:
        raise InvalidParameter(f"data fetch: {name!r}: not a known dataset; downloadable: "
                               f"{', '.join(n for n, i in D.DATASETS.items() if i.files)} (redteam data list)")
    if not info.files:
        raise InvalidParameter(f"data fetch: {info.name}: {info.note}")
    out = Path(dest).expanduser()
    if out.exists() and not out.is_dir():
        raise InvalidParameter(f"data fetch: --dir {out}: not a directory")
    out.mkdir(parents=True, exist_ok=True)
    if urlopen is None:
        import urllib.request

        urlopen = urllib.request.urlopen
    from .workloads.files import sha256_file

    done: list[tuple[Path, str]] = []
    for pub in info.files:
        final = out / pub.name
        if final.exists():
            got = sha256_file(final)
            if got != pub.sha256 or final.stat().st_size != pub.size:
                raise InvalidParameter(f"data fetch: {final} is already there and is not the published file (SHA-256 "
                                       f"{got}, expected {pub.sha256}): move it away to download it again")
            done.append((final, "verified"))
            continue
        _download(pub, final, urlopen, progress)
        done.append((final, "downloaded"))
    return done


def _open_part(part: Path) -> int:
    """A read-write descriptor of the partial download ``part``: a new file, or the regular
    file a former download left there (to resume it). Nothing at that path is followed:
    a symbolic link (dangling or not), a file with another name linked to it (a hard
    link), a folder or a device is refused in one line and left as it is, so that no
    download writes into a file it was not meant for."""
    flags = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        return os.open(part, flags | os.O_CREAT | os.O_EXCL, 0o644)  # O_EXCL: never through a link
    except FileExistsError:
        pass
    except OSError as exc:
        raise InvalidParameter(f"data fetch: cannot create {part} ({exc.strerror or exc})") from None
    if os.path.islink(part):
        what = "a symbolic link"
    else:
        try:
            fd = os.open(part, flags | os.O_NONBLOCK)  # O_NONBLOCK: a FIFO does not hang the open
        except OSError as exc:
            what = f"unusable ({exc.strerror or exc})"
        else:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                return fd
            os.close(fd)
            what = "a hard link to another file" if stat.S_ISREG(st.st_mode) else "not a regular file"
    raise InvalidParameter(f"data fetch: {part} is {what}, not a partial download: nothing was written through "
                           "it; move it away and run again")


def _download(pub: Any, final: Path, urlopen: Callable[..., Any], progress: bool) -> None:
    import urllib.error
    import urllib.request

    part = final.with_name(final.name + ".part")
    with os.fdopen(_open_part(part), "r+b") as f:
        have = os.fstat(f.fileno()).st_size
        if have > pub.size:
            f.truncate(0)
            have = 0
        if have < pub.size:
            headers = {"User-Agent": "redteam-data-fetch"}
            if have:
                headers["Range"] = f"bytes={have}-"
            try:
                with urlopen(urllib.request.Request(pub.url, headers=headers), timeout=60) as resp:
                    status = getattr(resp, "status", 200)
                    if have and status != 206:
                        f.truncate(0)
                        have = 0  # the server sent the whole file: start over
                    f.seek(have)
                    with _Progress(pub.name, pub.size, have, progress) as bar:
                        while True:
                            block = resp.read(1 << 20)
                            if not block:
                                break
                            have += len(block)
                            if have > pub.size:
                                f.close()
                                part.unlink(missing_ok=True)
                                raise InvalidParameter(f"data fetch: {pub.url}: the server sent more than the "
                                                       f"published {pub.size:,} bytes; the partial file was deleted")
                            f.write(block)
                            bar.update(len(block))
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                raise InvalidParameter(f"data fetch: {pub.url}: {reason}; {have:,} of {pub.size:,} bytes are in "
                                       f"{part}: run the same command again to resume") from None
        f.flush()
        st = os.fstat(f.fileno())
        size, written = st.st_size, (st.st_dev, st.st_ino)
        f.seek(0)
        h = hashlib.sha256()
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    if size != pub.size or h.hexdigest() != pub.sha256:
        part.unlink(missing_ok=True)
        raise InvalidParameter(f"data fetch: {pub.url}: got {size:,} bytes with SHA-256 {h.hexdigest()}, published "
                               f"{pub.size:,} bytes with {pub.sha256} ({pub.source}); the download was deleted: try "
                               "again, or get the file another way and `redteam data check` it")
    st = os.lstat(part)
    if (st.st_dev, st.st_ino) != written:  # replaced while it was being checked: not what was checked
        raise InvalidParameter(f"data fetch: {part} was replaced by another file during the download; nothing was "
                               "renamed: move it away and run again")
    os.replace(part, final)


class _Progress:
    """A rich download bar on stderr (or nothing)."""

    def __init__(self, name: str, total: int, done: int, enabled: bool) -> None:
        self.enabled = enabled
        self.args = (name, total, done)

    def __enter__(self) -> "_Progress":
        if self.enabled:
            from rich.console import Console
            from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                                       TransferSpeedColumn)

            name, total, done = self.args
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                                TimeRemainingColumn(), console=Console(stderr=True))
            self.bar.__enter__()
            self.task = self.bar.add_task(name, total=total, completed=done)
        return self

    def update(self, n: int) -> None:
        if self.enabled:
            self.bar.update(self.task, advance=n)

    def __exit__(self, *exc: Any) -> None:
        if self.enabled:
            self.bar.__exit__(*exc)
