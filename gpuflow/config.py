"""Where gpuflow finds Temporal, and how it connects (always with the pydantic converter)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from gpuflow.errors import ConnectionFailed

DEFAULT_TEMPORAL_PORT = 7233


@dataclass(frozen=True)
class TemporalConfig:
    address: str
    """host:port of the Temporal frontend."""
    namespace: str = "default"
    embedded: bool = True
    """True when the address is gpuflow's own dev server (`gpuflow up`)."""

    @classmethod
    def from_env(cls) -> TemporalConfig:
        address = os.environ.get("GPUFLOW_TEMPORAL_ADDRESS")
        namespace = os.environ.get("GPUFLOW_TEMPORAL_NAMESPACE", "default")
        if address:
            return cls(address=address, namespace=namespace, embedded=False)
        port = int(os.environ.get("GPUFLOW_TEMPORAL_PORT", DEFAULT_TEMPORAL_PORT))
        return cls(address=f"127.0.0.1:{port}", namespace=namespace, embedded=True)


async def connect_temporal(config: TemporalConfig | None = None) -> Client:
    config = config or TemporalConfig.from_env()
    try:
        return await Client.connect(
            config.address, namespace=config.namespace, data_converter=pydantic_data_converter
        )
    except Exception as exc:
        hint = "start it with `gpuflow up`" if config.embedded else "check GPUFLOW_TEMPORAL_ADDRESS"
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConnectionFailed(
            f"cannot reach Temporal at {config.address} ({reason}); {hint}"
        ) from None
