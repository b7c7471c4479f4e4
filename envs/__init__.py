"""Task sources and scoring environments: the embedded SWE task set, SWE-bench loaders, prompts, patches, arith.

`envs.registry` is the entry point (datasets and environments by name); nothing heavy is imported here.
"""
