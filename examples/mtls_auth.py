"""Authorisation middleware: admit callers by the subject of their mTLS client certificate.

    python examples/mtls_auth.py

The server requires client certificates signed by its CA (``--client-ca`` with ``peerwire
serve``); the middleware reads the verified certificate of each call's connection, lets the
subjects it knows through (and tells the handler who called, in ``call.context``) and
refuses everyone else with an error result. The demo makes a throwaway CA, a server
certificate and two client certificates (``alice``, allowed; ``mallory``, not).
"""

from __future__ import annotations

import asyncio
import datetime
import tempfile
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

import rpc
from transports.stream import client_ssl_context, server_ssl_context


def common_name(certificate: dict[str, Any] | None) -> str | None:
    """The subject's commonName of a certificate in ``getpeercert()`` form."""
    for rdn in (certificate or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


def allow_subjects(allowed: set[str]) -> rpc.Middleware:
    """Middleware admitting only callers whose certificate's commonName is in ``allowed``."""

    async def authorise(call: rpc.Call, call_next: Any) -> Any:
        if call.side == "client":  # our own calls to the peer are not ours to refuse
            return await call_next(call)
        subject = common_name(call.certificate)
        if subject not in allowed:
            raise rpc.Rejected(f"{subject or 'an anonymous caller'} may not call {call.op}")
        call.context["subject"] = subject
        return await call_next(call)

    return authorise


registry = rpc.Registry()
registry.use(allow_subjects({"alice"}))


@registry.handle("whoami")
def whoami(_: Any) -> str:
    return f"you are {rpc.current_call.get().context['subject']}"


# --- the demo: throwaway certificates, a server, two callers ----------------------------------


def _certificate(
    name: str, key: ec.EllipticCurvePrivateKey, issuer: tuple[x509.Name, Any] | None, **ext: Any
) -> x509.Certificate:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    issuer_name, issuer_key = issuer or (subject, key)
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
            critical=False,
        )
    )
    if issuer is None:  # strict verifiers (Python 3.13+) want a CA's key usage spelled out
        builder = builder.add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False),
            critical=True,
        )
    if "dns" in ext:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(ext["dns"])]), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA256())


def make_certificates(folder: Path) -> dict[str, Path]:
    """A CA and, signed by it, ``server`` (for localhost), ``alice`` and ``mallory``: PEM
    files (certificate followed by key) in ``folder``."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("demo CA", ca_key, None)
    paths = {"ca": folder / "ca.pem"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    for name in ("server", "alice", "mallory"):
        key = ec.generate_private_key(ec.SECP256R1())
        extra = {"dns": "localhost"} if name == "server" else {}
        cert = _certificate(name, key, (ca.subject, ca_key), **extra)
        paths[name] = folder / f"{name}.pem"
        paths[name].write_bytes(
            cert.public_bytes(serialization.Encoding.PEM)
            + key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    return paths


async def main() -> dict[str, str]:
    """Serve over mutual TLS and call as alice and as mallory; return what each got."""
    answers = {}
    with tempfile.TemporaryDirectory() as folder:
        pem = make_certificates(Path(folder))
        server_ctx = server_ssl_context(pem["server"], client_cafile=pem["ca"])
        async with rpc.serve("ssl+gotalk://127.0.0.1:0", registry=registry, ssl=server_ctx) as s:
            url = f"ssl+gotalk://localhost:{s.url.port}"
            for caller in ("alice", "mallory"):
                ctx = client_ssl_context(cafile=pem["ca"], certfile=pem[caller])
                async with rpc.connect(url, ssl=ctx) as peer:
                    try:
                        answers[caller] = await peer.request("whoami")
                    except rpc.RemoteError as exc:
                        answers[caller] = f"refused: {exc}"
    return answers


if __name__ == "__main__":
    for caller, answer in asyncio.run(main()).items():
        print(f"{caller}: {answer}")
