"""Entry points kept for deployed units; gpuflow.control.main and gpuflow.agent.main hold the
code."""
