"""What runs in the control worker: control activities, reconciliation, the API behind the
client, the worker, its main and the embedded stack (docs/architecture.md)."""
