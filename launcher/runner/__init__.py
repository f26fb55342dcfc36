"""The runner, above the schedulers: submit (`submission`), sweeps (`sweep_submission`,
`sweeps`), resume, `--after` (`dependencies`), and status, wait, cancel and list as data
(`status`, `manage`, `recent`, `lookup`); it writes the run directory (`bundle`, `snapshot`)
and never formats text for a person: the views do."""
