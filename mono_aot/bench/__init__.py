"""``mono-aot bench``: what serving the drafter kernels costs, measured side by side in one run
on this machine (README, "mono-aot bench"). Importing this package imports nothing else."""
