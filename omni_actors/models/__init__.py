"""Model registry: pipelines, their processors, adapters and tiny-checkpoint builders."""
