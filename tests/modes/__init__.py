"""Tests of the table modes beyond ``cdc`` (contracts and scenarios: ``tests/scenarios/README.md``)."""
