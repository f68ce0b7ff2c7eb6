"""The leader's storage version migration of CheckpointPolicies (plan.py
says when it is done). A daemon thread of every replica, working only while
its replica leads (leadership.py): after an upgrade that changed the CRD's
storage version (0.3.0 stores v1beta1), it rewrites every policy unchanged,
so that etcd holds each at the storage version, then drops the old version
from the CRD's status.storedVersions. Until that is done it passes again
every RETRY_S; after, it checks the CRD every `check_s` (one GET), so a CRD
flipped again while the operator runs is migrated too.

Idempotent and safe beside another replica doing the same (a standby
promoted mid-pass): a rewrite carries the resourceVersion listed, and the
trim the CRD's resourceVersion, so the only effect of a race is a conflict,
which plan.py reads. The operator's own /convert must answer for a pass to
read objects still stored at the old version: that is the process beside
it, serving before this thread starts.

An operator watching one namespace (CKPTDRAIN_NAMESPACE) cannot see every
object and never trims; it says so once, and docs/api-versions.md says how
to finish by hand.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ckptdrain.contract import api
from ckptdrain.operator.apiserver import leadership
from ckptdrain.operator.migration import plan
from ckptdrain.operator.migration.plan import Outcome

CRD = f"{api.POLICIES}.{api.GROUP}"
MERGE = "application/merge-patch+json"
#: Between passes that could not finish (an object failed, /convert down).
RETRY_S = 10.0
#: Objects a page when listing.
PAGE = 500
#: (connect, read) timeout of each call, seconds.
TIMEOUT = (5.0, 30.0)
#: When (the clock's seconds) this process first saw discovery show each
#: (storage version, CRD generation): the settle time counts from there.
SERVED_SINCE: dict[tuple[str, int], float] = {}

log = logging.getLogger(__name__)


def _apis() -> tuple[Any, Any]:
    from kubernetes import client

    from ckptdrain import kubeclient

    shared = kubeclient.api_client()
    return client.ApiextensionsV1Api(shared), client.CustomObjectsApi(shared)


def _crd_object(crds: Any) -> dict[str, Any]:
    """The CRD as the apiserver sends it (camelCase, as plan.py reads it)."""
    response = crds.read_custom_resource_definition(CRD, _preload_content=False,
                                                    _request_timeout=TIMEOUT)
    return dict(json.loads(response.data))


def _served(custom: Any, storage: str) -> bool:
    """Whether discovery shows CheckpointPolicy stored at `storage`."""
    found = custom.get_api_resources(api.GROUP, storage, _request_timeout=TIMEOUT)
    wanted = plan.storage_version_hash(api.GROUP, storage, api.KIND_POLICY)
    return any(r.name == api.POLICIES and r.storage_version_hash == wanted
               for r in found.resources or [])


def _rewrite(custom: Any, storage: str, item: dict[str, Any]) -> Outcome:
    """One object written back unchanged, at the resourceVersion listed."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    meta = item["metadata"]
    try:
        custom.patch_namespaced_custom_object(
            api.GROUP, storage, meta["namespace"], api.POLICIES, meta["name"],
            {"metadata": {"resourceVersion": meta["resourceVersion"]}},
            _content_type=MERGE, _request_timeout=TIMEOUT)
    except ApiException as error:
        if error.status in (404, 409):
            return Outcome.GONE if error.status == 404 else Outcome.CONFLICT
        log.warning("storage migration: %s/%s: HTTP %s %s", meta["namespace"], meta["name"],
                    error.status, error.reason)
        return Outcome.FAILED
    except (OSError, HTTPError) as error:
        log.warning("storage migration: %s/%s: %s", meta["namespace"], meta["name"], error)
        return Outcome.FAILED
    return Outcome.REWRITTEN


def migrate_once(settle_s: float, clock: Callable[[], float] = time.monotonic,
                 served_since: dict[tuple[str, int], float] = SERVED_SINCE) -> bool:
    """One pass; True when storedVersions holds the storage version alone
    (now or already). Nothing is listed before discovery has shown the
    storage version for `settle_s` (plan.py: several apiservers). API
    errors raise (the caller retries)."""
    crds, custom = _apis()
    before = plan.crd_state(_crd_object(crds))
    if before.migrated:
        return True
    served = _served(custom, before.storage)
    served_for = 0.0
    if served:
        now = clock()
        served_for = now - served_since.setdefault((before.storage, before.generation), now)
    listing = served and served_for >= settle_s
    outcomes: dict[str, Outcome] = {}
    token: str | None = None
    while listing:
        page = custom.list_cluster_custom_object(
            api.GROUP, before.storage, api.POLICIES, limit=PAGE, _continue=token,
            _request_timeout=TIMEOUT)
        for item in page.get("items") or []:
            meta = item["metadata"]
            outcomes[f"{meta['namespace']}/{meta['name']}"] = _rewrite(custom, before.storage,
                                                                        item)
        token = (page.get("metadata") or {}).get("continue") or None
        if not token:
            break
    after = plan.crd_state(_crd_object(crds))
    trim, why = plan.may_trim(plan.Pass(before=before, after=after, served=served,
                                        served_for_s=served_for, settle_s=settle_s,
                                        complete=listing, outcomes=outcomes))
    if not trim:
        log.info("storage migration of %s: not finished: %s", CRD, why)
        return after.migrated
    return _trim(crds, after, why)


def _trim(crds: Any, after: plan.CrdState, why: str) -> bool:
    """storedVersions set to [storage] at the CRD's resourceVersion read
    after the pass; False on a conflict (the next pass reads again)."""
    from kubernetes.client.exceptions import ApiException

    try:
        crds.patch_custom_resource_definition_status(
            CRD, {"metadata": {"resourceVersion": after.resource_version},
                  "status": {"storedVersions": [after.storage]}},
            _content_type=MERGE, _request_timeout=TIMEOUT)
    except ApiException as error:
        if error.status != 409:
            raise
        # Another replica (un-peered) trimmed first, or the CRD changed since
        # `after`: benign, and the next pass sees which.
        log.info("storage migration of %s: the CRD changed before the trim (another "
                 "replica's, or an upgrade's); passing again", CRD)
        return False
    log.info("storage migration of %s: %s", CRD, why)
    return True


def _loop(check_s: float, settle_s: float, stopping: threading.Event) -> None:
    failing = False
    while True:
        done = False
        if leadership.active():
            try:
                done = migrate_once(settle_s)
                failing = False
            except Exception as error:  # said once per outage, retried
                if not failing:
                    log.warning("storage migration of %s: %s; retrying every %ss", CRD,
                                error, RETRY_S)
                failing = True
        if stopping.wait(check_s if done else RETRY_S):
            return


_started: list[threading.Thread] = []


def start(namespace: str, check_s: float, settle_s: float) -> threading.Thread | None:
    """The migration thread of a cluster-wide operator, started once per
    process (None, said once, for one watching `namespace` alone)."""
    if _started:
        return _started[0]
    if namespace:
        log.info("storage migration of %s: not run by an operator watching namespace %s "
                 "alone (docs/api-versions.md says how to finish it)", CRD, namespace)
        return None
    stopping = threading.Event()
    thread = threading.Thread(target=_loop, args=(check_s, settle_s, stopping),
                              name="ckptdrain-storage-migration", daemon=True)
    thread.start()
    _started.append(thread)
    return thread
