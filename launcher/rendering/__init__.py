"""Rendering: shell quoting (`shell`, the one place that builds shell text), the task spec,
and the run bundle's files from templates/. Pure."""
