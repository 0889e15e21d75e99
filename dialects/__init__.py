"""pegmask.dialects."""
