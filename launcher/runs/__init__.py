"""Runs: the run directory's layout and records (`layout`, shared with the in-job runtime),
writing a bundle, the registry of runs, their status and logs."""
