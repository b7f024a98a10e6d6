"""omni-actors: a runtime for multi-stage, omni-modal model pipelines."""

__version__ = "0.1.0"
