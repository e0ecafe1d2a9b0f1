"""gpuflow's own registry: what the endpoint serves (no other library's metrics leak into it).
Collectors are not described at registration, so registering one never reads the database."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, ProcessCollector

REGISTRY = CollectorRegistry(auto_describe=False)
ProcessCollector(registry=REGISTRY)
