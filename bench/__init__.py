"""pegmask.bench."""
