"""Reference models of the table modes, written from their contracts alone (``tests/scenarios/README.md``)."""
