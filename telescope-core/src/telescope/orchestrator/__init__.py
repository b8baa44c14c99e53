"""The orchestrator: drives rollouts, scores them, assembles training batches and logs the run."""
