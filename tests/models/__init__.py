"""Reference models of the table modes, written from the contracts alone (never from the project's code)."""
