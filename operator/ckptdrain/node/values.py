"""How each value of the node's configuration (node/config.py) is read from
its text: one parser per kind, each naming the field and what it expected
when the text is wrong (InvalidInput)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from ckptdrain import units
from ckptdrain.errors import InvalidInput


def path(field: str, value: object) -> Path:
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(field, "a path", value)
    return Path(value)


def optional_text(field: str, value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInput(field, "text", value)
    return value.strip() or None


def optional_endpoint(field: str, value: object) -> str | None:
    from ckptdrain.store.endpoint import parse_endpoint

    return None if optional_text(field, value) is None else parse_endpoint(field, value)


def text(field: str, value: object) -> str:
    return optional_text(field, value) or ""


def boolean(field: str, value: object) -> bool:
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise InvalidInput(field, "true or false", value)


def choice(*options: str) -> Callable[[str, object], str]:
    def parse(field: str, value: object) -> str:
        text = str(value).strip().lower()
        if text not in options:
            raise InvalidInput(field, " or ".join(options), value)
        return text

    return parse


def port(field: str, value: object) -> int:
    text = str(value).strip()
    if not text.isdigit() or int(text) > 65535:
        raise InvalidInput(field, "a TCP port 0..65535 (0 disables the endpoint)", value)
    return int(text)


def optional_bytes(field: str, value: object) -> int | None:
    return None if value is None else units.parse_bytes(field, value)


#: The largest group id: 2**32 - 1 is (gid_t)-1, "no group" to chown.
MAX_GROUP = 0xFFFFFFFE


def optional_group(field: str, value: object) -> int | None:
    """A group id (0 and up), or None when unset."""
    text = optional_text(field, value)
    if text is None:
        return None
    # ASCII digits only: str.isdigit() takes '²' (int() then fails) and '١٢'.
    if re.fullmatch(r"[0-9]+", text) is None or int(text) > MAX_GROUP:
        raise InvalidInput(field, f"a group id: a whole number 0 to {MAX_GROUP}", value)
    return int(text)


def restore_mode(field: str, value: object) -> bool:
    """The pod's `ckptdrain.io/restore` annotation: `skip` or nothing. A typo
    stops restore with one line: guessing either way could lose training."""
    from ckptdrain.contract.api import ANNOTATION_RESTORE, RESTORE_SKIP

    text = str(value).strip()
    if text == RESTORE_SKIP:
        return True
    if text == "":
        return False
    raise InvalidInput(f"pod annotation {ANNOTATION_RESTORE} ({field})",
                       f"{RESTORE_SKIP!r}, or no annotation", value)


def seconds_or_zero(field: str, value: object) -> float:
    if str(value).strip() in ("0", "0s"):
        return 0.0
    return units.parse_duration(field, value)
