"""The run-directory contract, the floor both sides stand on: every file name of a run
(`layout`), run.json and its start records (`records`), safe reads and atomic writes
(`files`), the registry of runs, the typed task spec the job reads (`taskspec`, task.json)
and the words it runs (`launch`), and the GLAUNCH_* names (`envnames`)."""
