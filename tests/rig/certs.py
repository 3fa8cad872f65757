"""A throwaway certificate authority for TLS tests: a CA, certificates it signs for
127.0.0.1 and localhost (servers) or a name (clients), as PEM files and a PKCS#12 keystore
(what the Java metastore reads)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

KEYSTORE_PASSWORD = "rig-keystore"


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path
    keystore: Path  # PKCS#12, password KEYSTORE_PASSWORD


class Authority:
    def __init__(self, directory: Path, name: str = "hms-cache-proxy test CA") -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.ca = directory / f"{name.replace(' ', '-')}.pem"
        self.ca.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, *, server: bool) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
        cert = builder.sign(self.key, hashes.SHA256())
        cert_path = self.directory / f"{name}.pem"
        key_path = self.directory / f"{name}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        keystore = self.directory / f"{name}.p12"
        keystore.write_bytes(
            pkcs12.serialize_key_and_certificates(
                name.encode(),
                key,
                cert,
                [self.cert],
                serialization.BestAvailableEncryption(KEYSTORE_PASSWORD.encode()),
            )
        )
        return Issued(cert_path, key_path, keystore)
