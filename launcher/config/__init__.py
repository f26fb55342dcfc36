"""Configuration: the schemas, YAML files with the line of every key, site profiles and
their search path, experiments with overrides, and where each value came from."""
