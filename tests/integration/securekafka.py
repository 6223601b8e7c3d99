"""A real Apache Kafka with the listeners production runs, for the security tests.

One KRaft node (:class:`gpuwarden.sim.kafka_cluster.KafkaNode`) with:

* ``SASL_SSL`` (SCRAM-SHA-512 and PLAIN), TLS certificate for ``localhost``/``127.0.0.1``;
* ``MTLS``: ``SSL`` requiring a client certificate (principal = the certificate's CN);
* ``INTERNAL``/``CONTROLLER``: plaintext, inter-broker and controller only (super user);
* ``StandardAuthorizer``: ``admin`` is a super user; ``alice`` and ``mallory`` are granted
  all operations on every topic, group and the cluster, except that ``mallory`` is denied
  WRITE on ``denied.failures``.

Certificates (a CA, the broker's, one client certificate per user) are made with the
``cryptography`` package in a temp folder.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import NameOID

from gpuwarden.sim.brokers import free_port
from gpuwarden.sim.kafka_cluster import KafkaNode, kafka_libs, new_cluster_id

PASSWORDS = {
    "admin": "admin-secret",
    "alice": "alice-secret",
    "mallory": "mallory-secret",
    # principals with nothing granted: the topics-plan test gives them exactly the plan's ACLs
    "gpuwarden-detector": "detector-secret",
    "gpuwarden-remediator": "remediator-secret",
    "gpuwarden-nobody": "nobody-secret",
}
DENIED_PREFIX = "denied."
KEYSTORE_PASSWORD = "broker-keystore-pw"


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gpuwarden-test"),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])  # fmt: skip


def _cert(
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    sans: list[x509.GeneralName] | None = None,
    client: bool = False,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    b = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        b = b.add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        ).add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    else:
        b = b.add_extension(
            x509.ExtendedKeyUsage(
                [x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH if client else x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]
            ),
            critical=False,
        ).add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False)
    if sans:
        b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return b.sign(issuer_key, hashes.SHA256())


@dataclass
class Pki:
    """PEM files of the test PKI: ``ca``, and ``cert``/``key`` per user name."""

    folder: Path
    ca: Path
    certs: dict[str, tuple[Path, Path]]
    keystore: Path
    other_ca: Path


def make_pki(folder: Path) -> Pki:
    """A CA, the broker's certificate (SANs ``localhost``, ``127.0.0.1``) as a PKCS12 keystore,
    a client certificate per user (``CN=<user>``), and an unrelated second CA."""
    folder.mkdir(parents=True, exist_ok=True)
    pem = serialization.Encoding.PEM
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("gpuwarden test CA")
    ca = _cert(ca_name, ca_key, ca_name, ca_key, ca=True)
    (folder / "ca.pem").write_bytes(ca.public_bytes(pem))
    other_key = ec.generate_private_key(ec.SECP256R1())
    other = _cert(_name("some other CA"), other_key, _name("some other CA"), other_key, ca=True)
    (folder / "other-ca.pem").write_bytes(other.public_bytes(pem))

    bkey = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    bcert = _cert(_name("localhost"), bkey, ca_name, ca_key, sans=sans)
    ks = pkcs12.serialize_key_and_certificates(
        b"broker", bkey, bcert, [ca], serialization.BestAvailableEncryption(KEYSTORE_PASSWORD.encode())
    )
    (folder / "broker.p12").write_bytes(ks)

    certs: dict[str, tuple[Path, Path]] = {}
    for user in PASSWORDS:
        k = ec.generate_private_key(ec.SECP256R1())
        c = _cert(_name(user), k, ca_name, ca_key, client=True)
        cp, kp = folder / f"{user}.pem", folder / f"{user}.key"
        cp.write_bytes(c.public_bytes(pem))
        kp.write_bytes(k.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        certs[user] = (cp, kp)
    return Pki(folder, folder / "ca.pem", certs, folder / "broker.p12", folder / "other-ca.pem")


@dataclass
class SecureKafka:
    node: KafkaNode
    pki: Pki
    sasl_ssl: str
    mtls: str
    internal: str

    def stop(self) -> None:
        self.node.stop()


def start_secure_kafka(folder: Path, heap: str = "384m") -> SecureKafka:
    """Start the broker described in the module docstring (about 10-20 s); ACLs set.

    Raises:
        gpuwarden.sim.brokers.BrokerError: it did not start.
    """
    libs = kafka_libs()
    pki = make_pki(folder / "pki")
    internal, sasl, mtls, ctrl = free_port(), free_port(), free_port(), free_port()
    plain_users = " ".join(f'user_{u}="{p}"' for u, p in PASSWORDS.items())
    ks = {
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": str(pki.keystore),
        "ssl.keystore.password": KEYSTORE_PASSWORD,
        "ssl.key.password": KEYSTORE_PASSWORD,
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(pki.ca),
    }
    props = {
        "process.roles": "broker,controller",
        "controller.quorum.voters": f"1@127.0.0.1:{ctrl}",
        "listeners": f"INTERNAL://127.0.0.1:{internal},SASL_SSL://127.0.0.1:{sasl},"
        f"MTLS://127.0.0.1:{mtls},CONTROLLER://127.0.0.1:{ctrl}",
        "advertised.listeners": f"INTERNAL://127.0.0.1:{internal},SASL_SSL://127.0.0.1:{sasl},MTLS://127.0.0.1:{mtls}",
        "listener.security.protocol.map": "INTERNAL:PLAINTEXT,SASL_SSL:SASL_SSL,MTLS:SSL,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "INTERNAL",
        "controller.listener.names": "CONTROLLER",
        "listener.name.sasl_ssl.sasl.enabled.mechanisms": "SCRAM-SHA-512,PLAIN",
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": (
            "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        ),
        "listener.name.sasl_ssl.plain.sasl.jaas.config": (
            f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};"
        ),
        **{f"listener.name.sasl_ssl.{k}": v for k, v in ks.items()},
        **{f"listener.name.mtls.{k}": v for k, v in ks.items()},
        "listener.name.mtls.ssl.client.auth": "required",
        "ssl.principal.mapping.rules": "RULE:^.*CN=([^,]+).*$/$1/,DEFAULT",
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:ANONYMOUS;User:admin",
        "allow.everyone.if.no.acl.found": "false",
        "num.partitions": "1",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "2",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "false",
    }
    node = KafkaNode(1, props, folder / "node", libs, heap, internal)
    node.format(new_cluster_id(), scram=[f"SCRAM-SHA-512=[name={u},password={p}]" for u, p in PASSWORDS.items()])
    node.start()
    try:
        node.wait(120)
        _acls(node, f"127.0.0.1:{internal}")
    except BaseException:
        node.stop()
        raise
    return SecureKafka(node, pki, f"127.0.0.1:{sasl}", f"127.0.0.1:{mtls}", f"127.0.0.1:{internal}")


def _acls(node: KafkaNode, internal: str) -> None:
    base = ["kafka.admin.AclCommand", "--bootstrap-server", internal, "--add", "--force"]
    grants = [
        ["--allow-principal", "User:alice", "--allow-principal", "User:mallory", "--operation", "All",
         "--topic", "*", "--group", "*", "--cluster", "--transactional-id", "*"],
        ["--deny-principal", "User:mallory", "--operation", "Write", "--topic", f"{DENIED_PREFIX}failures"],
    ]  # fmt: skip
    for g in grants:
        out = subprocess.run(node._java(*base, *g), capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise RuntimeError(f"kafka-acls failed: {(out.stdout + out.stderr)[-2000:]}")
