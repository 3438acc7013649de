"""Shared helpers of the Leash benchmark suite (bench/): the Fashion-MNIST loader used by
every Python peer, the peers' model definitions, ports from the suite's range, process
handling, and result bookkeeping (time to a target accuracy, medians, ratios).
Plain functions; nothing here is shared between threads."""
