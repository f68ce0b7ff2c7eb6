# One image for the operator, the agent sidecar and the restore init container:
# the same `ckptdrain` package, different sub-commands
# (`ckptdrain operator` | `ckptdrain agent` | `ckptdrain restore`).
#
# The build context is a directory holding `wheels/`: the project's wheel and
# every dependency's, built beforehand on the host. The image installs them
# with `--no-index`, so the build needs no network and no CA bundle inside the
# container (here containers cannot reach PyPI; elsewhere this makes the image
# reproducible from a wheel set you can audit). e2e/image/build.sh does it all:
#
#   pip wheel --wheel-dir CTX/wheels .
#   docker build -f Dockerfile --build-arg BASE_IMAGE=... -t ckptdrain:dev CTX
#
# Wheels must match the base image's Python (3.11) and glibc: build them with
# a CPython 3.11 on a glibc Linux (pip picks manylinux wheels).

# The base must provide python3 (3.11) with the venv module at /usr/bin or
# /usr/local/bin. The default is the official slim image; offline,
# e2e/image/base.sh makes ckptdrain-base:bookworm (debootstrap + docker import).
# The wheel must hold the CSI driver's generated gRPC stubs
# (ckptdrain/csi/stubs, from e2e/deps/csi-stubs.sh, which build.sh runs first):
# the build stage fails if they are missing.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
COPY wheels/ /wheels/
# A venv keeps the project apart from the distribution's Python. Both stages
# use the same base, so the venv's python symlink stays valid in the final
# stage. pip, setuptools and wheel are removed afterwards: nothing installs
# at run time, and they are attack surface and weight. Bytecode is compiled
# here because the root filesystem is read-only at run time.
# Recent kubernetes releases (37 here) also ship an asyncio copy of the client
# (kubernetes/aio, ~70 MB with bytecode, a quarter of the image); ckptdrain
# uses the synchronous client and Kopf its own, so it is dropped. Import
# kubernetes.aio somewhere and this line must go.
RUN python3 -m venv /opt/ckptdrain \
 && /opt/ckptdrain/bin/pip install --no-index --find-links=/wheels --no-cache-dir \
      --disable-pip-version-check --compile ckptdrain \
 && /opt/ckptdrain/bin/pip uninstall -y -q pip setuptools wheel \
 && rm -rf /opt/ckptdrain/lib/python3*/site-packages/kubernetes/aio \
 && /opt/ckptdrain/bin/python -c "import kopf, boto3, kubernetes.client, kubernetes.config" \
 && /opt/ckptdrain/bin/python -c "import ckptdrain.csi.stubs.csi_pb2_grpc, ckptdrain.csi.stubs.pluginregistration_pb2_grpc" \
 && /opt/ckptdrain/bin/ckptdrain --version

FROM ${BASE_IMAGE}
# A fixed numeric uid/gid (the "nonroot" id of distroless images) so that the
# pod's runAsUser/fsGroup and hostPath permissions can name it; a passwd entry
# so that getpass/pwd-based code does not fail. No home directory: the root
# filesystem is read-only in pods.
RUN groupadd --system --gid 65532 ckptdrain \
 && useradd --system --uid 65532 --gid 65532 --no-create-home \
      --home-dir /tmp --shell /usr/sbin/nologin ckptdrain
COPY --from=build /opt/ckptdrain /opt/ckptdrain
# Read-only root filesystem: never write bytecode next to the sources (it is
# compiled at build time), keep HOME and temporary files on /tmp, which pods
# mount as an emptyDir. Unbuffered output so that logs are not lost when the
# container is killed at the end of a grace period.
ENV PATH=/opt/ckptdrain/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONFAULTHANDLER=1 \
    PIP_NO_CACHE_DIR=1 \
    HOME=/tmp \
    TMPDIR=/tmp
LABEL org.opencontainers.image.title="ckptdrain" \
      org.opencontainers.image.description="ckptdrain operator, agent and restore (one image, sub-commands)" \
      org.opencontainers.image.licenses="Apache-2.0"
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["ckptdrain"]
CMD ["operator"]
