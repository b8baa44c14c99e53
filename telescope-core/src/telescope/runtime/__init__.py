"""The run: driver, services (Ray workers), checkpoints, evals, launch."""
