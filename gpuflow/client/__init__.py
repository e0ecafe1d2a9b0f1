"""The Python SDK: Temporal only (no database, no SSH, no scheduler I/O of its own).

from gpuflow import Client, JobSpec
client = await Client.connect()
job = await client.submit(JobSpec(name="train", commands=["python train.py"]))
outcome = await client.wait(job.id)

What its calls return is exported here (and from `gpuflow`): `offers` an `Offers`, `plan`
`JobPlan`s, `describe` a `JobDescription`, `events` `JobEvents`, `metrics` a `UtilizationState`.
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
from gpuflow.scheduler.offers import Offers
from gpuflow.scheduler.together import JobPlan
from gpuflow.utilization import UtilizationState

__all__ = [
    "AppliedQueue",
    "Client",
    "FleetInfo",
    "JobDescription",
    "JobEvent",
    "JobEvents",
    "JobInfo",
    "JobOutcome",
    "JobPlan",
    "Offers",
    "OptionOffers",
    "Progress",
    "QueueInfo",
    "StopOutcome",
    "StopStep",
    "UtilizationState",
    "taken_option",
]
