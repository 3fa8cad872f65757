"""The proxy's Kerberos identity: its keytab, for accepting engines and for logging in to the
metastore, and how a client principal becomes a user name.

No ticket cache or ``kinit`` is involved: python-gssapi's credential stores read the keytab
directly (``keytab`` to accept, ``client_keytab`` with a private in-memory ccache to initiate),
so the proxy depends on nothing but ``KRB5_CONFIG`` and the keytab file. The login (the TGT)
is taken again from the keytab before it expires, in a thread (it asks the KDC), so calls
never wait on an expired ticket.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from proxy.sasl.layer import SaslError

log = logging.getLogger("proxy.auth")

T = TypeVar("T")

# Calls that may ask the KDC (a login, a context's first step towards a new service) run on
# threads of their own: a KDC that does not answer holds these, not the default executor that
# wraps and unwraps big frames for every engine.
_KDC_THREADS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="hms-cache-proxy-kdc")


async def off_loop(work: Callable[[], T], timeout: float) -> T:
    """``work()`` on a KDC thread, waited for at most ``timeout`` seconds (TimeoutError)."""
    loop = asyncio.get_running_loop()
    return await asyncio.wait_for(loop.run_in_executor(_KDC_THREADS, work), timeout)


# Log in again when less than this fraction of the ticket's life, or this many seconds, is left.
RELOGIN_FRACTION = 0.2
RELOGIN_SECONDS = 60.0


def expand_host(principal: str, host: str | None = None) -> str:
    """Hadoop's ``_HOST``: this machine's name (or ``host``, the metastore's), lower case."""
    if "/_HOST@" not in principal and not principal.endswith("/_HOST"):
        return principal
    name = (host or socket.getfqdn()).lower()
    return principal.replace("/_HOST", f"/{name}", 1)


def realm_of(principal: str) -> str:
    return principal.rpartition("@")[2] if "@" in principal else ""


def short_name(principal: str, local_realms: frozenset[str]) -> str:
    """Hadoop's DEFAULT auth_to_local rule: the first component of a principal of a local
    realm (``alice@R`` and ``alice/host@R`` are ``alice``); any other realm is refused."""
    name, _, realm = principal.rpartition("@")
    if not name.split("/", 1)[0] or realm not in local_realms:
        raise SaslError(
            f"{principal}: not of a local realm ({', '.join(sorted(local_realms)) or 'none'}; "
            "--kerberos-local-realms)"
        )
    return name.split("/", 1)[0]


class KerberosLogin:
    """Credentials from one keytab for one principal."""

    def __init__(self, principal: str, keytab: str, *, initiate: bool) -> None:
        import gssapi

        self._gssapi = gssapi
        self.principal = expand_host(principal)
        self.keytab = keytab
        self.realm = realm_of(self.principal)
        self._name = gssapi.Name(self.principal, gssapi.NameType.kerberos_principal)
        self._lock = threading.Lock()
        self._generation = 0
        self.accept_creds = gssapi.Credentials(
            name=self._name, usage="accept", store={"keytab": keytab}
        )
        self.initiate = initiate
        self._initiate_creds: Any = None
        self.expires_at = 0.0  # of the current login (the TGT); 0 before the first
        self.started_at = 0.0
        self.logins = 0

    # -- accepting ---------------------------------------------------------------------------

    def acceptor(self) -> Any:
        return self._gssapi.SecurityContext(creds=self.accept_creds, usage="accept")

    # -- initiating (blocking: run these in a thread) -----------------------------------------

    def login(self, *, force: bool = True) -> None:
        """A TGT from the keytab into a fresh in-memory ccache (asks the KDC). Without
        ``force``, only if it is due (several connections may find it due at once)."""
        gssapi = self._gssapi
        with self._lock:
            if not force and not self.needs_login():
                return
            self._generation += 1
            ccache = f"MEMORY:hms-cache-proxy-{id(self)}-{self._generation}"
            try:
                creds = gssapi.Credentials(
                    name=self._name,
                    usage="initiate",
                    store={"client_keytab": self.keytab, "ccache": ccache},
                )
                # The AS exchange happens lazily at the first context; force it now, against
                # our own service (always in the KDC), so that a bad keytab, an unreachable
                # KDC or a wrong krb5.conf fail here, not in a call.
                target = gssapi.Name(self.principal, gssapi.NameType.kerberos_principal)
                gssapi.SecurityContext(name=target, creds=creds, usage="initiate").step()
                lifetime = creds.lifetime or 0
            except Exception as exc:  # the GSSError family, whose classes vary by failure
                raise SaslError(
                    f"Kerberos login as {self.principal} from {self.keytab} failed: "
                    f"{_one_line(exc)}"
                ) from None
            now = time.time()
            self._initiate_creds = creds
            self.started_at = now
            self.expires_at = now + lifetime
            self.logins += 1
        if self.logins > 1:
            # Here, not in the renewal loop: a new metastore connection may find the login due
            # first and take it (the loop then finds nothing to do).
            log.info("Kerberos: logged in again as %s", self.principal)

    def relogin_at(self) -> float:
        """When the login is taken again: a margin before it expires."""
        if self._initiate_creds is None:
            return 0.0
        life = self.expires_at - self.started_at
        margin = min(RELOGIN_SECONDS, life * RELOGIN_FRACTION) if life > 0 else RELOGIN_SECONDS
        return self.expires_at - margin

    def needs_login(self, now: float | None = None) -> bool:
        now = time.time() if now is None else now
        return self._initiate_creds is None or now >= self.relogin_at()

    def initiator(self, target: str, flags: Any = None) -> Any:
        """A context towards ``target`` (a full principal). Its first step asks the KDC for a
        service ticket the first time: take it in a thread."""
        gssapi = self._gssapi
        if self.needs_login():
            self.login(force=False)
        name = gssapi.Name(target, gssapi.NameType.kerberos_principal)
        requirements = flags or [
            gssapi.RequirementFlag.mutual_authentication,
            gssapi.RequirementFlag.integrity,
            gssapi.RequirementFlag.confidentiality,
            gssapi.RequirementFlag.replay_detection,
            gssapi.RequirementFlag.out_of_sequence_detection,
        ]
        return gssapi.SecurityContext(
            name=name, creds=self._initiate_creds, usage="initiate", flags=requirements
        )

    def valid(self, now: float | None = None) -> bool:
        """For readiness: accepting needs only the keytab; initiating a live login."""
        if not self.initiate:
            return True
        now = time.time() if now is None else now
        return self._initiate_creds is not None and now < self.expires_at


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
