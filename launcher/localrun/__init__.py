"""The local driver: a job of the local site on this machine.

``jobstep`` stands in for srun: it starts the job's tasks here, gives each its rank, sends
the warning signal before the time limit, and runs the hang watchdog beside them.
"""
