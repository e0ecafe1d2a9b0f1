"""The Python SDK: Temporal only (no database, no SSH, no scheduler I/O of its own).

from gpuflow import Client, JobSpec
client = await Client.connect()
job = await client.submit(JobSpec(name="train", commands=["python train.py"]))
outcome = await client.wait(job.id)
"""

from gpuflow.client.core import Client
from gpuflow.client.models import (
    AppliedQueue,
    FleetInfo,
    JobDescription,
    JobEvent,
    JobEvents,
    JobInfo,
    JobOutcome,
    OptionOffers,
    Progress,
    QueueInfo,
    StopOutcome,
    StopStep,
    taken_option,
)

__all__ = [
    "AppliedQueue",
    "Client",
    "FleetInfo",
    "JobDescription",
    "JobEvent",
    "JobEvents",
    "JobInfo",
    "JobOutcome",
    "OptionOffers",
    "Progress",
    "QueueInfo",
    "StopOutcome",
    "StopStep",
    "taken_option",
]
