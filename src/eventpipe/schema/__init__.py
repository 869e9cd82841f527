"""Types, column names, SQL dialects and table diffs: what every destination agrees on."""
