"""``redteam provenance ...`` and ``redteam ledger ...`` subcommands.

:func:`register` adds both command groups to an ``argparse`` subparsers object; each
leaf parser sets ``func``, a callable ``func(args) -> int`` that never raises for bad
input. Exit status, as everywhere in ``redteam``: 0 ok; 1 a check failed (a signature,
proof, log entry or data that does not verify: :class:`~provenance.errors.VerificationFailed`);
2 bad input (malformed or missing files, bad options). Errors are one line on stderr,
``redteam: error: ...``. :func:`main` is a standalone entry point.

Every command prints readable text by default and JSON with ``--json``. Nothing heavy
is imported until a command runs (sigstore only for ``--sigstore``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, NoReturn, Sequence

__all__ = ["OneLineParser", "main", "register"]


def _err(msg: str) -> Exception:
    from .errors import ProvenanceError

    return ProvenanceError(msg)


def _wrap(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        from redteam.errors import RedteamError
        from redteam.runner.outputs import terminal_safe

        from .errors import VerificationFailed

        try:
            return fn(args)
        except VerificationFailed as exc:  # a check that failed: exit 1
            print(f"redteam: error: {terminal_safe(' '.join(str(exc).split(chr(10))))}", file=sys.stderr)
            return 1
        except RedteamError as exc:  # bad input: exit 2
            print(f"redteam: error: {terminal_safe(' '.join(str(exc).split(chr(10))))}", file=sys.stderr)
        except BrokenPipeError:  # the reader left (`| head`): the top level ends quietly
            raise
        except OSError as exc:
            print(f"redteam: error: {terminal_safe(exc.filename or '')}: {exc.strerror or exc}", file=sys.stderr)
        return 2

    run.__name__ = fn.__name__
    return run


def _write(path: str, data: bytes, option: str = "--out") -> None:
    """Write an output file atomically, never through a planted symlink (an unwritable
    path is a one-line error, exit 2)."""
    from redteam.runner.outputs import OutputError, atomic_write_bytes

    try:
        atomic_write_bytes(path, data, option=option, make_parents=False)
    except OutputError as exc:
        raise _err(str(exc)) from None


def _out(args: argparse.Namespace, data: dict[str, Any], text: str) -> None:
    print(json.dumps(data, indent=2, sort_keys=True) if args.json else text)


def _read(path: str, what: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    p = Path(path)
    if not p.is_file():
        raise _err(f"{path}: no such {what} file")
    return p.read_bytes()


def _passphrase(args: argparse.Namespace) -> str | None:
    if getattr(args, "passphrase_env", None):
        v = os.environ.get(args.passphrase_env)
        if v is None:
            raise _err(f"--passphrase-env {args.passphrase_env}: environment variable is not set")
        return v
    if getattr(args, "passphrase_file", None):
        return _read(args.passphrase_file, "passphrase").decode("utf-8").rstrip("\r\n")
    return None


def _signing_key(path: str, args: argparse.Namespace, kind: str | None = None) -> Any:
    from .keys import SigningKey

    return SigningKey.load(path, passphrase=_passphrase(args), kind=kind)


def _public_key(path: str, kind: str | None = None) -> Any:
    from .keys import VerifyingKey

    return VerifyingKey.load(path, kind=kind)


def _shards(specs: Sequence[str]) -> dict[str, bytes]:
    out = {}
    for s in specs:
        name, sep, path = s.partition("=")
        if not sep or not name or not path:
            raise _err(f"--shard {s!r}: expected NAME=PATH")
        out[name] = _read(path, "shard")
    return out


# ============================================================================ provenance
def _keygen(args: argparse.Namespace) -> int:
    from .keys import SigningKey

    key = SigningKey.generate(args.type)
    priv = Path(args.out + ".pem")
    pub = Path(args.out + ".pub")
    if pub.exists() and not args.force:
        raise _err(f"{pub}: already exists (pass --force to replace the key pair)")
    key.save(priv, passphrase=_passphrase(args), overwrite=args.force)
    key.public.save(pub)
    _out(args, {"type": args.type, "keyid": key.keyid, "hint": key.public.hint, "private": str(priv), "public": str(pub)},
         f"{args.type} key {key.keyid}\n  private: {priv} (mode 0600)\n  public:  {pub}")
    return 0


_RFC3339 = r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})"


def _rfc3339(text: str, option: str) -> str:
    """``text`` if it is an RFC 3339 date-time (with a real calendar date and an offset),
    else a one-line error: it is written into a signed statement."""
    import re
    from datetime import datetime

    ok = re.fullmatch(_RFC3339, text, flags=re.ASCII) is not None
    if ok:
        try:
            datetime.fromisoformat(re.sub(r"[Zz]$", "+00:00", text.replace("t", "T")))
        except ValueError:
            ok = False
    if not ok:
        raise _err(f"{option} {text!r}: not an RFC 3339 date-time (e.g. 2025-01-01T00:00:00Z)")
    return text


def _manifest(args: argparse.Namespace) -> int:
    from .manifest import DEFAULT_IGNORE, DatasetManifest

    meta = dict(client=args.client, dataset=args.dataset, version=args.version, license=args.license,
                license_source=args.license_source, source=args.source, creator=args.creator,
                created_at=args.created_at, name=args.name)
    if args.created_at is not None:
        _rfc3339(args.created_at, "--created-at")
    if args.shard and args.directory:
        raise _err("give a directory or --shard NAME=PATH, not both")
    if args.shard:
        m = DatasetManifest.from_shards(_shards(args.shard), **meta)
    elif args.directory:
        m = DatasetManifest.from_directory(args.directory, ignore_paths=list(DEFAULT_IGNORE) + list(args.ignore),
                                           **meta)
    else:
        raise _err("give a dataset directory or one or more --shard NAME=PATH")
    data = m.to_json()
    if args.out is None:
        sys.stdout.write(data.decode() + "\n")
        return 0
    _write(args.out, data)
    _out(args, {"statement": args.out, "subject": m.name, "sha256": m.root_digest(), "files": len(m.files)},
         f"manifest {args.out}: {len(m.files)} file(s), subject {m.name!r} sha256 {m.root_digest()}")
    return 0


def _sigstore_sign(payload: bytes, token: str | None, staging: bool) -> dict[str, Any]:
    from .errors import one_line

    try:
        from sigstore import dsse as sdsse
        from sigstore.models import ClientTrustConfig
        from sigstore.oidc import IdentityToken, detect_credential
        from sigstore.sign import SigningContext
    except ImportError as exc:  # pragma: no cover - sigstore is a dependency
        raise _err(f"--sigstore needs sigstore-python ({exc})") from None
    try:
        raw = token or os.environ.get("SIGSTORE_ID_TOKEN") or detect_credential()
    except Exception as exc:
        raise _err(f"--sigstore: no usable ambient OIDC credential ({one_line(str(exc), 100)})") from None
    if not raw:
        raise _err("--sigstore: no OIDC identity token (pass --identity-token or set SIGSTORE_ID_TOKEN; "
                   "keyless signing also needs network access to Fulcio and Rekor)")
    try:
        identity = IdentityToken(raw)
        ctx = SigningContext.from_trust_config(ClientTrustConfig.staging() if staging else ClientTrustConfig.production())
        with ctx.signer(identity, cache=True) as signer:
            result = signer.sign_dsse(sdsse.Statement(payload))
    except Exception as exc:
        raise _err(f"--sigstore: keyless signing failed ({one_line(str(exc), 120)}); "
                   "it needs network access to Fulcio/Rekor and a valid identity") from None
    return json.loads(result.to_json())


def _sign(args: argparse.Namespace) -> int:
    from . import bundle as _bundle, dsse
    from .intoto import Statement

    raw = _read(args.statement, "statement")
    st = Statement.from_json(raw, args.statement)
    payload = st.to_json()
    if args.sigstore:
        doc: dict[str, Any] = _sigstore_sign(payload, args.identity_token, args.staging)
        summary = "Sigstore keyless bundle"
    else:
        if not args.key:
            raise _err("--key is required (or --sigstore for keyless signing)")
        key = _signing_key(args.key, args, kind="p256")
        env = dsse.sign(payload, key)
        if args.ledger:
            from .ledger import Ledger

            if not args.log_key:
                raise _err("--ledger needs --log-key (the log's Ed25519 private key)")
            with Ledger.open(args.ledger, _signing_key(args.log_key, args, kind="ed25519")) as led:
                index, doc = led.append(env, key.public)
            summary = f"bundle with log entry {index}"
        elif args.format == "dsse":
            doc, summary = env.to_dict(), "DSSE envelope"
        else:
            doc, summary = _bundle.make_bundle(env, key.public), "bundle"
        summary += f", signed by {key.keyid}"
    text = json.dumps(doc, indent=2, sort_keys=True) + "\n"
    if args.out:
        _write(args.out, text.encode("utf-8"))
        _out(args, {"out": args.out, "subjects": [s.name for s in st.subjects]}, f"wrote {args.out}: {summary}")
    else:
        sys.stdout.write(text)
    return 0


def _verify(args: argparse.Namespace) -> int:
    from . import _codec, bundle as _bundle, dsse
    from .errors import VerificationFailed
    from .intoto import Statement
    from .manifest import PREDICATE_TYPE, DatasetManifest

    doc = _codec.loads(_read(args.file, "bundle or envelope"), args.file)
    if not isinstance(doc, dict):
        raise _err(f"{args.file}: expected a JSON object (a Sigstore bundle or a DSSE envelope)")
    info: dict[str, Any] = {}
    if args.identity:
        return _verify_sigstore(args, doc)
    if not args.pub:
        raise _err("--pub is required (or --identity/--issuer for Sigstore keyless bundles)")
    key = _public_key(args.pub, kind="p256")
    if "mediaType" in doc:
        trusted_root = log_key = origin = None
        if args.trusted_root:
            trusted_root = _read(args.trusted_root, "trusted root")
        elif args.ledger:
            from .ledger import Ledger

            with Ledger.open(args.ledger) as led:
                log_key, origin = led.log_public, led.origin
        require = _require_tlog(args)
        vm = doc.get("verificationMaterial")
        entries = vm.get("tlogEntries") if isinstance(vm, dict) else None
        trusted = bool(args.trusted_root or args.ledger)
        if entries and not trusted:  # bad input, before any work; the message names the CLI's options
            raise _err(f"{args.file}: the bundle has a transparency-log entry: pass --trusted-root FILE or "
                       "--ledger FILE to check it")
        missing = isinstance(vm, dict) and not entries and (require or (require is None and trusted))
        # a missing entry is checked here, after the signature and the trusted root, so that the
        # message names the command's options (the library's names its Python arguments)
        r = _bundle.verify_bundle(doc, key, trusted_root=trusted_root, log_key=log_key, origin=origin,
                                  require_tlog=False if missing else require)
        if missing:
            raise VerificationFailed(
                f"{args.file}: the bundle has no transparency-log entry"
                + ("" if require else f" ({'--trusted-root' if args.trusted_root else '--ledger'} trusts a log; "
                                      "--allow-missing-tlog relaxes this)")
                + "; `redteam ledger append LEDGER ENVELOPE --out BUNDLE` or `redteam provenance sign "
                  "--ledger LEDGER --log-key KEY` writes a bundle that has one")
        payload, keyid = r.payload, r.keyid
        info.update(logIndex=r.log_index, treeSize=r.tree_size, origin=r.origin)
    else:
        if _require_tlog(args) or (_require_tlog(args) is None and (args.trusted_root or args.ledger)):
            raise VerificationFailed(f"{args.file}: a bare DSSE envelope has no transparency-log entry"
                                     + ("" if args.require_tlog else " (a log is trusted; --allow-missing-tlog relaxes this)"))
        v = dsse.verify(doc, key)
        payload, keyid = v.payload, v.keyids[0]
    st = Statement.from_json(payload, "signed statement")
    info.update(ok=True, keyid=keyid, predicateType=st.predicate_type,
                subjects=[{"name": s.name, "sha256": s.digest.get("sha256")} for s in st.subjects])
    lines = [f"OK: {st.predicate_type} signed by {keyid}"]
    lines += [f"  subject {s.name!r} sha256 {s.digest.get('sha256')}" for s in st.subjects]
    if info.get("logIndex") is not None:
        lines.append(f"  logged at index {info['logIndex']} of {info['treeSize']} in {info['origin']}")
    if args.data or args.shard:
        if st.predicate_type != PREDICATE_TYPE:
            raise _err(f"--data/--shard: the statement is a {st.predicate_type}, not a dataset manifest")
        m = DatasetManifest.from_statement(st)
        if args.data:
            m.verify_directory(args.data)
        else:
            m.verify_shards(_shards(args.shard))
        info["data"] = "match"
        lines.append(f"  data matches the manifest ({len(m.files)} file(s), dataset {m.dataset!r} {m.version!r})")
    _out(args, info, "\n".join(lines))
    return 0


def _require_tlog(args: argparse.Namespace) -> bool | None:
    """--require-tlog: True; --allow-missing-tlog: False; neither: required iff a log is trusted."""
    if args.require_tlog and args.allow_missing_tlog:
        raise _err("--require-tlog and --allow-missing-tlog contradict each other")
    return True if args.require_tlog else (False if args.allow_missing_tlog else None)


def _verify_sigstore(args: argparse.Namespace, doc: dict[str, Any]) -> int:
    from .errors import VerificationFailed, one_line

    try:
        from sigstore.models import Bundle, TrustedRoot
        from sigstore.verify import Verifier, policy
    except ImportError as exc:  # pragma: no cover
        raise _err(f"Sigstore verification needs sigstore-python ({exc})") from None
    try:
        b = Bundle.from_json(json.dumps(doc))
    except Exception as exc:
        raise _err(f"{args.file}: not a Sigstore keyless bundle ({one_line(str(exc), 100)})") from None
    try:
        verifier = (Verifier(trusted_root=TrustedRoot.from_file(args.trusted_root)) if args.trusted_root
                    else Verifier.production(offline=True))
        ptype, payload = verifier.verify_dsse(b, policy.Identity(identity=args.identity, issuer=args.issuer))
    except Exception as exc:
        raise VerificationFailed(f"{args.file}: Sigstore verification failed ({one_line(str(exc), 120)})") from None
    _out(args, {"ok": True, "payloadType": ptype, "identity": args.identity},
         f"OK: Sigstore bundle for {args.identity} ({ptype}, {len(payload)} bytes)")
    return 0


# ============================================================================ ledger
def _open(args: argparse.Namespace, write: bool = False) -> Any:
    from .ledger import Ledger

    key = _signing_key(args.key, args, kind="ed25519") if write else None
    return Ledger.open(args.ledger, key)


def _ledger_init(args: argparse.Namespace) -> int:
    from .ledger import Ledger

    with Ledger.init(args.ledger, _signing_key(args.key, args, kind="ed25519"), args.origin) as led:
        if args.trusted_root:
            _write(args.trusted_root, (json.dumps(led.trusted_root(), indent=2) + "\n").encode("utf-8"),
                   "--trusted-root")
        _out(args, {"ledger": args.ledger, "origin": led.origin, "logId": led.log_id.hex()},
             f"ledger {args.ledger}: origin {led.origin}, log id {led.log_id.hex()}")
    return 0


def _ledger_append(args: argparse.Namespace) -> int:
    from . import _codec, dsse

    doc = _codec.loads(_read(args.envelope, "envelope"), args.envelope)
    if isinstance(doc, dict) and "dsseEnvelope" in doc:
        doc = doc["dsseEnvelope"]
    env = dsse.Envelope.from_dict(doc, args.envelope)
    with _open(args, write=True) as led:
        index, b = led.append(env, _public_key(args.pub, kind="p256"))
    if args.out:
        _write(args.out, (json.dumps(b, indent=2, sort_keys=True) + "\n").encode("utf-8"))
    proof = b["verificationMaterial"]["tlogEntries"][0]["inclusionProof"]
    _out(args, {"logIndex": index, "bundle": args.out or b},
         f"appended at index {index}; tree size {proof['treeSize']}" + (f"; bundle {args.out}" if args.out else ""))
    return 0


def _proof_text(kind: str, d: dict[str, Any]) -> str:
    lines = [kind, *(f"  {k}: {d[k]}" for k in d if k not in ("hashes", "checkpoint"))]
    lines += [f"  hash[{i}] {h}" for i, h in enumerate(d["hashes"])]
    if d.get("checkpoint"):
        lines += ["  checkpoint:", *("    " + line for line in d["checkpoint"].splitlines())]
    return "\n".join(lines)


def _ledger_prove(args: argparse.Namespace) -> int:
    with _open(args) as led:
        d = led.prove(args.index, args.tree_size).to_dict()
    _out(args, d, _proof_text(f"inclusion proof of entry {args.index}", d))
    return 0


def _ledger_consistency(args: argparse.Namespace) -> int:
    with _open(args) as led:
        d = led.consistency(args.old, args.new).to_dict()
    _out(args, d, _proof_text(f"consistency proof {d['oldSize']} → {d['treeSize']}", d))
    return 0


def _ledger_checkpoint(args: argparse.Namespace) -> int:
    from . import checkpoint as cp

    with _open(args) as led:
        note = led.checkpoint(args.size)
        c = cp.verify(note, led.log_public, origin=led.origin)
    if args.json:
        _out(args, {"origin": c.origin, "treeSize": c.size, "rootHash": c.root.hex(), "checkpoint": note}, "")
    else:
        sys.stdout.write(note)
    return 0


def _ledger_verify(args: argparse.Namespace) -> int:
    witnesses = [_read(w, "checkpoint").decode("utf-8", "replace") for w in args.witness]
    with _open(args) as led:
        report = led.verify(log_key=_public_key(args.log_pub, kind="ed25519") if args.log_pub else None,
                            witnesses=witnesses, check_signatures=not args.no_signatures)
    if args.json:
        _out(args, report.to_dict(), "")
    else:
        print(report, file=sys.stdout if report.ok else sys.stderr)
    return 0 if report.ok else 1


def _ledger_export(args: argparse.Namespace) -> int:
    with _open(args) as led:
        paths = led.export(args.out)
        n = led.size
    _out(args, {k: str(v) for k, v in paths.items()}, f"exported {n} entries to {args.out}")
    return 0


# ============================================================================ wiring
def _common(p: argparse.ArgumentParser, passphrase: bool = False) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")
    if passphrase:
        g = p.add_mutually_exclusive_group()
        g.add_argument("--passphrase-env", metavar="VAR", help="read the key passphrase from this environment variable")
        g.add_argument("--passphrase-file", metavar="FILE", help="read the key passphrase from this file")


_LEDGER_HELP = "the ledger's SQLite file (made by `redteam ledger init`)"


def register(subparsers: Any) -> None:
    """Add the ``provenance`` and ``ledger`` command groups (leaf parsers set ``func``)."""
    prov = subparsers.add_parser("provenance", help="keys, dataset manifests, DSSE signing and verification")
    ps = prov.add_subparsers(dest="provenance_command", required=True, metavar="COMMAND")

    p = ps.add_parser("keygen", help="generate a key pair (P-256 for clients/data, Ed25519 for a log)")
    p.add_argument("--out", required=True, metavar="PREFIX", help="writes PREFIX.pem (0600) and PREFIX.pub")
    p.add_argument("--type", choices=("p256", "ed25519"), default="p256",
                   help="p256 (ECDSA P-256: clients and data; the default) or ed25519 (a ledger's log key)")
    p.add_argument("--force", action="store_true", help="replace an existing key pair")
    _common(p, passphrase=True)
    p.set_defaults(func=_wrap(_keygen))

    p = ps.add_parser("manifest", help="build a dataset manifest (in-toto statement, model-signing layout)")
    p.add_argument("directory", nargs="?", help="dataset directory")
    p.add_argument("--shard", action="append", default=[], metavar="NAME=PATH", help="an in-memory style shard")
    p.add_argument("--client", required=True, help="the client (data owner) the manifest belongs to")
    p.add_argument("--dataset", required=True, help="the dataset's name")
    p.add_argument("--version", required=True, help="the dataset's version")
    p.add_argument("--license", required=True, help="SPDX license expression")
    p.add_argument("--license-source", default="", help="where the license was asserted (URL or path)")
    p.add_argument("--source", default="", help="where the data came from (URL or description)")
    p.add_argument("--creator", default="", help="who created the data")
    p.add_argument("--created-at", default=None, help="RFC 3339 time (default: now)")
    p.add_argument("--name", default=None, help="subject name (default: the directory's name)")
    p.add_argument("--ignore", action="append", default=[], metavar="PATH", help="extra path to skip")
    p.add_argument("--out", default=None, help="write the statement here (default: stdout)")
    _common(p)
    p.set_defaults(func=_wrap(_manifest))

    p = ps.add_parser("sign", help="sign a statement into a DSSE envelope or Sigstore bundle")
    p.add_argument("statement", help="in-toto statement JSON ('-' for stdin)")
    p.add_argument("--key", help="P-256 private key (PEM)")
    p.add_argument("--format", choices=("bundle", "dsse"), default="bundle",
                   help="bundle: a Sigstore bundle v0.3 (the default); dsse: a bare DSSE envelope")
    p.add_argument("--out", default=None, help="write the signed document here (default: stdout)")
    p.add_argument("--ledger", default=None, help="also log it in this ledger (bundle gets the log entry)")
    p.add_argument("--log-key", default=None, help="the ledger's Ed25519 private key")
    p.add_argument("--sigstore", action="store_true", help="keyless signing through Sigstore (network + OIDC)")
    p.add_argument("--identity-token", default=None, help="OIDC token for --sigstore")
    p.add_argument("--staging", action="store_true", help="use Sigstore staging for --sigstore")
    _common(p, passphrase=True)
    p.set_defaults(func=_wrap(_sign))

    p = ps.add_parser("verify", help="verify a bundle or DSSE envelope (and the data it describes)")
    p.add_argument("file", help="a Sigstore bundle or a bare DSSE envelope (JSON; '-' for stdin)")
    p.add_argument("--pub", help="the signer's P-256 public key")
    p.add_argument("--trusted-root", default=None, help="Sigstore trusted root describing the log")
    p.add_argument("--ledger", default=None, help="trust this ledger's log key for the bundle's log entry")
    p.add_argument("--require-tlog", action="store_true",
                   help="fail without a transparency-log entry (the default whenever --trusted-root or --ledger is given)")
    p.add_argument("--allow-missing-tlog", action="store_true",
                   help="accept a bundle without a log entry even though a log is trusted")
    p.add_argument("--data", default=None, help="dataset directory to check against the manifest")
    p.add_argument("--shard", action="append", default=[], metavar="NAME=PATH",
                   help="a shard to check against the manifest (repeat for each)")
    p.add_argument("--identity", default=None, help="Sigstore keyless: expected signer identity")
    p.add_argument("--issuer", default=None, help="Sigstore keyless: expected OIDC issuer")
    _common(p)
    p.set_defaults(func=_wrap(_verify))

    led = subparsers.add_parser("ledger", help="the transparency log (SQLite, RFC 6962, C2SP checkpoints)")
    ls = led.add_subparsers(dest="ledger_command", required=True, metavar="COMMAND")

    p = ls.add_parser("init", help="create a ledger")
    p.add_argument("ledger", help="the ledger's SQLite file to create")
    p.add_argument("--key", required=True, help="the log's Ed25519 private key")
    p.add_argument("--origin", required=True, help="log origin / checkpoint key name, e.g. example.org/log")
    p.add_argument("--trusted-root", default=None, help="also write a Sigstore trusted_root.json here")
    _common(p, passphrase=True)
    p.set_defaults(func=_wrap(_ledger_init))

    p = ls.add_parser("append", help="log a signed envelope; prints its index (bundle with --out)")
    p.add_argument("ledger", help=_LEDGER_HELP)
    p.add_argument("envelope", help="DSSE envelope JSON, or a bundle holding one")
    p.add_argument("--pub", required=True, help="the signer's P-256 public key (checked before logging)")
    p.add_argument("--key", required=True, help="the log's Ed25519 private key")
    p.add_argument("--out", default=None, help="write the Sigstore bundle here")
    _common(p, passphrase=True)
    p.set_defaults(func=_wrap(_ledger_append))

    p = ls.add_parser("prove", help="inclusion proof of an entry and the checkpoint it is against (text; JSON with --json)")
    p.add_argument("ledger", help=_LEDGER_HELP)
    p.add_argument("index", type=int, help="the entry's index in the log")
    p.add_argument("--tree-size", type=int, default=None, help="prove against this tree size (default: the current one)")
    _common(p)
    p.set_defaults(func=_wrap(_ledger_prove))

    p = ls.add_parser("consistency", help="consistency proof between two tree sizes (text; JSON with --json)")
    p.add_argument("ledger", help=_LEDGER_HELP)
    p.add_argument("old", type=int, help="the older tree size")
    p.add_argument("new", type=int, nargs="?", default=None, help="the newer tree size (default: the current one)")
    _common(p)
    p.set_defaults(func=_wrap(_ledger_consistency))

    p = ls.add_parser("checkpoint", help="print the latest signed checkpoint (the signed note; JSON with --json)")
    p.add_argument("ledger", help=_LEDGER_HELP)
    p.add_argument("--size", type=int, default=None, help="the checkpoint of this tree size (default: the latest)")
    _common(p)
    p.set_defaults(func=_wrap(_ledger_checkpoint))

    p = ls.add_parser("verify", help="recompute the tree and check every signed checkpoint")
    p.add_argument("ledger", help=_LEDGER_HELP)
    p.add_argument("--log-pub", default=None, help="the log public key you trust (default: the stored one)")
    p.add_argument("--witness", action="append", default=[], metavar="FILE", help="a checkpoint seen elsewhere")
    p.add_argument("--no-signatures", action="store_true", help="skip re-verifying each entry's DSSE signature")
    _common(p)
    p.set_defaults(func=_wrap(_ledger_verify))

    p = ls.add_parser("export", help="export entries, checkpoints, trusted root and log key")
    p.add_argument("ledger", help=_LEDGER_HELP)
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write the export into")
    _common(p)
    p.set_defaults(func=_wrap(_ledger_export))


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are a single line (exit status 2)."""

    def error(self, message: str) -> "NoReturn":  # type: ignore[override]
        from redteam.cli_common import usage_error_line

        self.exit(2, usage_error_line(self.prog, message) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry point: ``python -m provenance.cli provenance|ledger ...``."""
    parser = OneLineParser(prog="redteam", description="redteam provenance and ledger commands")
    register(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # named by the command that got them
        from redteam.cli_common import _leaf_parser

        _leaf_parser(parser, args).error(f"unrecognized arguments: {' '.join(unknown)}")
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
