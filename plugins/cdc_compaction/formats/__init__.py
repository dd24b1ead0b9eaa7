"""Open table formats over the lake's versions (Iceberg, Delta): derived metadata, never a second copy of the rows."""
