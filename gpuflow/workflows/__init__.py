"""workflows"""

from temporalio.worker import UnsandboxedWorkflowRunner, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

# Pure modules whose pydantic classes cross the sandbox boundary: passing them through keeps one
# class per model (a re-imported copy would fail pydantic's instance checks) and saves memory.
PASSTHROUGH_MODULES = (
    "gpuflow.errors",
    "gpuflow.naming",
    "gpuflow.scheduler",
    "gpuflow.specs",
    "gpuflow.status",
    "gpuflow.utilization",
    "gpuflow.workflows.api_fleets",
    "gpuflow.workflows.contract",
    "gpuflow.workflows.models",
    "gpuflow.workflows.monitor",
    "gpuflow.workflows.outcome",
    "gpuflow.workflows.queue_models",
    "gpuflow.workflows.ui",
    "pydantic",
    "annotated_types",
)


def workflow_runner() -> WorkflowRunner:
    """How control workers run gpuflow's workflows: directly, without the SDK's sandbox.

    The sandbox re-imports each workflow's modules for every run and calls into the sandbox
    through `exec` for every payload of every activation and completion; a job on the embedded
    stack cost the control worker 68 ms of CPU with it and 49 ms without, nothing else changed
    (one run each; 59 ms with every gpuflow module passed through). What it guards is checked
    where it is cheap instead: every workflow test and every replay of a recorded history runs
    in `checked_workflow_runner`, so a non-deterministic call (the clock, randomness, I/O) in
    workflow code fails the tests, and the workflow modules keep no module-level state that one
    run could leave to another."""
    return UnsandboxedWorkflowRunner()


def checked_workflow_runner() -> SandboxedWorkflowRunner:
    """The SDK's sandbox, in which the tests run gpuflow's workflows: the workflow modules are
    re-imported per run and their calls restricted; only pure modules pass through."""
    return SandboxedWorkflowRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_modules(*PASSTHROUGH_MODULES)
    )
