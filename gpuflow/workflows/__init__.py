"""workflows"""

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
    "gpuflow.workflows.contract",
    "gpuflow.workflows.models",
    "gpuflow.workflows.monitor",
    "gpuflow.workflows.outcome",
    "gpuflow.workflows.queue_models",
    "gpuflow.workflows.ui",
    "pydantic",
    "annotated_types",
)


def workflow_runner() -> SandboxedWorkflowRunner:
    """The sandbox every gpuflow worker (and test) runs workflows in."""
    return SandboxedWorkflowRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_modules(*PASSTHROUGH_MODULES)
    )
