"""Commands for batch consumers (wait, hours, verify, cat, audit).  Placeholder: see issue 6."""
