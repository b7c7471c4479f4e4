"""One pydantic config tree (`MasterConfig`) for every process of a run, loaded from YAML plus Hydra-style overrides.

Loading never imports torch: a bad config fails in well under a second, before any model is touched.
"""

from fleet.config.loader import ConfigError, load_config, parse_config
from fleet.config.schema import MasterConfig

__all__ = ["ConfigError", "MasterConfig", "load_config", "parse_config"]
