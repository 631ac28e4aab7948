"""The engine a configuration needs: the real world's brings torch and its trained networks,
so it is imported only when a run asks for it."""

from __future__ import annotations

from .config import RuntimeConfig
from .engine import DSparkRuntime


def make_runtime(config: RuntimeConfig) -> DSparkRuntime:
    """A runtime for `config`'s world (ValueError for a configuration that is not valid)."""
    config.validate()
    if config.world_spec.target == "real":
        try:
            from .real.runtime import RealRuntime
        except ImportError as exc:
            raise ValueError(
                f"the real world needs torch: pip install 'dspark-obs[torch]' ({exc})"
            ) from None
        return RealRuntime(config)
    return DSparkRuntime(config)
