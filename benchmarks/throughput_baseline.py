"""The baseline of benchmarks/job_throughput.py: one workflow, one trivial activity, in a module
of its own. Temporal's sandbox runs a workflow's module afresh for every workflow it starts, so
this module holds nothing else: the baseline pays what a minimal Temporal workflow pays, not
the benchmark's own definitions."""

from __future__ import annotations

from datetime import datetime, timedelta

from temporalio import activity, workflow


@activity.defn(name="bench_noop")
async def bench_noop(value: int) -> int:
    return value


@workflow.defn(name="BenchBaselineWorkflow")
class BenchBaselineWorkflow:
    @workflow.run
    async def run(self, value: int) -> datetime:
        await workflow.execute_activity(
            bench_noop, value, start_to_close_timeout=timedelta(seconds=60)
        )
        return workflow.now()  # the task that saw the activity's result: the job's `running`
