#!/bin/sh
# Create or upgrade Temporal's schemas in PostgreSQL, before the server starts. It runs on every
# `docker compose up`: on a current schema it changes nothing, and after TEMPORAL_VERSION is
# raised it applies the new schema versions that the new server needs.
# The databases and the temporal role come from postgres-init/ (first start of the volume).
set -eu

: "${POSTGRES_SEEDS:=postgresql}"
: "${DB_PORT:=5432}"
: "${TEMPORAL_DB_PASSWORD:?}"
export SQL_PASSWORD="$TEMPORAL_DB_PASSWORD"
schemas=/etc/temporal/schema/postgresql/v12

sql_tool() {
    temporal-sql-tool --plugin postgres12 --ep "$POSTGRES_SEEDS" -p "$DB_PORT" -u temporal "$@"
}

sql_tool --db temporal setup-schema -v 0.0
sql_tool --db temporal update-schema -d "$schemas/temporal/versioned"
sql_tool --db temporal_visibility setup-schema -v 0.0
sql_tool --db temporal_visibility update-schema -d "$schemas/visibility/versioned"
echo "Temporal schemas are current"
