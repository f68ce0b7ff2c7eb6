"""Where the driver keeps each policy's node data, and who may have it.

    <root>/                               root-owned, 0711
      <namespace>/                        root-owned, 0711
        <policy uid>/                     root-owned, 0711
          owner.json                      {"namespace", "policyUid", "policyName"}
          data/                           the volume: bind-mounted into pods;
                                          owner uid, the pod's fsGroup, 2770
      .published/<volume id>.json         {"targetPath", "source"}: what to undo

Keyed by the policy's UID, not its name: a policy deleted and recreated
under the same name (or a namespace recreated by another tenant) gets a new,
empty directory, never the old run's data. The UID is looked up from the
pod's namespace, which kubelet gives, and the policy name, which the tenant
writes (requests.py): a name from another namespace is simply not found.

`owner.json` is written inside a staging directory that is renamed into
place whole, so a directory without a matching marker was not made by this
driver for this policy (tampered with, or left by an older layout): it is
refused, never handed out. The marker sits beside `data/`, outside what a
pod sees, so a tenant cannot rewrite it.

The data's group is set once, when the directory is made: the first pod's
fsGroup (or the agent's own group without one), recorded as `group`. A
later pod of the policy with another fsGroup is mounted with ownership left
as it is: taking the group over would lock the pods already running out of
a 2770 directory (their trainers hold only their own fsGroup), and refusing
would protect nothing: the injected containers are uid 65532, the owner,
and a trainer mounts only its pod's own work dir inside the data
(`subPathExpr`), which restore gives that pod's group (restore/pod_work.py).
A later pod's trainer thus never enters the rest of the data; its agent
does.

The mount calls and the policy lookup are injected (`Mounter`,
`PolicyResolver`): tests run the same code with a real bind mount.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ckptdrain.csi.requests import (
    PublishRequest,
    Refused,
    UnpublishRequest,
    check_policy_uid,
)

log = logging.getLogger(__name__)

OWNER_FILE = "owner.json"
DATA_DIR = "data"
PUBLISHED_DIR = ".published"
STAGING_PREFIX = ".new-"
ROOT_DIR_MODE = 0o711  # traversable, not listable: no tenant learns the others' UIDs
DATA_MODE = 0o2770  # the owner (the agent) and the pod's group; setgid keeps the group
TARGET_MODE = 0o750

@dataclass(frozen=True)
class PolicyFound:
    """A policy as the apiserver gave it: its uid and the class it names
    (None: none)."""

    uid: str
    class_name: str | None


# (namespace, policy name) -> the policy's metadata.uid (or a PolicyFound,
# which also names its class), or None when there is no such policy. Raises
# Refused("UNAVAILABLE", ...) when it cannot tell.
PolicyResolver = Callable[[str, str], "PolicyFound | None"]


def uid_of(found: PolicyFound | None) -> str | None:
    """The uid a resolver answered (None: no such policy). Anything else is
    a resolver of the wrong type (say a bare uid, which would carry no
    class and so switch reclaim per class off unseen): refused loudly."""
    if found is None or isinstance(found, PolicyFound):
        return None if found is None else found.uid
    raise TypeError(f"a policy resolver must answer a PolicyFound or None, "
                    f"not {type(found).__name__}")


class Mounter(Protocol):
    def bind(self, source: Path, target: Path, read_only: bool) -> None: ...
    def unmount(self, target: Path) -> None: ...
    def is_mount_point(self, path: Path) -> bool: ...


@dataclass(frozen=True)
class Owner:
    namespace: str
    policy_uid: str
    policy_name: str
    # The data dir's group; None in markers written before it was recorded.
    group: int | None = None

    def to_json(self) -> str:
        return json.dumps({"namespace": self.namespace, "policyUid": self.policy_uid,
                           "policyName": self.policy_name, "group": self.group},
                          sort_keys=True)


def policy_dir(root: Path, namespace: str, policy_uid: str) -> Path:
    return root / namespace / policy_uid


def read_owner(directory: Path) -> Owner | None:
    """The marker of a policy directory; None when missing or unreadable."""
    try:
        raw = json.loads((directory / OWNER_FILE).read_text())
        group = raw.get("group")
        return Owner(raw["namespace"], raw["policyUid"], raw["policyName"],
                     group if isinstance(group, int) else None)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_file(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    try:
        with open(tmp, "x", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # nothing half-written left behind
        raise


def _root_dir(path: Path) -> Path:
    path.mkdir(mode=ROOT_DIR_MODE, exist_ok=True)
    os.chmod(path, ROOT_DIR_MODE, follow_symlinks=False)
    return path


def _check_parent(target: Path) -> None:
    # kubelet makes the parent; a symlink anywhere in it would send the
    # mount elsewhere on the node.
    parent = target.parent
    if not parent.is_dir() or os.path.realpath(parent) != str(parent):
        raise Refused("FAILED_PRECONDITION", f"target_path {str(target)!r}: its parent "
                      "must be a real directory (made by kubelet), not a link")


class VolumeStore:
    """Publishes and unpublishes the node tier's volumes under `root`."""

    def __init__(self, root: Path, resolve_policy: PolicyResolver, mounter: Mounter,
                 owner_uid: int = 65532) -> None:
        self.root = root
        self.resolve_policy = resolve_policy
        self.mounter = mounter
        self.owner_uid = owner_uid
        # Publishes are rare (one per pod start): one lock keeps creation and
        # the marker check free of races between kubelet's concurrent calls,
        # and the collector holds it while it decides on and moves a
        # directory away (collector.py), so that no publish comes between.
        self.lock = threading.Lock()

    def publish(self, req: PublishRequest) -> Path:
        """Mount the policy's data dir at the request's target; idempotent.
        Returns the data dir. Raises `Refused`."""
        uid = uid_of(self.resolve_policy(req.namespace, req.policy_name))
        if uid is None:
            raise Refused("NOT_FOUND", f"volumeAttributes.policy: no CheckpointPolicy "
                          f"{req.policy_name!r} in namespace {req.namespace!r} (the pod's)")
        # Without an fsGroup the data is shared through the agent's own group.
        group = self.owner_uid if req.mount_group is None else req.mount_group
        owner = Owner(req.namespace, check_policy_uid(uid), req.policy_name, group)
        target = Path(req.target_path)
        with self.lock:
            _check_parent(target)  # before anything is made for the request
            data = self._policy_data(owner)
            record = self._published(req.volume_id)
            if self.mounter.is_mount_point(target):
                if record == {"targetPath": str(target), "source": str(data)}:
                    return data  # kubelet retried a publish that had worked
                raise Refused("ALREADY_EXISTS", f"target_path {str(target)!r}: already "
                              f"mounted, not with volume {req.volume_id!r} of this policy")
            self._make_target(target)
            self._record(req.volume_id, {"targetPath": str(target), "source": str(data)})
            self.mounter.bind(data, target, req.read_only)
        log.info("published volume %s of policy %s/%s (uid %s) for pod %s at %s",
                 req.volume_id, req.namespace, req.policy_name, uid, req.pod_name, target)
        return data

    def unpublish(self, req: UnpublishRequest) -> None:
        """Unmount and remove the target; the data stays. Idempotent."""
        target = Path(req.target_path)
        with self.lock:
            record = self._published(req.volume_id)
            if record is not None and record.get("targetPath") != str(target):
                raise Refused("INVALID_ARGUMENT", f"target_path {str(target)!r}: volume "
                              f"{req.volume_id!r} is published at another path")
            if self.mounter.is_mount_point(target):
                self.mounter.unmount(target)
            try:
                target.rmdir()
            except FileNotFoundError:
                pass
            except OSError as err:
                raise Refused("INTERNAL", f"target_path {str(target)!r}: not removed after "
                              f"unmount ({err.strerror})") from err
            (self.root / PUBLISHED_DIR / f"{req.volume_id}.json").unlink(missing_ok=True)
        log.info("unpublished volume %s from %s", req.volume_id, target)

    def _policy_data(self, owner: Owner) -> Path:
        """The policy's data dir, created with its marker on first use;
        refused when the marker is missing or names another owner."""
        _root_dir(self.root)
        directory = policy_dir(self.root, owner.namespace, owner.policy_uid)
        if not directory.exists():
            namespace_dir = _root_dir(self.root / owner.namespace)
            staging = namespace_dir / f"{STAGING_PREFIX}{uuid.uuid4().hex}"
            staging.mkdir(mode=ROOT_DIR_MODE)
            os.chmod(staging, ROOT_DIR_MODE)
            write_file(staging / OWNER_FILE, owner.to_json())
            (staging / DATA_DIR).mkdir(mode=0o700)
            self._prepare(staging / DATA_DIR,
                          self.owner_uid if owner.group is None else owner.group)
            os.rename(staging, directory)
            log.info("created the node data of policy %s/%s (uid %s)",
                     owner.namespace, owner.policy_name, owner.policy_uid)
        if directory.is_symlink() or not directory.is_dir():
            raise Refused("PERMISSION_DENIED", f"{directory}: not a directory this driver made")
        found = read_owner(directory)
        if found is None:
            raise Refused("PERMISSION_DENIED", f"{directory}: no readable {OWNER_FILE}: "
                          "not made by this driver, nothing in it is handed out")
        if (found.namespace, found.policy_uid) != (owner.namespace, owner.policy_uid):
            # The other owner is named in the driver's log only: kubelet turns
            # the message into an event the pod's tenant reads.
            log.error("%s/%s names policy uid %s in namespace %s, not uid %s in %s: "
                      "refused", directory, OWNER_FILE, found.policy_uid, found.namespace,
                      owner.policy_uid, owner.namespace)
            raise Refused("PERMISSION_DENIED",
                          f"the node data of policy {owner.namespace}/{owner.policy_name} "
                          f"(uid {owner.policy_uid}): its {OWNER_FILE} names another owner "
                          "(see the CSI driver's log); nothing in it is handed out")
        data = directory / DATA_DIR
        if data.is_symlink() or not data.is_dir():
            raise Refused("PERMISSION_DENIED", f"{data}: not a directory this driver made")
        # A marker from before the group was recorded: the group on disk is it.
        group = found.group if found.group is not None else os.stat(data).st_gid
        if group != owner.group:
            # Left as it is: taking the group over would lock out the pods
            # already running, and refusing protects nothing (module doc).
            log.info("policy %s/%s: a pod with group %s mounts node data of group %s; "
                     "ownership left as it is", owner.namespace, owner.policy_name,
                     owner.group, group)
        return data

    def clean_staging(self) -> None:
        """Remove staging dirs a crash left half made (never renamed into
        place, so never handed out)."""
        if not self.root.is_dir():
            return
        for namespace in self.root.iterdir():
            if namespace.name == PUBLISHED_DIR or namespace.is_symlink() or not namespace.is_dir():
                continue
            for staging in namespace.glob(f"{STAGING_PREFIX}*"):
                if staging.is_dir() and not staging.is_symlink():
                    shutil.rmtree(staging)
                    log.info("removed %s, left half made by an earlier run", staging)

    def _prepare(self, data: Path, gid: int) -> None:
        # The agent (owner_uid) owns the data; the pod's fsGroup, which every
        # container of the pod holds, shares it.
        fd = os.open(data, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fchown(fd, self.owner_uid, gid)
            os.fchmod(fd, DATA_MODE)
        finally:
            os.close(fd)

    def _make_target(self, target: Path) -> None:
        _check_parent(target)
        try:
            target.mkdir(mode=TARGET_MODE)
        except FileExistsError:
            if target.is_symlink() or not target.is_dir():
                raise Refused("FAILED_PRECONDITION", f"target_path {str(target)!r}: exists "
                              "and is not a directory") from None

    def _published(self, volume_id: str) -> dict[str, str] | None:
        try:
            return json.loads((self.root / PUBLISHED_DIR / f"{volume_id}.json").read_text())
        except (OSError, ValueError):
            return None

    def published_sources(self) -> set[Path]:
        """The data dirs some volume is published from, by the records (the
        caller holds `lock` for an answer that stays true)."""
        records = self.root / PUBLISHED_DIR
        if not records.is_dir():
            return set()
        sources = set()
        for record in records.glob("*.json"):
            try:
                sources.add(Path(json.loads(record.read_text())["source"]))
            except (OSError, ValueError, KeyError, TypeError):
                # A record that cannot be read might be of any directory:
                # the caller must then delete nothing.
                raise OSError(f"{record}: unreadable publish record") from None
        return sources

    def published_source(self, volume_id: str, target: Path) -> Path | None:
        """The data dir of volume `volume_id` if it is published at `target`."""
        record = self._published(volume_id)
        if record is None or record.get("targetPath") != str(target):
            return None
        return Path(record["source"])

    def _record(self, volume_id: str, record: dict[str, str]) -> None:
        directory = self.root / PUBLISHED_DIR
        directory.mkdir(mode=0o700, exist_ok=True)
        write_file(directory / f"{volume_id}.json", json.dumps(record, sort_keys=True))
