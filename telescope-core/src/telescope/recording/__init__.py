"""Recording: the step recorder, rollout metrics, progress, events, the run store and the W&B logger."""
