"""Who holds whose copies (placement), and the one small document that tells
every pod of a policy. Pure.

The holder of writer r is the first writer after r in rank order (cyclically)
on another node *and* in another zone (`topology.kubernetes.io/zone`); failing
that, the first on another node; failing that, none. It depends only on ranks
and placement, so it is stable across operator restarts and unrelated events,
and a writer whose holder went away gets a new one at the next reconcile.
Zones, not rack or block labels: every conformant cloud sets the zone label,
no rack label is standard.

The peers document (`peers.json` in the policy's ConfigMap, mounted into the
pods; the restore init container reads it too, so restore from a partner
works while the operator is down):

    {"policy": "<ns>/<name>",
     "writers": {"<rank>": {"node": ..., "zone": ..., "address": "<ip>:<port>",
                            "holder": <rank> | null, "previousHolder": <rank> | null}}}

`previousHolder` keeps the last holder after a re-pairing: the copies there
are still the newest a writer can get back until the new holder has one. A
writer that is not running keeps its entry with `node` and `address` null:
its holders still hold its copies, and its replacement's restore asks them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ckptdrain.errors import IntegrityError

ZONE_LABEL = "topology.kubernetes.io/zone"
MAX_DOCUMENT_BYTES = 4 << 20
#: A rank as the document spells it: plain ASCII decimal, no leading zero
#: (str.isdigit() also takes '²' and other scripts' digits).
_RANK = re.compile(r"0|[1-9][0-9]{0,8}")


def _rank(value: object) -> int | None:
    """A rank named inside an entry (`holder`, `previousHolder`), or None."""
    return value if type(value) is int and value >= 0 else None


@dataclass(frozen=True)
class Member:
    """A running writer: its rank, where it runs and where its peer server listens."""

    rank: int
    node: str
    zone: str | None = None
    address: str | None = None


def holders(members: Iterable[Member]) -> dict[int, int | None]:
    """rank -> the rank holding its copies (None: no writer on another node)."""
    ranked = sorted(members, key=lambda m: m.rank)
    out: dict[int, int | None] = {}
    for i, member in enumerate(ranked):
        after = ranked[i + 1:] + ranked[:i]
        other_node = [m for m in after if m.node != member.node]
        other_zone = [m for m in other_node
                      if member.zone is not None and m.zone is not None and m.zone != member.zone]
        best = other_zone or other_node
        out[member.rank] = best[0].rank if best else None
    return out


def document(policy_id: str, members: Iterable[Member],
             previous: Mapping[str, Any] | None = None,
             expected: int | None = None) -> dict[str, Any]:
    """The peers document for `members`, remembering each writer's previous
    holder. A writer of `previous` that is not running now (its node lost, its
    pod being replaced) keeps its holders, without a node or an address: its
    replacement's restore must still find where its copies are. Ranks of
    `expected` writers or more (a policy that shrank) are dropped."""
    members = list(members)
    pairs = holders(members)
    before = (previous or {}).get("writers", {}) if isinstance(previous, Mapping) else {}
    if not isinstance(before, Mapping):
        before = {}
    writers: dict[str, Any] = {}
    for m in sorted(members, key=lambda m: m.rank):
        old = before.get(str(m.rank), {}) if isinstance(before, Mapping) else {}
        old_holder = old.get("holder") if isinstance(old, Mapping) else None
        prev = old.get("previousHolder") if isinstance(old, Mapping) else None
        if old_holder != pairs[m.rank] and isinstance(old_holder, int):
            prev = old_holder
        writers[str(m.rank)] = {"node": m.node, "zone": m.zone, "address": m.address,
                                "holder": pairs[m.rank],
                                "previousHolder": prev if isinstance(prev, int) else None}
    for key, old in before.items():
        if key in writers or not (isinstance(key, str) and _RANK.fullmatch(key)) \
                or not isinstance(old, Mapping) \
                or (expected is not None and int(key) >= expected):
            continue
        holder, prev = _rank(old.get("holder")), _rank(old.get("previousHolder"))
        if holder is not None or prev is not None:
            writers[key] = {"node": None, "zone": None, "address": None, "holder": holder,
                            "previousHolder": prev}
    return {"policy": policy_id, "writers": writers}


@dataclass(frozen=True)
class PeerView:
    """What one pod reads from the peers document."""

    policy_id: str
    writers: dict[int, dict[str, Any]]

    def address(self, rank: int | None) -> str | None:
        if rank is None:
            return None
        entry = self.writers.get(rank)
        address = entry.get("address") if entry else None
        return address if isinstance(address, str) and address else None

    def holder(self, rank: int) -> int | None:
        entry = self.writers.get(rank) or {}
        return _rank(entry.get("holder"))

    def node(self, rank: int | None) -> str | None:
        """The node `rank`'s pod runs on, as the document says."""
        entry = self.writers.get(rank) if rank is not None else None
        node = entry.get("node") if entry else None
        return node if isinstance(node, str) and node else None

    def holder_addresses(self, rank: int) -> list[str]:
        """Where `rank`'s copies may be: its holder, then its previous holder."""
        entry = self.writers.get(rank) or {}
        found: list[str] = []
        for key in ("holder", "previousHolder"):
            holder = _rank(entry.get(key))
            address = self.address(holder)
            if address and address not in found:
                found.append(address)
        return found

    def held_for(self, rank: int) -> list[int]:
        """The writers whose holder is `rank` (whose copies this pod keeps)."""
        return sorted(r for r in self.writers if self.holder(r) == rank)


def parse(data: bytes, policy_id: str) -> PeerView:
    """Read a peers document; IntegrityError when it is malformed or names
    another policy (a mount of the wrong ConfigMap must not pair us with strangers)."""
    if len(data) > MAX_DOCUMENT_BYTES:
        raise IntegrityError(f"peers document larger than {MAX_DOCUMENT_BYTES} bytes")
    try:
        doc = json.loads(data)
    except ValueError as err:
        raise IntegrityError(f"peers document is not JSON: {err}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("writers"), dict):
        raise IntegrityError("peers document needs an object 'writers'")
    if doc.get("policy") != policy_id:
        raise IntegrityError(f"peers document is for policy {doc.get('policy')!r:.80}, "
                             f"not {policy_id!r}")
    writers: dict[int, dict[str, Any]] = {}
    for key, entry in doc["writers"].items():
        if not (isinstance(key, str) and _RANK.fullmatch(key) and isinstance(entry, dict)):
            raise IntegrityError(f"peers document: bad writer entry {key!r:.40}")
        writers[int(key)] = entry
    return PeerView(policy_id, writers)
