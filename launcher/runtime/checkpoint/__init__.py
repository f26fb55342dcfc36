"""Atomic, verified, sharded checkpoints (framework-agnostic; stdlib only, ``crc32c`` if installed).

Layout of ``<checkpoint_dir>``::

    step-00000100/            a complete checkpoint: shards + manifest.json (+ per-rank markers)
    step-00000200/
    latest                    text: the name of the newest committed dir ("step-00000200")
    .staging-step-00000300/   being written; never selected for resume

Writing (every rank, same step, collectively)::

    with stage_checkpoint(step, framework="torch") as st:
        with st.open(f"rank-{st.rank:05d}.pt") as f:   # checksummed while written, fsynced
            torch.save(my_shard, f)
        st.add(other_path)           # or claim a file written some other way (hashed at the marker)
    st.committed                     # Checkpoint(step, path, manifest)

1. rank 0 removes the staging and trash dirs of earlier attempts (at most one save is
   in flight: they are dead) and makes an empty ``.staging-step-N``; barrier.
2. each rank writes its files into the staging dir, fsyncs them and writes
   ``.done-rank-RRRRR.json``: its files with size and checksum, the checksum taken
   while the bytes were written (``st.open``, the DCP writer) or, for files a framework
   wrote itself, read back once by the rank that wrote them. A rank that fails
   writes ``.failed-rank-RRRRR.json`` instead. Markers are messages to rank 0: renamed
   into place whole, not fsynced (nothing reads them after the commit).
3. all_reduce of the ranks' failure flags (a rank that raised makes every rank raise
   :class:`CheckpointError`, nothing is committed, rank 0 removes the staging dir).
4. rank 0 waits for all ``world_size`` markers, checks that every claimed file exists
   with the size its rank wrote (stat, no re-reading), checksums any unclaimed file
   (written by a framework behind our back, e.g. DeepSpeed's zero_to_fp32.py), writes
   ``manifest.json`` and the new ``latest`` beside the old, fsyncs at once (threads: one
   journal commit) the files written at commit, the unclaimed ones, every directory
   holding a shard and the new ``latest``, renames the staging dir to ``step-N`` (the
   commit) and the new ``latest`` over the old (resume never trusts it: a failure there
   is only a warning), fsyncs the checkpoint dir, and prunes: checkpoints newer than N
   (an abandoned timeline after a fallback; fsynced away before the save returns),
   damaged ones, complete ones beyond ``keep``, stale staging dirs.
5. rank 0 broadcasts the outcome; every rank returns only once the commit is
   visible (or raises :class:`CheckpointError` on all ranks).

A background save (:mod:`launcher.runtime.checkpoint.background`) runs steps 2 and 4 in a thread
and agrees through the marker files alone (no collective off the main thread); steps 3
and 5 happen at the next :func:`launcher.runtime.wait_checkpoints`.

A rank killed at any point before step 4's rename leaves only a staging dir: the
previous ``step-*`` stays the newest complete one. :func:`latest_complete` never
trusts ``latest`` alone: it returns the newest ``step-*`` whose manifest verifies
(all shards present, sizes and checksums match), warning on stderr when ``latest``
disagrees; :func:`resume_checkpoint` spreads that re-check over the ranks. With
``verify="load"`` (``launcher.runtime.resume_torch_state``) the checksums of the DCP data
files are taken by the load, which reads them anyway, instead of in a pass of their own:
a file that does not match refuses the checkpoint whole, before anything of it reaches
the model, and the next older complete one is loaded.
``checkpoint_dir`` must be visible to all ranks (a shared filesystem).

Checksums: CRC32C (the ``crc32c`` package, hardware-accelerated, ~10 GB/s per core)
when it is installed, else SHA-256 (~1.5 GB/s); the manifest names the algorithm per
shard, so either verifies wherever it is available.

Where each part lives (this package re-exports nothing; ``launcher.runtime`` has the API)::

    layout      the names above, Checkpoint, CheckpointError, listing step dirs
    checksums   CRC32C / SHA-256, ChecksumWriter (checksummed as written)
    staging     a rank's share (step 2): Staging, the done and failed markers
    commit      rank 0's commit and pruning (step 4), the ranks' agreement (steps 3, 5)
    background  a save in flight in a thread, wait_checkpoints
    save        open_staging, stage_checkpoint: one collective save (steps 1-5)
    verify      a checkpoint dir against its manifest
    resume      latest_complete, resume_checkpoint
    dcp         torch.distributed.checkpoint's writer and planner, the verifying reader (imports torch)
"""
