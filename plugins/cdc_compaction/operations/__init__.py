"""What operators do to a table besides its runs: erase, time travel and rollback, discover, doctor, status, pause/resume/delete.

Operations use the pipeline's steps and the core; the pipeline never imports an operation.
"""
