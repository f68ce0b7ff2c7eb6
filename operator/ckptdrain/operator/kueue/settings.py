"""Kueue's `waitForPodsReady`, read from the text of its Configuration (the
`controller_manager_config.yaml` key of Kueue's manager ConfigMap). Pure.

Kueue v0.13.5 (apis/config/v1beta1/defaults.go): disabled unless `enable`;
when enabled, `timeout` defaults to 5m; `recoveryTimeout` has no default
(unset: pods that were Ready and are not are never timed out).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml

from ckptdrain.errors import InvalidInput

#: Kueue's default `waitForPodsReady.timeout` when enabled.
DEFAULT_TIMEOUT_S = 300.0
#: The ConfigMap key Kueue's chart mounts as its configuration file.
CONFIG_KEY = "controller_manager_config.yaml"

_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0,
             "m": 60.0, "h": 3600.0}
_GO_PART = re.compile(r"([0-9]*\.?[0-9]+)(ns|us|µs|μs|ms|s|m|h)")


@dataclass(frozen=True)
class WaitForPodsReady:
    """`waitForPodsReady` as Kueue applies it; timeouts in seconds, None
    where unset (recovery) or the feature is off."""

    enabled: bool
    timeout_s: float | None = None
    recovery_timeout_s: float | None = None


def go_duration(field: str, value: object) -> float:
    """A Go duration (time.ParseDuration, as metav1.Duration reads it:
    "5m", "1h30m", "90s", "1.5h", "0") in seconds."""
    expected = "a Go duration such as 5m, 90s or 1h30m"
    if not isinstance(value, str):
        raise InvalidInput(field, expected, value)
    text = value.strip()
    if text == "0":
        return 0.0
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    parts = _GO_PART.findall(body)
    if not parts or "".join(n + u for n, u in parts) != body:
        raise InvalidInput(field, expected, value)
    return sign * sum(float(n) * _GO_UNITS[u] for n, u in parts)


def read(text: str) -> WaitForPodsReady:
    """`waitForPodsReady` from a Kueue Configuration document; raises
    InvalidInput naming the field when the text is not one."""
    try:
        doc = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as error:
        raise InvalidInput(CONFIG_KEY, "a Kueue Configuration in YAML",
                           str(error).splitlines()[0]) from None
    if not isinstance(doc, dict):
        raise InvalidInput(CONFIG_KEY, "a Kueue Configuration (a YAML map)", type(doc).__name__)
    raw: Any = doc.get("waitForPodsReady") or {}
    if not isinstance(raw, dict):
        raise InvalidInput("waitForPodsReady", "a map {enable, timeout, recoveryTimeout}", raw)
    enabled = raw.get("enable", False)
    if not isinstance(enabled, bool):
        raise InvalidInput("waitForPodsReady.enable", "true or false", enabled)
    if not enabled:
        return WaitForPodsReady(False)
    timeout = raw.get("timeout")
    recovery = raw.get("recoveryTimeout")
    return WaitForPodsReady(
        True,
        DEFAULT_TIMEOUT_S if timeout is None else go_duration("waitForPodsReady.timeout",
                                                              timeout),
        None if recovery is None else go_duration("waitForPodsReady.recoveryTimeout",
                                                  recovery))
