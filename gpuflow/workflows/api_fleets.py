"""The API's fleet records and requests (gpuflow/workflows/api.py serves them): a fleet as the
client sees it, and which page of the fleets' listing to answer."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

__all__ = ["HOSTS_PER_PAGE", "FleetRecord", "FleetRef", "FleetsPage"]


class FleetRecord(BaseModel):
    name: str
    kind: str
    scorer: str
    hosts: list[dict[str, Any]]
    """Each host's state, facts and use (gpuflow/control/api_fleets.py); its labels are
    `common_labels` and its own `other_labels` (the client puts them together as `labels`)."""
    workload: dict[str, Any] | None = None
    warnings: list[str] = Field(default_factory=list)
    """What an apply left that the user should know (GPUs dropped under running jobs)."""
    common_labels: dict[str, str] = Field(default_factory=dict)
    """The labels every host of the fleet has, with the same value: sent once, not once a host
    (the same in each page: they are the whole fleet's)."""


class FleetRef(BaseModel):
    name: str


HOSTS_PER_PAGE = 400
"""Hosts in one answer of `fleets`: about 1,100 bytes each with 8 GPUs, a few labels and a
taint, so a page stays under Temporal's 512 KB payload warning, far from its 2 MiB limit that a
whole big fleet passes. A client asks for this many (`most`); a control worker answers what it
is asked, so clients of another size read the same listing."""


class FleetsPage(BaseModel):
    """Which part of the fleets' listing to answer (`Empty`, what clients sent before pages,
    reads as every host of every fleet)."""

    fleet: str | None = None
    """Only this fleet."""
    after: int = Field(default=0, ge=0)
    """Hosts of the listing (fleets in order, each fleet's hosts in order) to skip."""
    most: int | None = Field(default=None, ge=1)
    """Hosts to answer at most (None: all). A fleet is in each page that holds some of its
    hosts, and one without hosts in the page its place falls in. Each page is read on its own:
    a fleet changed between two pages may show a host twice or miss one in that listing."""
