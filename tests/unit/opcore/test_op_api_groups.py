"""The API groups the operator's handlers name, as Kopf reads them to
discover resources at startup (kopf/_core/reactor/observation.py,
resource_observer): any handler whose selector has no group makes Kopf read
every API group the apiserver lists. An aggregated API that answers 503 (a
Kueue visibility API or a metrics server that is down) then fails discovery
after Kopf's retries, and the operator with it at every restart: seen on
the real cluster with Kueue installed."""

from __future__ import annotations

import kopf

# What the operator's entry point imports (operator/main.py): every handler.
from ckptdrain.contract import api
from ckptdrain.operator import class_events, handlers  # noqa: F401
from ckptdrain.operator.admission import census, conflict_sweep, sweep, webhook  # noqa: F401
from ckptdrain.operator.recency import publish  # noqa: F401


def discovered_groups() -> set[str | None]:
    """The groups Kopf's resource observer scans for these handlers (None: all)."""
    registry = kopf.get_default_registry()
    found = [*registry._webhooks.get_all_handlers(), *registry._indexing.get_all_handlers(),
             *registry._watching.get_all_handlers(), *registry._spawning.get_all_handlers(),
             *registry._changing.get_all_handlers()]
    return {h.selector.group for h in found if h.selector is not None}


def test_every_handler_names_its_group_so_startup_reads_only_those() -> None:
    groups = discovered_groups()
    assert None not in groups, "a handler with no API group: Kopf would discover every group"
    assert groups == {"", api.GROUP}


def test_the_policy_webhooks_still_serve_every_served_version() -> None:
    """Naming the group keeps the function's reach: both versions of the
    policy, preferred or not, and nothing of another group."""
    selectors = {h.id: h.selector for h in kopf.get_default_registry()._webhooks.get_all_handlers()}
    for handler_id in (webhook.MUTATE_POLICY_ID, webhook.VALIDATE_ID):
        selector = selectors[handler_id]
        assert selector is not None
        for version, preferred in (("v1alpha1", False), ("v1beta1", True)):
            policy = kopf.Resource(api.GROUP, version, api.POLICIES, preferred=preferred)
            assert selector.check(policy), (handler_id, version)
        assert not selector.check(kopf.Resource("other.example", "v1", api.POLICIES))
        assert not selector.check(kopf.Resource(api.GROUP, "v1beta1", "checkpointclasses"))
