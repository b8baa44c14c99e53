"""The orchestrator: prompts, scheduling, rollouts, scoring, batches with advantages, evals (the run's loop)."""
