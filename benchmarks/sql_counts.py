"""SQL statements counted by the control step (activity) that ran them, for
`job_throughput.py --count-sql`: what a job costs the database, step by step."""

from __future__ import annotations

from collections import Counter
from types import TracebackType
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine
from temporalio import activity


class SqlCounts:
    """While entered, every statement any engine of this process runs is counted under the
    activity type it ran in; statements outside an activity (setting the fleet up) are not."""

    def __init__(self) -> None:
        self.by_step: Counter[str] = Counter()

    def _seen(self, *_: Any) -> None:
        try:
            step = activity.info().activity_type
        except RuntimeError:  # not in an activity
            return
        self.by_step[step] += 1

    def __enter__(self) -> SqlCounts:
        event.listen(Engine, "before_cursor_execute", self._seen)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        event.remove(Engine, "before_cursor_execute", self._seen)

    def render(self, jobs: int) -> str:
        lines = [f"SQL statements per job ({jobs} jobs), by control step:"]
        for step, count in self.by_step.most_common():
            lines.append(f"  {step:<20} {count / jobs:6.1f}")
        lines.append(f"  {'all':<20} {sum(self.by_step.values()) / jobs:6.1f}")
        return "\n".join(lines)
