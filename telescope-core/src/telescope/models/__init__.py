"""Model helpers: locally built tiny models for CPU runs and tests."""
