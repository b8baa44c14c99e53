"""The local run store: a run directory holding config, metrics, rollouts, events, evals and logs."""
