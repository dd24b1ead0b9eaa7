"""What operators do to a table besides its runs: erase, time travel, rollback, discover, doctor, status, pause, delete.

Operations use the pipeline's steps and the core; the pipeline never imports an operation.
"""
