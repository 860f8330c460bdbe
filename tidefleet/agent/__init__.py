"""The worker agent on every node, and the checkpoint API a workload imports."""
