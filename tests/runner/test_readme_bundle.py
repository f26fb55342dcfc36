"""The run bundle table (docs/run-bundle.md) names every folder a running job adds to the run
directory (launcher.rundir.layout), not only what submission writes."""

from __future__ import annotations

from test_contract_readme import bundle_table

from launcher.rundir import layout


def test_the_readme_table_names_the_folders_the_job_writes():
    written_by_the_job = {layout.HEARTBEAT_DIR, layout.TELEMETRY_DIR, layout.STACK_DUMP_DIR, layout.CHECKPOINT_DIR,
                          layout.LOG_DIR, layout.RESUMES_DIR}
    missing = {f"{name}/" for name in written_by_the_job} - {name.partition("N/")[0] for name in bundle_table()}
    assert not missing, f"docs/run-bundle.md's table does not name {sorted(missing)}"
