"""SWE tasks: build the embedded task set (recipe -> sdists -> bugs -> validated tasks), load SWE-bench files,
build prompts and extract patches. Modules import lazily through `envs.registry`; nothing heavy happens here."""
