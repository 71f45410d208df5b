# The runtime base (RUNTIME_IMAGE of deploy/Dockerfile) where
# gcr.io/distroless/static-debian12:nonroot cannot be pulled: the same
# contents from Debian packages on scratch. CA certificates, time zones,
# /etc/passwd and /etc/group with root, nobody and nonroot (65532), a
# writable /tmp and nonroot's home; no shell, no package manager.
ARG BASE_IMAGE
FROM ${BASE_IMAGE} AS files
RUN set -eu; \
    mkdir -p /rootfs/etc/ssl/certs /rootfs/usr/share /rootfs/tmp /rootfs/home/nonroot; \
    cp /etc/ssl/certs/ca-certificates.crt /rootfs/etc/ssl/certs/; \
    cp -a /usr/share/zoneinfo /rootfs/usr/share/; \
    printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' \
      'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin' \
      'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >/rootfs/etc/passwd; \
    printf '%s\n' 'root:x:0:' 'nobody:x:65534:' 'nonroot:x:65532:' >/rootfs/etc/group; \
    chmod 1777 /rootfs/tmp; \
    chown 65532:65532 /rootfs/home/nonroot; \
    chmod 0700 /rootfs/home/nonroot

FROM scratch
COPY --from=files /rootfs/ /
USER 65532:65532
