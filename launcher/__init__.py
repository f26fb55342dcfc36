"""glaunch: multi-node PyTorch training on Slurm from a site profile and an experiment config."""

__version__ = "0.1.0"
