"""pegmask.kernels."""
