"""Prometheus metrics of gpuflow's processes, on one endpoint per process.

Control worker (from the database at scrape time, cached for a second):
  gpuflow_jobs{fleet,status}, gpuflow_jobs_ended_total{fleet,status,reason},
  gpuflow_jobs_pending, gpuflow_jobs_waiting_for_capacity, gpuflow_jobs_pending_oldest_seconds,
  gpuflow_gpus / gpuflow_gpus_allocated / gpuflow_gpus_free{fleet,model},
  gpuflow_hosts{fleet,state}, gpuflow_store_up;
  and as they happen: gpuflow_placement_seconds{outcome}, gpuflow_job_wait_seconds{fleet},
  gpuflow_release_seconds, gpuflow_release_group_size.
Host agents (and the simulated hosts' agents inside control workers):
  gpuflow_gpu_utilization_percent / gpuflow_gpu_memory_used_bytes /
  gpuflow_gpu_memory_total_bytes{host,gpu,job_id,source}.
The control worker's metrics read the database: they live in gpuflow.metrics.store, which
only control code imports (a host agent has no database).
Every process: the Temporal SDK's worker metrics (temporal_*) and process_*.
"""

from gpuflow.metrics._endpoint import (
    DEFAULT_ADDRESS,
    VARIABLE,
    MetricsAddress,
    MetricsEndpoint,
    metrics_address,
    serve_metrics,
)
from gpuflow.metrics._gpus import GPU_SAMPLES, GpuSamples, MeteredSampler, SampledRun, Sampler
from gpuflow.metrics._registry import REGISTRY

__all__ = [
    "DEFAULT_ADDRESS",
    "GPU_SAMPLES",
    "REGISTRY",
    "VARIABLE",
    "GpuSamples",
    "MeteredSampler",
    "MetricsAddress",
    "MetricsEndpoint",
    "SampledRun",
    "Sampler",
    "metrics_address",
    "serve_metrics",
]
