"""A resume resolves the run again from the folder it was submitted from
(launcher.runner.resumable.submitted_from): a run that runs on a cluster from its code
snapshot (over SSH) recorded the snapshot's counterpart of that folder, which maps back into
the code tree; a record that names the run's own directory (written by an earlier resume
over SSH) is taken as the tree's root; any other folder is the submission's own."""

from __future__ import annotations

import pytest

from launcher.runner.resumable import submitted_from

SOURCE = "/home/alice/proj"
RUN = "/scratch/alice/runs/r1"
SNAPSHOT = RUN + "/code"


@pytest.mark.parametrize(("recorded", "snapshot", "run_dir", "folder"), [
    (SNAPSHOT, SNAPSHOT, RUN, SOURCE),                                  # submitted from the tree's root
    (SNAPSHOT + "/exp/small", SNAPSHOT, RUN, SOURCE + "/exp/small"),    # from a folder of the tree
    (SNAPSHOT + "/examples/train.py", SNAPSHOT, None, SOURCE + "/examples/train.py"),   # a script recorded there
    (RUN, SNAPSHOT, RUN, SOURCE),                                       # an earlier resume's record
    ("/home/alice/proj/exp", SNAPSHOT, RUN, "/home/alice/proj/exp"),    # submitted here: the folder itself
    (SNAPSHOT + "-other", SNAPSHOT, RUN, SNAPSHOT + "-other"),          # beside the snapshot, not in it
    (RUN, None, RUN, RUN),                                              # no snapshot: nothing to map
])
def test_the_folder_a_run_was_submitted_from(recorded, snapshot, run_dir, folder):
    assert submitted_from(recorded, SOURCE, snapshot, run_dir=run_dir) == folder
