# postgres:15 where it cannot be pulled: Debian's postgresql-15 with an
# entrypoint that keeps the official image's contract as compose.yaml uses
# it (POSTGRES_PASSWORD, POSTGRES_USER, POSTGRES_DB, PGDATA in
# /var/lib/postgresql/data, /docker-entrypoint-initdb.d, pg_isready, the
# postgres user as uid/gid 999, listening on every interface with
# scram-sha-256 for TCP).
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
RUN set -eu; \
    groupadd -r -g 999 postgres; \
    useradd -r -u 999 -g postgres -d /var/lib/postgresql -s /bin/bash postgres; \
    mkdir -p /etc/postgresql-common /docker-entrypoint-initdb.d; \
    echo 'create_main_cluster = false' >/etc/postgresql-common/createcluster.conf; \
    apt-get update; \
    apt-get install -y --no-install-recommends postgresql-15; \
    rm -rf /var/lib/apt/lists/*; \
    install -d -o postgres -g postgres -m 0700 /var/lib/postgresql/data; \
    install -d -o postgres -g postgres -m 2777 /var/run/postgresql
COPY postgres-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PGDATA=/var/lib/postgresql/data \
    LANG=C.UTF-8
VOLUME /var/lib/postgresql/data
EXPOSE 5432
STOPSIGNAL SIGINT
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["postgres"]
