"""A TLS certificate that does not verify is named as such (not "unreachable ... start it"), with the setting
that fixes it: gateway.ca_bundle (or SSL_CERT_FILE). The error table's row tls-certificate runs the command."""

from __future__ import annotations

import pytest

from evolforge.config.settings import load_settings
from evolforge.tasks.core.checks import InputError, check_endpoint
from evolforge.tasks.core.gateway import EndpointDown, Gateway
from evolforge.testing.error_table import tls_endpoint


def test_a_certificate_that_does_not_verify_names_the_ca_bundle_setting_and_the_setting_fixes_it(tmp_path,
                                                                                                   monkeypatch):
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    with tls_endpoint(tmp_path) as (url, cert):
        settings = load_settings(None, {"gateway": {"base_url": url}})
        with pytest.raises(InputError, match="TLS certificate does not verify .*gateway.ca_bundle .*SSL_CERT_FILE"):
            check_endpoint(settings)
        gw = Gateway(settings, base_url=url, run_id="r")
        with pytest.raises(EndpointDown, match="TLS certificate does not verify"):
            gw.check_reachable(("evolve",))
        gw.close()
        check_endpoint(load_settings(None, {"gateway": {"base_url": url, "ca_bundle": str(cert)}}))
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        check_endpoint(settings)
