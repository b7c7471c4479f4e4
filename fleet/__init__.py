"""grpo-fleet core: the config tree, the command line and the local launcher shared by every fleet."""
