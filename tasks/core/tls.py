"""TLS for the model endpoint: which CAs verify its certificate, and the one line when it does not verify.

    tls_context(settings)       gateway.ca_bundle, else the SSL_CERT_FILE environment variable, else True (the
                                default CAs); what the gateway's client and the input check verify with
    tls_problem(base_url, err)  the user's line for a certificate that does not verify, naming gateway.ca_bundle
                                and SSL_CERT_FILE (None: `err` is another error). Stdlib only: the fail-fast
                                check imports it.
"""

from __future__ import annotations

import os
import ssl


def tls_context(settings):
    cafile = settings.gateway.ca_bundle or os.environ.get("SSL_CERT_FILE", "")
    return ssl.create_default_context(cafile=cafile) if cafile else True


def _causes(err: BaseException):
    seen: set[int] = set()
    todo: list = [err]
    while todo:
        e = todo.pop()
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__, getattr(e, "reason", None), *(a for a in e.args if
                                                                          isinstance(a, BaseException))]


def tls_problem(base_url: str, err: BaseException) -> str | None:
    for e in _causes(err):
        if isinstance(e, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(e):
            why = getattr(e, "verify_message", None) or str(e)
            return (f"model endpoint {base_url}: its TLS certificate does not verify ({why}); set gateway.ca_bundle "
                    "(or the SSL_CERT_FILE environment variable) to the CA bundle file that signs it")
    return None
