"""Configuration: pipeline topology (code), deploy placement (YAML), validation."""
