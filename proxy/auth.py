"""Kerberos, put together from the options: the proxy's login, the SASL acceptor engines
meet, and how pooled metastore connections authenticate."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from proxy.config import Options
from proxy.metrics import Metrics
from proxy.sasl.kerberos import KerberosLogin, off_loop, realm_of
from proxy.sasl.layer import Qop, SaslError
from proxy.sasl.server import SaslAcceptor
from proxy.upstream import UpstreamPool
from proxy.upstream.kerberos import KerberosUpstream
from proxy.upstream.token_relay import DigestRelay
from proxy.upstream.tokens import TokenBroker

log = logging.getLogger(__name__)

# A login asks the KDC; one that does not answer in this long is tried again later.
LOGIN_TIMEOUT = 30.0
# How often the login is looked at; it is renewed well before it expires (kerberos.py).
LOGIN_CHECK_SECONDS = 15.0
# A request frame may exceed the request limit by the wrap token's own bytes only.
REQUEST_FRAME_SLACK = 64 * 1024


@dataclass
class Kerberos:
    login: KerberosLogin
    acceptor: SaslAcceptor | None
    upstream: KerberosUpstream | None

    @classmethod
    def build(cls, options: Options, metrics: Metrics) -> Kerberos | None:
        client = options.client_auth == "kerberos"
        upstream = options.upstream_auth == "kerberos"
        if not (client or upstream):
            return None
        assert options.kerberos_principal and options.kerberos_keytab
        try:
            login = KerberosLogin(
                options.kerberos_principal, options.kerberos_keytab, initiate=upstream
            )
        except Exception as exc:  # gssapi.exceptions.GSSError: no such key in the keytab
            raise SaslError(
                f"cannot use keytab {options.kerberos_keytab} for "
                f"{options.kerberos_principal}: {exc}"
            ) from None
        realms = frozenset(options.kerberos_local_realms or (login.realm,))
        acceptor = None
        if client:
            qops = [Qop(q) for q in options.sasl_qop]
            frame_limit = options.max_request_bytes + REQUEST_FRAME_SLACK
            acceptor = SaslAcceptor(login, qops, realms, frame_limit, None)
        return cls(login, acceptor, KerberosUpstream(options, login, metrics) if upstream else None)

    def attach(self, pool: UpstreamPool, options: Options, metrics: Metrics) -> None:
        """What needs the pool: delegation tokens (fetched on the proxy's own connections)
        and the relay of token engines' negotiations."""
        if self.upstream is not None and options.upstream_identity == "end-user":

            async def ask(method: str, **args: object) -> object:
                # A token fetch may be what a caller holding a connection slot waits for:
                # on the connections kept for writes, never behind the clients' reads.
                return await pool.ask_for_write(None, method, **args)

            self.upstream.tokens = TokenBroker(ask, self.login.principal, metrics)  # type: ignore[arg-type]
        if self.acceptor is not None and self.upstream is not None:
            self.acceptor.token_relay = DigestRelay(
                pool.open_raw, options.upstream_connect_timeout, self.acceptor.local_realms
            )

    async def start(self, metrics: Metrics) -> None:
        """Log in now (a bad keytab or an unknown principal fails here, in one line)."""
        if self.acceptor is not None:
            log.info(
                "Kerberos: engines authenticate to %s (keytab %s; users of %s; protection %s)",
                self.login.principal,
                self.login.keytab,
                ", ".join(sorted(self.acceptor.local_realms)),
                ", ".join(q.value for q in self.acceptor.offered),
            )
        if self.login.initiate:
            try:
                await off_loop(self.login.login, LOGIN_TIMEOUT)
            except TimeoutError:
                raise SaslError(
                    f"Kerberos login as {self.login.principal}: no answer from the KDC in "
                    f"{LOGIN_TIMEOUT:g} s"
                ) from None
            metrics.kerberos_login_expiry.set(self.login.expires_at)
            log.info(
                "Kerberos: logged in as %s from %s (ticket valid for %.0f s)",
                self.login.principal,
                self.login.keytab,
                self.login.expires_at - self.login.started_at,
            )

    async def keep_logged_in(self, metrics: Metrics) -> None:
        """Log in again before the ticket expires, off the event loop; a failure is logged
        and retried (readiness reports the login meanwhile)."""
        while self.login.initiate:
            due = self.login.relogin_at() - time.time()
            await asyncio.sleep(min(LOGIN_CHECK_SECONDS, max(1.0, due)))
            if not self.login.needs_login():
                continue
            try:
                await off_loop(lambda: self.login.login(force=False), LOGIN_TIMEOUT)
                metrics.kerberos_login_expiry.set(self.login.expires_at)
            except TimeoutError:
                log.warning("Kerberos: no answer from the KDC in %g s; trying again", LOGIN_TIMEOUT)
            except SaslError as exc:
                log.warning("Kerberos: %s", exc)


__all__ = ["Kerberos", "realm_of"]
