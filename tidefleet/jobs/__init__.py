"""The job SDK and CLI: submit, status, logs, cancel, retry-failed, nodes."""
