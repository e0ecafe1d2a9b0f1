"""State in sqlmodel: fleets, hosts, GPUs, allocations, jobs, and plain reads. SQLite by default,
PostgreSQL when GPUFLOW_DATABASE_URL points at one. Decisions over this state live in
gpuflow.services."""

from gpuflow.store.db import Store, database_url, gpuflow_home

__all__ = ["Store", "database_url", "gpuflow_home"]
