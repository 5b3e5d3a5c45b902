"""Commands for operators' graphs.  Placeholder: see issue 5."""
