"""Rendering: the run bundle's files from templates/ (job.sbatch, env.sh, ds_config.json,
resolved.yaml, hparams.json) and the task spec from the plan (task.json). Pure; every value
that reaches a shell is quoted by launcher.shell."""
