"""Tools above the runtime: the kernel plan of a model run."""
