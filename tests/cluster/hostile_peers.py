"""Tenant B towards tenant A's peer tier, for the hostile-tenant suite
(test_hostile_tenant.py runs these tests in the ledger's order): A's peer
server, with B's certificates; and the operator, with B's token and B's
policies, as a deputy for A's peer-tier ConfigMap and Secrets."""

from __future__ import annotations

import logging
from pathlib import Path

import hostile_record as ledger
import pytest
from cluster_helpers import wait_for
from hostile_tenants import A_SECRET, a_peer_server, peer_credentials, raw_peer_get

from ckptdrain.peer import protocol


@ledger.makes(ledger.PEER_CERT, ledger.PEER_FORGED_ID)
def test_bs_peer_certificate_reads_none_of_as_copies(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The peer server in-process over real TLS on loopback
    (tests/integration/test_peer_wire.py); each policy has a CA of its own.
    B's client trusts any server certificate, so the refusal is the server's."""
    a_creds = peer_credentials(tmp_path / "a", "team-a/ckpt")
    b_dirs = {ledger.PEER_CERT: (tmp_path / "b", "team-b/ckpt"),
              # B's own CA, issuing a certificate that names A's policy.
              ledger.PEER_FORGED_ID: (tmp_path / "b-forged", "team-a/ckpt")}
    with a_peer_server(tmp_path, a_creds) as port:
        for name, (directory, policy_id) in b_dirs.items():
            peer_credentials(directory, policy_id)
            with caplog.at_level(logging.WARNING, logger="ckptdrain.peer.server"):
                caplog.clear()
                answer = raw_peer_get(port, directory, protocol.target_path(0))
                logged = wait_for(lambda: any(
                    "refused" in r.getMessage() and "CERTIFICATE_VERIFY_FAILED" in r.getMessage()
                    for r in caplog.records), what="the server's log of its own refusal")
            leaked = int(answer is not None and (b'"steps"' in answer
                                                 or A_SECRET.encode() in answer))
            ledger.record(name, "peer server: mutual TLS, the policy's own CA" if answer is None
                          else "", ledger.PEER_LOG if logged else "", leaked)
            assert answer is None and leaked == 0, answer


