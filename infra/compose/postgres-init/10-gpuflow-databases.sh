#!/bin/sh
# Runs once, when the postgres container starts on an empty data volume: one role per consumer,
# so Temporal cannot touch gpuflow's tables and the control worker cannot touch Temporal's.
# Passwords are psql variables (:'name' quotes them), never spliced into the SQL text.
set -eu

psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
    -v temporal_password="$TEMPORAL_DB_PASSWORD" \
    -v gpuflow_password="$GPUFLOW_DB_PASSWORD" <<'SQL'
CREATE ROLE temporal LOGIN PASSWORD :'temporal_password';
CREATE DATABASE temporal OWNER temporal;
CREATE DATABASE temporal_visibility OWNER temporal;
CREATE ROLE gpuflow LOGIN PASSWORD :'gpuflow_password';
CREATE DATABASE gpuflow OWNER gpuflow;
SQL
