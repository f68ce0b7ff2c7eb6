"""The CSI node driver: the node tier as CSI ephemeral inline volumes.

One privileged process per node serves kubelet two gRPC protocols on unix
sockets: kubelet's plugin registration (``registration``) and CSI's Identity
and Node services (``identity``, ``node``). What a volume is, where it lives
and who may have it is decided by pure code (``volumes``, ``requests``);
the gRPC services and the mount call are thin edges around it. docs/csi-driver.md
has the security model.

The gRPC stubs (``stubs``) are generated at build time by e2e/deps/csi-stubs.sh.
"""
