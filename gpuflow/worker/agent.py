"""Kept so `python -m gpuflow.worker.agent` (deployed units) still starts a host agent; the code
is gpuflow.agent.main."""

from gpuflow.agent.main import main

if __name__ == "__main__":
    raise SystemExit(main())
