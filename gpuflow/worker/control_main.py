"""Kept so `python -m gpuflow.worker.control_main` (deployed units) still starts the control worker;
the code is gpuflow.control.main."""

from gpuflow.control.main import main

if __name__ == "__main__":
    raise SystemExit(main())
