"""State in sqlmodel: fleets, hosts, GPUs, allocations, jobs. SQLite by default, PostgreSQL when
GPUFLOW_DATABASE_URL points at one."""

from gpuflow.store.capacity import read_snapshot, release_allocation, take_allocation
from gpuflow.store.db import Store, database_url, gpuflow_home

__all__ = [
    "Store",
    "database_url",
    "gpuflow_home",
    "read_snapshot",
    "release_allocation",
    "take_allocation",
]
