"""`job_throughput.py --count-sql` (benchmarks/sql_counts.py): statements are counted under the
activity that ran them, and none outside an activity or after the count is left."""

from __future__ import annotations

import dataclasses

from sqlalchemy import Connection, text
from temporalio import activity
from temporalio.testing import ActivityEnvironment

from benchmarks.sql_counts import SqlCounts
from gpuflow.store.db import Store


def _select(connection: Connection, times: int) -> None:
    for _ in range(times):
        connection.execute(text("SELECT 1"))


async def test_statements_are_counted_by_the_activity_that_ran_them(sqlite_store: Store) -> None:
    environment = ActivityEnvironment()
    environment.info = dataclasses.replace(environment.info, activity_type="two_reads")
    with sqlite_store.engine.connect() as connection:

        @activity.defn(name="two_reads")
        async def two_reads() -> None:
            _select(connection, 2)

        with SqlCounts() as counts:
            _select(connection, 3)  # no activity: not counted
            await environment.run(two_reads)
            await environment.run(two_reads)
        _select(connection, 1)
        await environment.run(two_reads)  # the count is left: not counted
    assert counts.by_step == {"two_reads": 4}
    assert counts.render(2).splitlines()[1:] == [
        "  two_reads               2.0",
        "  all                     2.0",
    ]
