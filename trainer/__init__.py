"""The trainer fleet: GRPO math, policy updates and weight publication."""
