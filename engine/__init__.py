"""pegmask.engine."""
