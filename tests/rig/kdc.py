"""A throwaway MIT Kerberos realm: its own KDC on a free port, in one folder.

Nothing goes to /etc or to the machine's default ticket cache or keytab: the KDC and every
child process find the realm through ``KRB5_CONFIG`` / ``KRB5_KDC_PROFILE`` (``Realm.env``),
and the realm's krb5.conf points the default ccache, keytab and client keytab into the folder,
so a test that forgets to name one fails instead of finding the machine's. The krb5.conf is
written for the JDK as much as for MIT: TCP only (``udp_preference_limit = 1``), no reverse
DNS or canonicalisation (principals say ``localhost`` and must stay ``localhost``), no DNS
look-ups of realms or KDCs.

Short ticket lifetimes (``ticket_lifetime``) bound every ticket the KDC issues (realm
``max_life``, each principal's ``-maxlife``, the clients' default request), so that a test can
watch a keytab login expire and be renewed. Such a realm also allows a clock skew of only
``clockskew`` seconds (MIT's and the JDK's default is 300): an acceptor (the HMS, the proxy)
takes a ticket until its end plus the skew, so with the default a 20 s ticket would go on
working for five minutes and a re-login test would prove nothing.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
from pathlib import Path

from tests.rig.ports import free_port, wait_for_port
from tests.rig.service import Service

# What the realm needs from the machine (Debian: krb5-kdc, krb5-admin-server, krb5-user).
COMMANDS = ("krb5kdc", "kdb5_util", "kadmin.local", "kinit", "klist")
MISSING = (
    "MIT Kerberos is not installed (needs {}): run ./scripts/setup.sh --test, or "
    "apt-get install krb5-kdc krb5-admin-server krb5-user libkrb5-dev"
)
# Only the principal's own characters: kadmin.local's query language has no quoting.
PRINCIPAL = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)?")
PASSWORD = re.compile(r"[A-Za-z0-9._-]+")


def missing_commands() -> list[str]:
    """The MIT commands the realm needs that are not on PATH (nor in /usr/sbin)."""
    return [c for c in COMMANDS if _which(c) is None]


def _which(command: str) -> str | None:
    # krb5kdc, kdb5_util and kadmin.local live in /usr/sbin, which a user's PATH may lack.
    path = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin" + os.pathsep + "/sbin"
    return shutil.which(command, path=path)


class Realm(Service):
    """One realm (default ``HMSPROXY.TEST``) with its KDC, under ``workdir``.

    ``add_service("hive/localhost")`` and ``add_user("alice", "pw")`` make principals and
    return a keytab each; ``kinit("alice")`` gives a FILE ccache with her TGT. ``env`` is what
    a child process needs to be in the realm; python-gssapi in the test process needs it in
    ``os.environ`` (the ``realm`` fixture puts it there). The JDK ignores it: a JVM needs
    ``-Djava.security.krb5.conf=`` ``krb5_conf`` (tests/rig/hms.py, tests/rig/spark.py).
    """

    def __init__(
        self,
        workdir: Path,
        name: str = "HMSPROXY.TEST",
        *,
        ticket_lifetime: int | None = None,
        clockskew: int | None = None,
        port: int | None = None,
    ) -> None:
        self.workdir = workdir
        self.name = name
        # Seconds; None: MIT's default (a day). Bounds every ticket the KDC issues.
        self.ticket_lifetime = ticket_lifetime
        # Seconds; None: 300 (the default), or 1 with a ticket_lifetime (one host, one clock).
        self.clockskew = (
            clockskew if clockskew is not None else (300 if ticket_lifetime is None else 1)
        )
        self.port = port or _free_tcp_and_udp_port()
        self.krb5_conf = workdir / "krb5.conf"
        self.kdc_conf = workdir / "kdc.conf"
        self.database = workdir / "principal"
        self.keytabs: dict[str, Path] = {}
        self.passwords: dict[str, str] = {}
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def env(self) -> dict[str, str]:
        """For child processes (merge into ``os.environ``). The replay cache of an acceptor
        (MIT's: a proxy accepting GSSAPI) goes into the folder too, not /var/tmp."""
        return {
            "KRB5_CONFIG": str(self.krb5_conf),
            "KRB5_KDC_PROFILE": str(self.kdc_conf),
            "KRB5RCACHEDIR": str(self.workdir),
        }

    def principal(self, name: str) -> str:
        """``alice`` → ``alice@HMSPROXY.TEST``; a name with a realm stays as it is."""
        return name if "@" in name else f"{name}@{self.name}"

    def keytab(self, name: str) -> Path:
        """The keytab ``add_service`` / ``add_user`` made for ``name``."""
        return self.keytabs[self.principal(name)]

    # -- lifecycle ------------------------------------------------------------------------

    def start(self, timeout: float = 30) -> None:
        missing = missing_commands()
        if missing:
            raise RuntimeError(MISSING.format(", ".join(missing)))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._write_conf()
        self._run("kdb5_util", "create", "-s", "-r", self.name, "-P", "master-" + self.name.lower())
        with open(self.workdir / "krb5kdc.stderr", "ab") as log:  # the child keeps its own
            # -n: stay in the foreground, so that the pid is ours and stop() can end it.
            self.process = subprocess.Popen(
                [_which("krb5kdc") or "krb5kdc", "-n", "-r", self.name],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=os.environ | self.env,
                cwd=self.workdir,
                start_new_session=True,
            )
        try:
            wait_for_port(self.port, timeout, alive=lambda: self.process.poll() is None)
        except Exception as exc:
            raise RuntimeError(f"krb5kdc did not start: {exc}\n{self.log_tail()}") from exc

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def log_tail(self, lines: int = 30) -> str:
        text = ""
        for name in ("krb5kdc.stderr", "kdc.log"):
            path = self.workdir / name
            if path.exists():
                text += path.read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    # -- principals and tickets -----------------------------------------------------------

    def add_service(self, name: str) -> Path:
        """A service principal (``hive/localhost``) with a random key, and its keytab. Asked
        again (a second metastore in the same realm), the same keytab."""
        principal = self._checked(name)
        if principal in self.keytabs:  # ktadd again would change the key under its users
            return self.keytabs[principal]
        self._kadmin(f"addprinc -randkey{self._maxlife()} {principal}")
        return self._ktadd(principal)

    def add_user(self, name: str, password: str) -> Path:
        """A user principal with ``password``, and a keytab holding the same key (kinit
        from it needs no password typed; ``-norandkey`` keeps the password valid)."""
        principal = self._checked(name)
        if principal in self.keytabs:
            if self.passwords.get(principal) != password:
                raise ValueError(f"{principal} exists with another password")
            return self.keytabs[principal]
        if not PASSWORD.fullmatch(password):
            raise ValueError("a password here is letters, digits, '.', '_' and '-'")
        self._kadmin(f"addprinc -pw {password}{self._maxlife()} {principal}")
        self.passwords[principal] = password
        return self._ktadd(principal, "-norandkey")

    def kinit(self, name: str, ccache: Path | None = None, lifetime: int | None = None) -> Path:
        """A FILE ccache holding ``name``'s TGT, from its keytab (use it as
        ``KRB5CCNAME=FILE:<path>``). Again for the same name: a fresh ticket, same file.
        ``lifetime``: seconds to ask for (the KDC grants at most ``ticket_lifetime``)."""
        principal = self.principal(name)
        asked = [] if lifetime is None else ["-l", f"{lifetime}s"]
        path = ccache or self.workdir / f"cc-{_file_name(principal)}"
        path.parent.mkdir(parents=True, exist_ok=True)
        self._run(
            "kinit",
            *asked,
            "-kt",
            str(self.keytabs[principal]),
            principal,
            env={"KRB5CCNAME": f"FILE:{path}"},
        )
        return path

    def klist(self, ccache: Path) -> str:
        """``klist`` of a ccache: what a test can assert a ticket by."""
        return self._run("klist", "-c", f"FILE:{ccache}")

    # -- the details ----------------------------------------------------------------------

    def _write_conf(self) -> None:
        d = self.workdir
        life = ""
        if self.ticket_lifetime is not None:
            life = f"  ticket_lifetime = {self.ticket_lifetime}\n"
        self.krb5_conf.write_text(
            "[libdefaults]\n"
            f"  default_realm = {self.name}\n"
            "  dns_lookup_realm = false\n"
            "  dns_lookup_kdc = false\n"
            "  rdns = false\n"
            "  dns_canonicalize_hostname = false\n"
            "  udp_preference_limit = 1\n"
            f"  clockskew = {self.clockskew}\n"
            f"  default_ccache_name = FILE:{d / 'cc-default'}\n"
            f"  default_keytab_name = FILE:{d / 'default.keytab'}\n"
            f"  default_client_keytab_name = FILE:{d / 'default-client.keytab'}\n"
            f"{life}"
            "[realms]\n"
            f"  {self.name} = {{\n"
            f"    kdc = 127.0.0.1:{self.port}\n"
            "  }\n"
            "[domain_realm]\n"
            f"  localhost = {self.name}\n"
            f"  .localhost = {self.name}\n"
        )
        max_life = ""
        if self.ticket_lifetime is not None:
            max_life = (
                f"    max_life = {self.ticket_lifetime}\n"
                f"    max_renewable_life = {self.ticket_lifetime}\n"
            )
        (d / "kadm5.acl").write_text("")
        self.kdc_conf.write_text(
            "[kdcdefaults]\n"
            f"  kdc_listen = 127.0.0.1:{self.port}\n"
            f"  kdc_tcp_listen = 127.0.0.1:{self.port}\n"
            "[realms]\n"
            f"  {self.name} = {{\n"
            f"    database_name = {self.database}\n"
            f"    key_stash_file = {d / 'stash'}\n"
            f"    acl_file = {d / 'kadm5.acl'}\n"
            "    supported_enctypes = aes256-cts-hmac-sha1-96:normal "
            "aes128-cts-hmac-sha1-96:normal\n"
            f"{max_life}"
            "  }\n"
            "[logging]\n"
            f"  kdc = FILE:{d / 'kdc.log'}\n"
            f"  default = FILE:{d / 'kdc.log'}\n"
        )

    def _maxlife(self) -> str:
        if self.ticket_lifetime is None:
            return ""
        return f' -maxlife "{self.ticket_lifetime} seconds"'

    def _checked(self, name: str) -> str:
        if not PRINCIPAL.fullmatch(name):
            raise ValueError(f"not a principal name this rig makes: {name!r}")
        return self.principal(name)

    def _ktadd(self, principal: str, *options: str) -> Path:
        keytab = self.workdir / f"{_file_name(principal)}.keytab"
        self._kadmin(" ".join(["ktadd", *options, "-k", str(keytab), principal]))
        self.keytabs[principal] = keytab
        return keytab

    def _kadmin(self, query: str) -> str:
        return self._run("kadmin.local", "-r", self.name, "-q", query)

    def _run(self, command: str, *args: str, env: dict[str, str] | None = None) -> str:
        done = subprocess.run(
            [_which(command) or command, *args],
            env=os.environ | self.env | (env or {}),
            cwd=self.workdir,
            capture_output=True,
            text=True,
            timeout=60,
        )
        # kadmin.local reports most failures on stderr with status 0.
        if done.returncode != 0 or "error" in done.stderr.lower():
            raise RuntimeError(
                f"{command} {' '.join(args)} failed ({done.returncode}):\n"
                f"{done.stdout[-2000:]}{done.stderr[-2000:]}"
            )
        return done.stdout


def _file_name(principal: str) -> str:
    """``hive/localhost@R`` → ``hive_localhost``: a keytab or ccache name per principal."""
    return principal.split("@")[0].replace("/", "_")


def _free_tcp_and_udp_port() -> int:
    """A port free for TCP and UDP both: the KDC binds the two (clients here use TCP only,
    but krb5kdc will not start if either bind fails)."""
    while True:
        port = free_port()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            try:
                udp.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
