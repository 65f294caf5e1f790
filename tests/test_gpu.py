"""GPU tests: filled in with the GPU kernels. Skipped where no GPU is present."""
