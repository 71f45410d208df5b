# nats:2.15-alpine where it cannot be pulled: the nats-server binary built
# from its Go module at the version in go.mod (the build context holds it),
# on the local Debian base with wget for compose's health check. Like the
# official image it runs `nats-server` with the arguments compose passes.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
RUN set -eu; \
    apt-get update; \
    apt-get install -y --no-install-recommends wget; \
    rm -rf /var/lib/apt/lists/*
COPY nats-server /usr/local/bin/nats-server
EXPOSE 4222 6222 8222
ENTRYPOINT ["nats-server"]
CMD ["--help"]
