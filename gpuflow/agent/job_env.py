"""A job's environment: a short allowlist from the agent's own, the job's env (secret references
already resolved), and gpuflow's node variables; never the rest of the agent's environment,
which may hold database passwords, Temporal keys and gpuflow settings."""

from __future__ import annotations

import os

from gpuflow.workflows.models import StartProcessInput

# fmt: off
INHERITED_ENV = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM",
    "LD_LIBRARY_PATH",
})
# fmt: on
"""The only variables a job takes from the agent's environment, with every LC_*. A job sets
anything else in its own env."""


def job_environment(inp: StartProcessInput, job_env: dict[str, str]) -> dict[str, str]:
    """The environment the job's process starts with; the node variables win."""
    inherited = {
        key: value
        for key, value in os.environ.items()
        if key in INHERITED_ENV or key.startswith("LC_")
    }
    return {**inherited, **job_env, **node_env(inp)}


def node_env(inp: StartProcessInput) -> dict[str, str]:
    """Where the node sits in the job: rank, node count, master address, its GPUs."""
    node = inp.node
    env = {
        "GPUFLOW_JOB_ID": inp.job_id,
        "GPUFLOW_ATTEMPT": str(inp.attempt),
        "GPUFLOW_NODE_RANK": str(node.rank),
        "GPUFLOW_NODES_NUM": str(inp.nodes),
        "GPUFLOW_MASTER_NODE_IP": inp.master_address,
        "GPUFLOW_GPUS_PER_NODE": str(len(node.gpu_indices)),
        "GPUFLOW_GPUS_NUM": str(len(node.gpu_indices) * inp.nodes),
        "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in node.gpu_indices),
    }
    if node.simulated:
        env["GPUFLOW_SIMULATED"] = "1"
    if node.gpu_fraction is not None:
        env["GPUFLOW_GPU_FRACTION"] = f"{node.gpu_fraction:g}"
    return env
