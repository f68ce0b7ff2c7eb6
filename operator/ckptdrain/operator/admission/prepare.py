"""`ckptdrain-prepare`: the only part of ckptdrain that runs as root.

kubelet creates a missing hostPath (DirectoryOrCreate) as root, mode 0755, so
the agent (uid 65532) could not write the local tier. This first init
container hands the policy's directory to 65532 (0700: other node users, and
other policies' pods, cannot read checkpoints), with CHOWN and FOWNER only,
no other volume and a fixed program; chown before chmod keeps concurrent pods
from racing.

With the work dir on the node (admission/work_dir.py) it also hands the
trainer's work dir to 65532 and the pod's shared group, mode 2775. Root
without CAP_DAC_OVERRIDE cannot create anything in a directory 65532 owns
(mode 0700), so the work dir comes as a second mount of the same volume,
with the trainer's own subPathExpr (CKPTDRAIN_WORK_NAME, `work-<writer>-<pod
uid>`: one per pod, admission/work_dir.py): kubelet creates it, and the
program checks the name strictly, then changes the dir by descriptor.
kubelet follows a symlink that stays inside the volume, so
the program first proves, from /proc/self/mountinfo, that what it got is
`<node path>/<work name>` itself on the same filesystem, and refuses
otherwise: an entry planted in the node path never redirects the chown.
"""

from __future__ import annotations

from typing import Any

from ckptdrain.contract.env import Env
from ckptdrain.operator import containers
from ckptdrain.operator.admission import resources
from ckptdrain.operator.admission.pod_env import LOCAL_DIR, WORK_DIR, work_name_env, work_on_node
from ckptdrain.operator.admission.work_dir import trainer_mount
from ckptdrain.operator.config import OperatorConfig
from ckptdrain.operator.policy.spec import Policy

PREPARE = "ckptdrain-prepare"
RUN_AS = 65532
WORK_MODE = 0o2775

# The program run with `python3 -c`. Standard library only; every value it
# gets is written by `script` with repr, and the work dir's name is read from
# the environment, never put into the program text (which holds no `$(`:
# kubelet would expand one).
_PROGRAM = """\
import os, posixpath, re, sys
local, work, group = {local!r}, {work!r}, {group!r}
os.chown(local, {uid}, {uid}, follow_symlinks=False); os.chmod(local, 0o700)
if work is not None:
    name = os.environ.get("{work_name}", "")
    if not re.fullmatch(r"work-[0-9]+-[0-9a-f][0-9a-f-]*", name):
        sys.exit(f"ckptdrain-prepare: {work_name}={{name!r}}: "
                 "expected work-<writer>-<pod uid> (digits, then [0-9a-f-])")
    mounts = {{}}
    with open("/proc/self/mountinfo") as info:
        for line in info:
            fields = line.split()
            mounts[fields[4]] = (fields[2], fields[3])
    if work not in mounts or local not in mounts or \\
            mounts[work] != (mounts[local][0], posixpath.join(mounts[local][1], name)):
        sys.exit(f"ckptdrain-prepare: {{work}} is not {{name}} of the local tier itself "
                 f"(mounted {{mounts.get(work)}}, local tier {{mounts.get(local)}}): "
                 "a symlink in the node path? refusing to change its owner")
    fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    os.fchown(fd, {uid}, group); os.fchmod(fd, {mode:#o})
    if os.fstat(fd).st_mode & 0o7777 != {mode:#o}:
        sys.exit(f"ckptdrain-prepare: {{work}}: mode {{os.fstat(fd).st_mode & 0o7777:#o}}, "
                 "expected {mode:#o} (is this container in group {{group}}?)")
"""


def script(group: int, *, local: str = LOCAL_DIR, work: str | None = WORK_DIR) -> str:
    """The prepare program: `local` handed to 65532 (0700), and, unless `work`
    is None, the mount at `work` of the local tier's work dir (named by
    $CKPTDRAIN_WORK_NAME) to 65532:`group`, mode 2775."""
    return _PROGRAM.format(local=local, work=work, group=group, uid=RUN_AS, mode=WORK_MODE,
                           work_name=Env.WORK_NAME.value)


def container(policy: Policy, config: OperatorConfig, group: int,
              rank: int | None, *, equal: bool = False) -> dict[str, Any]:
    """The prepare init container for writer `rank` of `policy` whose pod
    shares `group`; with `equal`, its cpu and memory limits equal its
    requests (admission/resources.py)."""
    mounts: list[dict[str, Any]] = [{"name": "ckptdrain-local", "mountPath": LOCAL_DIR}]
    on_node = work_on_node(policy)
    if on_node:
        mounts.append(trainer_mount(policy))
    prepare: dict[str, Any] = {
        "name": PREPARE, "image": config.image, "imagePullPolicy": config.image_pull_policy,
        "command": ["python3", "-c", script(group, work=WORK_DIR if on_node else None)],
        "volumeMounts": mounts,
        "securityContext": {
            "runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False,
            "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"], "add": ["CHOWN", "FOWNER"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "resources": resources.injected(containers.PREPARE, policy.containers, equal=equal),
        # Why it refused, as the container's last state on the pod.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if on_node:  # the subPathExpr's, and the program's
        prepare["env"] = work_name_env(rank)
    return prepare
