"""Slurm behind the scheduler interface: preflight and submission through submitit
(`submit`, `array`), squeue/sacct calls (`client`, `queries`) and what their answers mean
(`state`, pure), run.json from them (`records`), job.sbatch's Slurm lines (`script`), and
`glaunch run` inside an allocation (`allocation`)."""
