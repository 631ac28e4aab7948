"""dspark-obs: observability and acceptance-ceiling analytics for DSpark on SGLang."""

__version__ = "0.1.0"
